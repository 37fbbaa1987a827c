"""Batch statistics written by hand: a mean m of x over axes (any spelling of
graphsync/match/reductions.py) and a variance of x over the same axes, as

    E[(x − m̃)²]  with (x − m̃)² = Square(Sub(x, m̃)) | SquaredDifference(x, m̃) | Mul(d, d), d = Sub(x, m̃)
    E[x²] − m²   with x² = Square(x) | Mul(x, x) and m² = Square(m) | Mul(m, m)
                 (also tf.nn.sufficient_statistics + tf.nn.normalize_moments without a shift)

where m̃ is m or StopGradient(m); E[·] is a mean over the axes, keep_dims as m's. The spelling
tf.nn.moments builds (Mean and SquaredDifference(x, StopGradient(Mean))) is graphsync/match/moments.py's.
It is batch norm when the axes cover the batch axis 0 and the statistics normalize x
(`reductions.normalizes`); other statistics over the batch are listed with the reason.

The Candidate is a MOMENTS one (the splice reads parts x, variance, axes, keep_dims; the plan
finds the gradient ops of the ops in MomentsParts.statistics);
`variance_reads_mean` says the variance's gradient flows into m, so after the gradients are built
the variance's cross-tower sum must be known before the mean's (graphsync/splice/layer.py).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import by_type, tf_private
from graphsync.graph.backward import is_backward
from graphsync.match.candidate import Candidate, MomentsParts
from graphsync.match.layer_form import LayerForm
from graphsync.match.reductions import MEAN_TYPES, MeanOf, batch_axis_reason, mean_of, normalizes, statistics_ops


# the op types candidates() starts from (see match.starting_types)
STARTS = ("Mean", "Sum", "RealDiv", "Div", "DivNoNan", "Mul", "Sub")


def candidates(graph: tf.Graph) -> list[Candidate]:
    found, seen = [], set()
    for op in by_type.ops_of_types(graph, STARTS):
        if not op.outputs or is_backward(op):   # a gradient's sums are no statistics of the forward
            continue
        parsed = parse_variance(op.outputs[0])
        if parsed is None or parsed[0].tensor.op in seen:
            continue
        mean, reads_mean = parsed
        seen.add(mean.tensor.op)
        found.append(candidate(mean, op, reads_mean, "hand-written batch statistics"))
    return found


def candidate(mean: MeanOf, variance_op: tf.Operation, reads_mean: bool, what: str, **parts) -> Candidate:
    """A moments Candidate for statistics of mean.source, with the reason to leave it if any."""
    x, variance = mean.source, variance_op.outputs[0]
    reason = batch_axis_reason(x, mean.axes)
    if reason is None and not (mean.tensor.consumers() and variance.consumers()):
        reason = "nothing reads its outputs (already synchronized, or unused)"
    elif reason is None and not normalizes(x, mean.tensor, variance):
        reason = f"{what} over the batch axis that normalize nothing: left per tower"
    return Candidate(mean.tensor.op, LayerForm.MOMENTS, reason, MomentsParts(
        x, variance_op, tuple(mean.axes), mean.keep_dims, variance_reads_mean=reads_mean,
        statistics=tuple(statistics_ops(x, [mean.tensor, variance])), **parts))


def parse_variance(variance: tf.Tensor):
    """(MeanOf the mean, whether the variance reads m without StopGradient) when `variance` is one
    of the module docstring's spellings, else None."""
    outer = mean_of(variance)
    if outer is not None:
        return _centred(outer)
    op = variance.op
    if op.type != "Sub" or tf_private.input_types(op)[0] not in MEAN_TYPES:   # E[x²] − m²: E[x²] first
        return None
    second, squared_mean = op.inputs
    outer = mean_of(second)
    x = _square_of(outer.source) if outer is not None else None
    m = _square_of(squared_mean)
    if x is None or m is None:
        return None
    mean = mean_of(m)
    if mean is None or mean.source is not x or (mean.axes, mean.keep_dims) != (outer.axes, outer.keep_dims):
        return None
    return mean, True


def _centred(outer: MeanOf):
    """E[(x − m̃)²] read from its outer mean."""
    squared = outer.source.op
    pairs = []
    if squared.type == "SquaredDifference":
        a, b = squared.inputs
        pairs = [(a, b), (b, a)]
    else:
        d = _square_of(outer.source)
        if d is not None and d.op.type == "Sub":
            pairs = [tuple(d.op.inputs)]
    for x, centre in pairs:
        stopped = centre.op.type == "StopGradient"
        m = centre.op.inputs[0] if stopped else centre
        mean = mean_of(m)
        if mean is None or mean.source is not x or (mean.axes, mean.keep_dims) != (outer.axes, outer.keep_dims):
            continue
        if stopped and squared.type == "SquaredDifference" and m.op.type == "Mean":
            return None   # tf.nn.moments' own spelling: graphsync/match/moments.py
        return mean, not stopped
    return None


def _square_of(tensor: tf.Tensor):
    """t when `tensor` is Square(t) or Mul(t, t), else None."""
    op = tensor.op
    if op.type == "Square":
        return op.inputs[0]
    if op.type == "Mul" and op.inputs[0] is op.inputs[1]:
        return op.inputs[0]
    return None
