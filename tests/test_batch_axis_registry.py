"""The batch-axis table (graphsync/batch_axis/registry.py): one rule per op type, in one family;
a second claim is refused when the claiming module is imported, and the trace's ends are values
(graphsync/batch_axis/findings.py `Ended`) that say which op type had no rule, not text to parse."""
import dataclasses
import importlib.util

import pytest
import tensorflow as tf

from graphsync import batch_axis
from graphsync.batch_axis import registry
from graphsync.batch_axis.unfollowed import Unfollowed

tf1 = tf.compat.v1


def _noop_rule(op, ins, context):
    return [None] * len(op.outputs), None


def test_a_type_claimed_by_two_families_is_refused():
    table = registry.Registry()
    table.register("first", "OpA", "OpB")(_noop_rule)
    with pytest.raises(registry.RuleConflict, match=r"OpB has a rule in family 'first', and family 'second'"):
        table.register("second", "OpC", "OpB")(_noop_rule)
    with pytest.raises(registry.RuleConflict, match="OpD has a rule in family 'first'"):
        table.register("first", "OpD", "OpD")(_noop_rule)
    assert table.op_types() == {"OpA", "OpB"}   # a refused claim claims nothing
    assert table.family_of("OpB") == "first" and table.rule_for("OpC") is None


def test_a_module_claiming_a_type_the_table_holds_fails_at_import(tmp_path):
    source = tmp_path / "my_family.py"
    source.write_text("from graphsync.batch_axis.registry import register\n\n\n"
                      "@register('my family', 'MyOp', 'MatMul')\n"
                      "def _rule(op, ins, context):\n"
                      "    return [ins[0]], None\n")
    spec = importlib.util.spec_from_file_location("my_family", source)
    with pytest.raises(registry.RuleConflict, match="MatMul has a rule in family 'contractions'"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert registry.rule_for("MyOp") is None and registry.family_of("MatMul") == "contractions"


def test_every_family_module_holds_its_own_types():
    families = {module.__name__.rsplit(".", 1)[1] for module in batch_axis.FAMILIES}
    assert families == {"elementwise", "no_batch", "per_example", "fused_batch_norm", "reductions", "order",
                        "contractions", "data_movement", "slicing", "gather", "reshape", "bodies",
                        "control_flow_v1", "tensor_lists"}
    assert {registry.family_of(t) for t in batch_axis.ELEMENTWISE} == {"elementwise"}
    assert {registry.family_of(t) for t in batch_axis.REDUCTION_TYPES} == {"reductions"}
    assert {registry.family_of(t) for t in batch_axis.ORDER_TYPES} == {"order"}
    # verdicts.py words a body's verdict by the family of the op holding it
    assert [registry.family_of(t) for t in ("PartitionedCall", "If", "While")] == ["calls", "branches", "loops"]
    assert registry.rule_for("NoSuchOp") is None


def _ends(build):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        build(x)
    return batch_axis.analyze(graph).ended


def test_an_op_type_without_a_rule_ends_the_trace_with_its_type():
    (end,) = _ends(lambda x: tf.raw_ops.Bitcast(input=x, type=tf.int32, name="cast_bits"))
    assert (end.op.name, end.why, end.no_rule_for, end.rule_missing) == \
        ("cast_bits", "no rule for op type Bitcast", "Bitcast", True)
    op, why = end   # unpacks as the (op, why) pair it was
    assert (op, why) == (end.op, end.why)

    (end,) = _ends(lambda x: tf.reshape(x, tf1.placeholder(tf.int32, [2])))   # a rule that cannot read its op
    assert end.op.type == "Reshape" and end.no_rule_for is None and not end.rule_missing, end


def test_a_type_without_a_rule_inside_a_function_body_is_named_by_the_call():
    @tf.function
    def body(h):
        return tf.raw_ops.Bitcast(input=h, type=tf.int32)

    (end,) = _ends(body)
    assert end.op.type in ("PartitionedCall", "StatefulPartitionedCall"), end
    assert end.why.startswith("in its function ") and end.why.endswith(": no rule for op type Bitcast"), end.why
    assert end.no_rule_for == "Bitcast"


def test_unfollowed_keeps_its_fields_and_carries_the_type_beside_them():
    found = Unfollowed("t/Mean", "Mean", "t/Bitcast", "no rule for op type Bitcast", "Bitcast")
    assert found.unknown_type == "Bitcast"
    assert dataclasses.asdict(found) == {"op": "t/Mean", "type": "Mean", "end": "t/Bitcast",
                                         "why": "no rule for op type Bitcast"}   # graphsync inspect --json
    assert Unfollowed("t/Mean", "Mean", "t/Reshape", "a reshape of unknown rank").unknown_type is None
