"""The numeric test families on graphs built the TF1 way: under tf.compat.v1.disable_v2_behavior()
(ref variables, Switch/Merge control flow, TensorShapes of Dimension objects) and under
disable_control_flow_v2() alone, with both strategies, in-graph and between-graph. The families'
own test functions run unchanged inside tests/behaviours.py's switch, so each case is compared
with one device on the concatenated batch, and fails without the rewrite, exactly as under v2.

Control flow v1 changes nothing in graphs without control flow; its cases add a model with a
tf.cond and a tf.while_loop around the batch norms (Switch/Merge/Enter/Exit in the forward and
in the gradients). Tolerances are the families' own.
"""
import functools
import warnings

import pytest
import tensorflow as tf

import behaviours
import graphsync
import models
import test_before_gradients
import test_between_graph
import test_distributed
import test_fused
import test_handwritten
import test_moments
import test_tower_structure
import tiers
import towerlib as tl

pytestmark = pytest.mark.full   # every family again under TF1 behaviour

tf1 = tf.compat.v1


@pytest.fixture
def v1():
    with behaviours.behaviour("v1"):
        yield


def _ids(cases):
    return ["-".join(str(getattr(p, "name", "x".join(map(str, p)) if isinstance(p, (list, tuple)) else p))
                     for p in case) for case in cases]


@pytest.mark.parametrize("model_key,batch_sizes,gradients,dtype",
                         tiers.cases(test_fused.CASES, _ids(test_fused.CASES), fast=_ids(test_fused.CASES),
                                     kernel_ids=test_fused.KERNELS))
def test_fused_family(v1, model_key, batch_sizes, gradients, dtype):
    test_fused.test_step_equals_single_device_reference(model_key, batch_sizes, gradients, dtype)


@pytest.mark.parametrize("model_key,batch_sizes,gradients,dtype", test_moments.CASES, ids=_ids(test_moments.CASES))
def test_moments_family(v1, model_key, batch_sizes, gradients, dtype):
    test_moments.test_step_equals_single_device_reference(model_key, batch_sizes, gradients, dtype)


@pytest.mark.parametrize("strategy,model_key,sizes", test_before_gradients.CASES,
                         ids=_ids(test_before_gradients.CASES))
def test_before_gradients_family(v1, strategy, model_key, sizes):
    test_before_gradients.test_per_tower_gradients_equal_the_single_device_step(strategy, model_key, sizes)


ALLREDUCE = test_distributed.ALLREDUCE_CASES


@pytest.mark.parametrize("name,model,dtype,gradients", ALLREDUCE, ids=[f"{n}-{g}" for n, _, _, g in ALLREDUCE])
def test_allreduce_family(v1, name, model, dtype, gradients):
    test_distributed.test_allreduce_matches_the_reference(name, model, dtype, gradients)


@pytest.mark.parametrize("strategy", ["gather", "allreduce"])
def test_sync_groups(v1, strategy):
    test_distributed.test_sync_groups_each_equal_their_own_reference(strategy)


HANDWRITTEN = [case for case in test_handwritten.CASES if case[4] == "allreduce"]


@pytest.mark.parametrize("form,net,batch_sizes,gradients,strategy,dtype", HANDWRITTEN, ids=_ids(HANDWRITTEN))
def test_handwritten_family(v1, form, net, batch_sizes, gradients, strategy, dtype):
    test_handwritten.test_step_equals_single_device_reference(form, net, batch_sizes, gradients, strategy, dtype)


@pytest.mark.parametrize("scope,sizes", [("gpu_%d", [3, 5]), (["", "gpu_1", "gpu_2"], [2, 5, 3])],
                         ids=["gpu", "unscoped-first"])
def test_towers_by_structure_family(v1, scope, sizes):
    test_tower_structure.test_scope_format_found_by_structure(scope, sizes)


