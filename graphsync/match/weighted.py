"""Weighted batch statistics, the subgraph tf.nn.weighted_moments builds:

    W = Sum(w + zeros_like(x), axes, keep_dims)          sum_of_weights
    mean = DivNoNan(Sum(w·x, axes, keep_dims), W)
    variance = DivNoNan(Sum(w·(x − m̃)², axes, keep_dims), W),  m̃ = mean or StopGradient(mean)

(then Squeeze when keepdims=False; on TensorFlow 2.12 each division is Mul(…, Reciprocal(W))).
Towers merge weighted by their summed weights W_t, not their counts
(graphsync.stats.weighted_local_moments): one exchange per layer, float64, as the other forms. That needs one W per tower, so weights must be the same for every statistic — per example
or per pixel (masks of ignored pixels), broadcast over the channels. Weights that vary per channel
are no candidate: the rule (graphsync/plan/rule.py) synchronizes their sums Σw·x, Σw, Σw·(x − μ)²
as reductions, as it does when TensorFlow folded `zeros_like(x)` into a constant.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import by_type, tf_private
from graphsync.match.candidate import Candidate
from graphsync.match.handwritten import candidate
from graphsync.match.reductions import MeanOf, const_axes

STARTS = ("DivNoNan", "RealDiv", "Mul")   # the op types candidates() starts from (see match.starting_types)


def candidates(graph: tf.Graph) -> list[Candidate]:
    found = []
    for op in by_type.ops_of_types(graph, STARTS):
        parsed = _weighted_mean(op)
        if parsed is None:
            continue
        mean, weights, summed = parsed
        variance = _variance(mean, weights, summed)
        if variance is None:
            continue
        variance_op, reads_mean = variance
        if _same_for_every_statistic(weights, mean):   # else the rule's reductions
            found.append(candidate(mean, variance_op, reads_mean, "weighted moments", weights=weights))
    return found


def _divided(op: tf.Operation):
    """(numerator, denominator) of a division: DivNoNan(a, b), RealDiv(a, b) or Mul(a, Reciprocal(b));
    None for any other op."""
    if op.type == "Mul":
        if tf_private.input_types(op)[1] != "Reciprocal":
            return None
        total, inverse = op.inputs
        return total, inverse.op.inputs[0]
    return tuple(op.inputs) if op.type in ("DivNoNan", "RealDiv") else None


def _weighted_mean(op: tf.Operation):
    """(MeanOf the weighted mean of x, w, W) when `op` is DivNoNan(Sum(w·x), Sum(w + zeros_like(x)))."""
    divided = _divided(op)
    if divided is None:
        return None
    total, summed = divided
    if total.op.type != "Sum" or summed.op.type != "Sum" or total.op.inputs[0].op.type != "Mul":
        return None
    rank = total.op.inputs[0].shape.rank
    if rank is None:
        return None
    axes = const_axes(total.op.inputs[1], rank)
    if not axes or axes != const_axes(summed.op.inputs[1], rank):
        return None
    keep = bool(total.op.get_attr("keep_dims"))
    if keep != bool(summed.op.get_attr("keep_dims")):
        return None
    broadcast = summed.op.inputs[0].op
    if broadcast.type not in ("Add", "AddV2"):
        return None
    for weights, x in (total.op.inputs[0].op.inputs, total.op.inputs[0].op.inputs[::-1]):
        if x.shape.rank == rank and _are(broadcast.inputs, weights, "ZerosLike", x):
            return MeanOf(op.outputs[0], x, axes, keep), weights, summed
    return None


def _are(inputs, weights, zeros_type, x) -> bool:
    a, b = inputs
    return a is weights and b.op.type == zeros_type and b.op.inputs[0] is x


def _variance(mean: MeanOf, weights: tf.Tensor, summed: tf.Tensor):
    """(DivNoNan(Sum(w·SquaredDifference(x, m̃)), W) beside the mean, whether m̃ is the mean
    itself rather than StopGradient(mean)), or None."""
    for sqdiff in mean.source.consumers():
        if sqdiff.type != "SquaredDifference" or sqdiff.inputs[0] is not mean.source:
            continue
        centre = sqdiff.inputs[1]
        if not (centre is mean.tensor or (centre.op.type == "StopGradient" and centre.op.inputs[0] is mean.tensor)):
            continue
        for product in sqdiff.outputs[0].consumers():
            if product.type != "Mul" or not any(t is weights for t in product.inputs):
                continue
            for total in product.outputs[0].consumers():
                if total.type != "Sum":
                    continue
                for division in total.outputs[0].consumers():
                    divided = _divided(division)
                    if divided is not None and divided[0] is total.outputs[0] and divided[1] is summed:
                        return division, centre is mean.tensor
    return None


def _same_for_every_statistic(weights: tf.Tensor, mean: MeanOf) -> bool:
    """Whether w broadcasts along every axis the statistics keep (size 1 there, or absent)."""
    rank, shape = mean.source.shape.rank, weights.shape
    if shape.rank is None or shape.rank > rank:
        return False
    padded = [1] * (rank - shape.rank) + shape.as_list()
    return all(padded[a] == 1 for a in range(rank) if a not in mean.axes)
