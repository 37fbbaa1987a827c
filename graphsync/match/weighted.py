"""Weighted batch statistics, the subgraph tf.nn.weighted_moments builds:

    W = Sum(w + zeros_like(x), axes)          sum_of_weights
    mean = DivNoNan(Sum(w·x, axes), W)
    variance = DivNoNan(Sum(w·(x − mean)², axes), W)

Merging towers would weigh each by its summed weights W_t, per statistic, where the exchange
weighs by one count per tower: graphsync does not synchronize them yet, and says so for every
such subgraph whose axes cover the batch (masks for ignored pixels are the common case).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.match.candidate import Candidate
from graphsync.match.reductions import batch_axis_reason, const_axes

REASON = ("weighted moments (tf.nn.weighted_moments): merging them needs each tower's summed weights, "
          "which graphsync does not exchange yet: left per tower")


def candidates(graph: tf.Graph) -> list[Candidate]:
    found = []
    for op in graph.get_operations():
        if op.type not in ("DivNoNan", "RealDiv"):
            continue
        weighted = _weighted_sum(op.inputs[0])
        if weighted is None or op.inputs[1].op.type != "Sum":
            continue
        x, axes = weighted
        if _reads(op.inputs[1].op.inputs[0], x) and _variance(op.outputs[0], x) is not None:
            found.append(Candidate(op, "weighted", batch_axis_reason(x, axes) or REASON, {"axes": axes}))
    return found


def _weighted_sum(total: tf.Tensor):
    """(x, axes) when `total` is Sum(w·x, axes) with x an activation (not a squared difference)."""
    op = total.op
    if op.type != "Sum" or op.inputs[0].op.type != "Mul" or op.inputs[0].shape.rank is None:
        return None
    axes = const_axes(op.inputs[1], op.inputs[0].shape.rank)
    w, x = op.inputs[0].op.inputs
    if x.op.type == "SquaredDifference":
        return None
    return (x, axes) if axes else None


def _reads(weights_sum: tf.Tensor, x: tf.Tensor) -> bool:
    """Whether the summed weights broadcast over x (w + zeros_like(x)), as weighted_moments does."""
    op = weights_sum.op
    return op.type in ("Add", "AddV2") and any(t.op.type == "ZerosLike" and t.op.inputs[0] is x for t in op.inputs)


def _variance(mean: tf.Tensor, x: tf.Tensor):
    for sqdiff in x.consumers():
        if sqdiff.type != "SquaredDifference":
            continue
        centre = sqdiff.inputs[1]
        if centre is mean or (centre.op.type == "StopGradient" and centre.op.inputs[0] is mean):
            return sqdiff
    return None