def test_in_graph_replication_across_server_processes(v1):
    """One session driving towers on several server processes (tf_cnn_benchmarks'
    distributed_all_reduce: a controller, workers that only join their servers)."""
    test_distributed.test_in_graph_replication_across_server_processes()


def test_ref_variables_and_dimensions_are_what_the_graphs_hold(v1):
    """The switch really builds the TF1 way (else every case above would be a v2 case again)."""
    built = tl.build(models.resnetish(depth=1), [2, 2])
    assert all(v.op.type == "VariableV2" for v in built.variables)
    assert type(built.inputs[0].shape[0]).__name__ == "Dimension"


def _ancestors(tensors) -> set:
    seen, stack = set(), [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack += [t.op for t in op.inputs] + list(op.control_inputs)
    return seen


def _reads_a_variable_in_place(tensor) -> bool:
    """A ref variable is read through Identity/Switch ops that alias its buffer, which the
    optimizer then updates in place."""
    while not tensor.dtype._is_ref_dtype and tensor.op.type in ("Identity", "Switch", "Enter"):
        tensor = tensor.op.inputs[0]
    return tensor.dtype._is_ref_dtype


@pytest.mark.parametrize("strategy", ["gather", "allreduce"])
@pytest.mark.parametrize("gradients", ["after", "before"])
def test_what_the_rewrite_adds_reads_variables_only_before_the_forward_pass_ends(v1, strategy, gradients):
    """Complement to the numeric families, for the race no single run shows: with ref variables
    an update runs as soon as its gradient exists. TensorFlow's own fused gradient reads γ in
    the op that yields ∂L/∂γ; graphsync's backward needs γ again after the cross-tower sums, so
    it must read the forward's copy: every new op that reads a variable's buffer runs before
    the towers' outputs exist (between processes, ∂L/∂x once used the updated γ, 2 runs in 5)."""
    before = []
    built = tl.build(models.resnetish(depth=2), [3, 5], gradients=gradients,
                     rewrite=lambda g: (before.extend(g.get_operations()),
                                        graphsync.rewrite_towers(g, strategy=strategy)))
    added = {op for op in set(built.graph.get_operations()) - set(before)
             if "_sync" in op.name or op.name.startswith("graphsync/")}   # not the optimizer's, nor TF's gradients
    readers = {op for op in added if any(_reads_a_variable_in_place(t) for t in op.inputs)}
    assert readers and any(op.type == "Snapshot" for op in readers)
    assert readers <= _ancestors(built.outputs), sorted(op.name for op in readers - _ancestors(built.outputs))


def _one_tower_job(gate_gradients):
    """One worker's graph of tests/scripts/ps_train.py's collective mode, differentiated with
    tf.gradients and applied at once, gated or not."""
    import ps_train   # tests/scripts (test_between_graph put it on the path)
    graph = tf.Graph()
    with graph.as_default():
        x, t = tf1.placeholder(tf.float32, [None, 6, 6, 3]), tf1.placeholder(tf.float32, [None, 5])
        y = ps_train.model(x)[0]
        params = tf1.trainable_variables()
        grads = tf.gradients(tf.reduce_sum(tf.square(y - t)), params, gate_gradients=gate_gradients)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            tf1.train.GradientDescentOptimizer(0.1).apply_gradients(zip(grads, params))
        tf1.global_variables_initializer()
    return graph


def test_ungated_gradients_on_ref_variables_read_a_snapshot(v1):
    """The race ps_train.py had (an ungated head's ∂L/∂x against its kernel's update): the rewrite
    orders it (graphsync/splice/ref_reads.py: the read takes a snapshot the update waits for;
    tests/test_ref_reads.py runs such steps against one device) and says nothing; gated gradients,
    and every towerlib graph, need nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphsync.GraphsyncWarning)
        graph = _one_tower_job(False)
        graphsync.rewrite_towers(graph, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 0))
        read = graph.get_operation_by_name("gradients/head/MatMul_grad/MatMul").inputs[1].op
        assert read.type == "Snapshot" and read in graph.get_operation_by_name(
            "GradientDescent/update_head/kernel/ApplyGradientDescent").control_inputs
        gated = _one_tower_job(True)
        assert graphsync.rewrite_towers(gated, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 0)).changed
        for model in (models.resnetish(depth=2), models.layers_bn()):
            tl.build(model, [3, 5], rewrite=graphsync.rewrite_towers)


def test_between_graph_script_under_v1_with_graphsync_run(tmp_path):
    """tests/scripts/between_graph_train.py --v1: the script itself calls disable_v2_behavior()."""
    sizes = [3, 5]
    results = test_between_graph.run_workers(tmp_path, 2, args=["--sizes", "3,5", "--v1"])
    for _, code, err, _, _ in results:
        assert code == 0 and "internal error" not in err, err
        assert "2 layers × 1 tower synchronized by all-reduce on the towers' devices across 2 worker" in err, err
    errors = test_between_graph.errors_against_one_device(results, sizes)
    assert max(errors.values()) < test_between_graph.TOLERANCE, errors


def control_flow_model(x):
    """conv → BN → tf.cond(relu) → while_loop(2 damped relu steps) → conv → BN → head: v1 control
    flow puts Switch/Merge and Enter/Exit/NextIteration around the batch norms and in their
    gradients."""
    h, updates = models.raw_fused_bn(models._conv(x, 4, "stem"), "bn0")
    h = tf.cond(tf.reduce_sum(x) > -1e30, lambda: tf.nn.relu(h), lambda: h)
    _, h = tf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, 0.5 * a + 0.5 * tf.nn.relu(a - 0.1)), [0, h])
    h, more = models.raw_fused_bn(models._conv(h, 4, "conv0"), "bn1")
    return models._head(tf.nn.relu(h)), updates + more


CONTROL_FLOW_CASES = [("control-flow-v1", strategy, gradients) for strategy in ("gather", "allreduce")
                      for gradients in ("after", "before")] + [("v1", "allreduce", "after"), ("v1", "allreduce", "before"),
                                                               ("v2", "allreduce", "before")]
SIZES = (3, 5, 4)


def _step(name, gradients, rewrite):
    """One step of the control-flow model under the behaviour `name` (reference: one device)."""
    x, t = tl.data(list(SIZES), (6, 6, 3), (5,))
    with behaviours.behaviour(name):
        if gradients is None:
            return tl.reference_step(control_flow_model, list(SIZES), x, t)
        with warnings.catch_warnings():
            warnings.simplefilter("error", graphsync.GraphsyncWarning)
            built = tl.build(control_flow_model, list(SIZES), gradients=gradients, rewrite=rewrite)
        kinds = {op.type for op in built.graph.get_operations()}
        assert ("Merge" in kinds and "Enter" in kinds) == (name != "v2"), name
        return tl.run_step(built, x, t, list(SIZES))


_cached_step = functools.lru_cache(maxsize=None)(lambda name, gradients: _step(name, gradients, None))


@pytest.mark.parametrize("name,strategy,gradients", CONTROL_FLOW_CASES, ids=_ids(CONTROL_FLOW_CASES))
def test_control_flow_around_batch_norm(name, strategy, gradients):
    ref, reports = _cached_step(name, None), []
    got = _step(name, gradients, lambda g: reports.append(graphsync.rewrite_towers(g, strategy=strategy)))
    unsynced = _cached_step(name, gradients)
    kinds = [layer.kind for layer in reports[0].layers]   # the cond's predicate, a Sum over the batch: a reduction
    assert kinds.count("fused") == 2 and set(kinds) <= {"fused", "reduction"}, kinds
    errors = {k: tl.max_rel_error(got[k], ref[k]) for k in ref}
    assert max(errors.values()) < 2e-5, errors
    unsynced = {k: tl.max_rel_error(unsynced[k], ref[k]) for k in ("output", "grads", "moving")}
    assert min(unsynced.values()) > 1e-3, unsynced
