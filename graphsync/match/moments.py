"""`tf.nn.moments` batch norm, in any name scope:

    mean = Mean(x, axes, keep_dims)        → consumers (Squeeze, batch_normalization, averages…)
    SquaredDifference(x, StopGradient(mean))
    variance = Mean(that, axes, keep_dims) → consumers

It is batch norm when the axes include the batch axis 0. Its gradients are found through the
scopes `tf.gradients` itself names after each forward op (graphsync/match/gradients.py).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.match.candidate import Candidate

STARTS = ("SquaredDifference",)   # the op types candidates() starts from (see match.starting_types)


def _const_axes(op: tf.Operation, rank: int):
    axes = tf.get_static_value(op.inputs[1])
    if axes is None:
        return None
    return tuple(sorted({int(a) % rank for a in (axes.ravel() if hasattr(axes, "ravel") else [axes])}))


def candidates(graph: tf.Graph) -> list[Candidate]:
    """Every `tf.nn.moments`-shaped subgraph; those whose axes exclude the batch axis are listed
    with the reason (layer, instance and group norm are not batch norm)."""
    found = []
    for sqdiff in graph.get_operations():
        if sqdiff.type != "SquaredDifference":
            continue
        x, stopped = sqdiff.inputs
        if stopped.op.type != "StopGradient":
            x, stopped = stopped, x
        mean_op = stopped.op.inputs[0].op if stopped.op.type == "StopGradient" else None
        if mean_op is None or mean_op.type != "Mean" or mean_op.inputs[0] is not x:
            continue
        variance_ops = [c for c in sqdiff.outputs[0].consumers() if c.type == "Mean"]
        rank = x.shape.rank
        if len(variance_ops) != 1 or rank is None:
            continue
        variance_op = variance_ops[0]
        axes = _const_axes(mean_op, rank)
        if axes is None or axes != _const_axes(variance_op, rank) or \
                mean_op.get_attr("keep_dims") != variance_op.get_attr("keep_dims"):
            continue
        reason = None
        if 0 not in axes:
            reason = f"moments over axes {list(axes)} exclude the batch axis 0: layer/instance/group norm"
        elif not (_readers(mean_op.outputs[0], stopped.op) or variance_op.outputs[0].consumers()):
            reason = "nothing reads its outputs (already synchronized, or unused)"
        found.append(Candidate(mean_op, "moments", reason, {
            "variance": variance_op, "sqdiff": sqdiff, "stop_gradient": stopped.op, "axes": axes}))
    return found


def _readers(tensor: tf.Tensor, *exclude) -> list:
    return [c for c in tensor.consumers() if c not in exclude]
