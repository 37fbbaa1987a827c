"""`tf.nn.moments` batch norm, in any name scope:

    mean = Mean(x, axes, keep_dims)        → consumers (Squeeze, batch_normalization, averages…)
    SquaredDifference(x, StopGradient(mean))
    variance = Mean(that, axes, keep_dims) → consumers

It is batch norm when the axes include the batch axis 0 (and it is not ghost batch norm,
graphsync/match/ghost.py). Its gradients are found through the
scopes `tf.gradients` itself names after each forward op (graphsync/match/gradients.py).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import by_type
from graphsync.match.candidate import Candidate, MomentsParts
from graphsync.match.layer_form import LayerForm
from graphsync.match.reductions import batch_axis_reason, const_axes

STARTS = ("SquaredDifference",)   # the op types candidates() starts from (see match.starting_types)


def _const_axes(op: tf.Operation, rank: int):
    return const_axes(op.inputs[1], rank)


def candidates(graph: tf.Graph) -> list[Candidate]:
    """Every `tf.nn.moments`-shaped subgraph; those whose axes exclude the batch axis are listed
    with the reason (layer, instance and group norm are not batch norm)."""
    found = []
    for sqdiff in by_type.ops_of_types(graph, STARTS):
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
        reason = batch_axis_reason(x, axes)
        if reason is None and not (_readers(mean_op.outputs[0], stopped.op) or variance_op.outputs[0].consumers()):
            reason = "nothing reads its outputs (already synchronized, or unused)"
        found.append(Candidate(mean_op, LayerForm.MOMENTS, reason, MomentsParts(
            x, variance_op, tuple(axes), mean_op.get_attr("keep_dims"), sqdiff=sqdiff, stop_gradient=stopped.op)))
    return found


def _readers(tensor: tf.Tensor, *exclude) -> list:
    return [c for c in tensor.consumers() if c not in exclude]
