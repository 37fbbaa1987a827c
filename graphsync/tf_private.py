"""Every private TensorFlow API graphsync touches, in one place.

A TensorFlow upgrade that renames one of these breaks this module only; `tests/test_tf_private.py`
pins each of them.
"""
from __future__ import annotations

import contextlib

import tensorflow as tf


def update_input(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
    """Rewires input `index` of `op` to `tensor` (TensorFlow checks shapes, not dtypes)."""
    op._update_input(index, tensor)  # pylint: disable=protected-access


def control_outputs(op: tf.Operation) -> list:
    """The ops that carry a control edge from `op`."""
    return list(op._control_outputs)  # pylint: disable=protected-access


def replace_control_input(op: tf.Operation, old: tf.Operation, new: list) -> None:
    """Replaces the control edge old → op by edges from each op in `new`."""
    kept = [c for c in op.control_inputs if c is not old]
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    extra = [n for n in new if n not in kept]
    op._add_control_inputs(kept + extra)  # pylint: disable=protected-access


def control_flow_context(op: tf.Operation):
    """The v1 control-flow context (`tf.cond`/`tf.while_loop` in v1 mode) `op` lives in, or None."""
    return op._get_control_flow_context()  # pylint: disable=protected-access


def function_library(graph: tf.Graph) -> dict:
    """Name → FunctionDef of every function the graph holds (bodies of If/While/PartitionedCall)."""
    return {name: fn.cached_definition if hasattr(fn, "cached_definition") else fn.definition
            for name, fn in graph._functions.items()}  # pylint: disable=protected-access


@contextlib.contextmanager
def pristine_scope(graph: tf.Graph, device: str | None, name_scope: str):
    """Creates ops outside any device, colocation, control-dependency or control-flow context the
    caller may be in, on `device`, under the absolute `name_scope`."""
    saved_flow = graph._get_control_flow_context()  # pylint: disable=protected-access
    graph._set_control_flow_context(None)  # pylint: disable=protected-access
    try:
        with graph.as_default(), graph.device(None), graph.colocate_with(None, ignore_existing=True), \
                graph.control_dependencies(None), graph.device(device or ""), \
                graph.name_scope(name_scope.rstrip("/") + "/"):
            yield
    finally:
        graph._set_control_flow_context(saved_flow)  # pylint: disable=protected-access


def create_op(graph: tf.Graph, op_type: str, inputs: list, attrs: dict, name: str) -> tf.Operation:
    """Creates an op without the Python argument inference of `tf.raw_ops` (about half the cost of
    each op a rewrite adds); attrs maps names to AttrValue protos and must be complete."""
    return graph._create_op_internal(op_type, inputs, name=name, attrs=attrs)  # pylint: disable=protected-access
