"""tf.nn.sufficient_statistics + tf.nn.normalize_moments with a shift s:

    shifted_mean = E[x − s]                       (Mul(Sum(Sub(x, s)), Reciprocal(count)))
    mean         = Add(shifted_mean, s)
    variance     = E[(x − s)²] − shifted_mean²    (SquaredDifference(x, s) or Square(Sub(x, s)))

Without a shift the same calls build E[x²] − m², graphsync/match/handwritten.py's. The variance
reads the shifted mean, not the mean: once its gradients are built, their ops read the tower's
shifted mean, which must become μ − s (MomentsParts' shifted_mean, shift and square).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import by_type
from graphsync.match.candidate import Candidate
from graphsync.match.handwritten import candidate
from graphsync.match.reductions import MeanOf, mean_of


STARTS = ("Sub",)   # the op types candidates() starts from (see match.starting_types)


def candidates(graph: tf.Graph) -> list[Candidate]:
    found = []
    for op in by_type.ops_of_types(graph, STARTS):
        parsed = _parse(op)
        if parsed is not None:
            mean, shifted, shift, square = parsed
            found.append(candidate(mean, op, False, "sufficient statistics", shifted_mean=shifted, shift=shift,
                                   square=square))
    return found


def _parse(variance_op: tf.Operation):
    """(MeanOf the mean, shifted mean, shift, the Square of the shifted mean) or None."""
    second, squared = variance_op.inputs
    if squared.op.type != "Square":
        return None
    shifted = squared.op.inputs[0]
    inner, outer = mean_of(shifted), mean_of(second)
    if inner is None or outer is None or (inner.axes, inner.keep_dims) != (outer.axes, outer.keep_dims):
        return None
    if inner.source.op.type != "Sub":
        return None
    x, shift = inner.source.op.inputs
    if not _is_squared_shift(outer.source, x, shift):
        return None
    for reader in shifted.consumers():
        if reader.type in ("Add", "AddV2") and _are(reader.inputs, shifted, shift):
            return MeanOf(reader.outputs[0], x, inner.axes, inner.keep_dims), shifted, shift, squared.op
    return None


def _is_squared_shift(squared: tf.Tensor, x: tf.Tensor, shift: tf.Tensor) -> bool:
    """Whether `squared` is (x − shift)²."""
    op = squared.op
    if op.type == "SquaredDifference":
        return _are(op.inputs, x, shift)
    if op.type == "Square" and op.inputs[0].op.type == "Sub":
        return _are(op.inputs[0].op.inputs, x, shift)
    return False


def _are(inputs, *tensors) -> bool:
    return len(inputs) == len(tensors) and all(a is b for a, b in zip(inputs, tensors))
