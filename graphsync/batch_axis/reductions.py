"""Ops that reduce over axes: Sum, Mean, Max, … (any keep_dims), L2Loss (over every axis), Softmax
and LogSoftmax (over the last). Reducing an axis that carries the batch combines examples (CrossOp
"reduce"); reducing some of the batch axes only is partial (ghost batch norm's virtual batches)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync.batch_axis.axes import const_axes, only, rank_of
from graphsync.batch_axis.findings import CrossOp, Crossing
from graphsync.batch_axis.registry import register

REDUCTION_TYPES = frozenset("Sum Mean Max Min Prod All Any EuclideanNorm".split())


@register("reductions", *REDUCTION_TYPES)
def _reduction(op, ins, context):
    axes = only(ins, 0, op)
    if not axes:
        return [None], None
    rank = rank_of(op.inputs[0])
    reduced_axes = const_axes(op.inputs[1], rank)
    if rank is not None and not reduced_axes and np.size(tf.get_static_value(op.inputs[1])) == 0:
        return [axes], None   # an empty reduction: the identity
    return reduced(op, axes, reduced_axes, bool(op.get_attr("keep_dims")), Crossing.REDUCE)


def reduced(op, axes, reduced_axes, keep, how: Crossing):
    """Output axes and the CrossOp of reducing `reduced_axes` from a tensor whose batch is on `axes`."""
    hit = axes & reduced_axes
    left = axes - reduced_axes
    out = left if keep else frozenset(a - sum(r < a for r in reduced_axes) for a in left)
    crossed = CrossOp(op, how, partial=bool(left)) if hit else None
    return [out or None] + [None] * (len(op.outputs) - 1), crossed


@register("reductions", "Softmax", "LogSoftmax")
def _softmax(op, ins, context):
    axes = only(ins, 0, op)
    if axes and rank_of(op.inputs[0]) is not None and rank_of(op.inputs[0]) - 1 in axes:
        return [None], CrossOp(op, Crossing.REDUCE)
    return [axes] * len(op.outputs), None


@register("reductions", "L2Loss")
def _l2_loss(op, ins, context):
    axes = only(ins, 0, op)
    return [None], CrossOp(op, Crossing.REDUCE) if axes else None
