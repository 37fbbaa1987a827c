"""Reading a mean over axes in any of the spellings real code uses, and telling whether those axes
make it a batch statistic.

    Mean(t, axes)                                   tf.reduce_mean
    RealDiv | Div | DivNoNan (Sum(t, axes), count)  tf.reduce_sum(t) / n
    Mul(Sum(t, axes), Reciprocal(count) | 1/count)  tf.nn.normalize_moments

`count` must be the number of elements each statistic reduces (graphsync/match/counts.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from graphsync.graph import tf_private
from graphsync.match import ghost
from graphsync.match.counts import is_count
from graphsync.graph.backward import is_backward

_DIVISIONS = ("RealDiv", "Div", "DivNoNan")
MEAN_TYPES = frozenset(("Mean", "Mul") + _DIVISIONS)   # the op types `mean_of` reads a mean from


@dataclasses.dataclass(frozen=True)
class MeanOf:
    """`tensor` is the mean of `source` over `axes` (normalized to 0..rank−1, sorted)."""

    tensor: tf.Tensor
    source: tf.Tensor
    axes: tuple
    keep_dims: bool


def const_axes(axes_tensor: tf.Tensor, rank: int):
    axes = tf.get_static_value(axes_tensor)
    if axes is None:
        return None
    return tuple(sorted({int(a) % rank for a in np.ravel(axes)}))


def mean_of(tensor: tf.Tensor) -> MeanOf | None:
    """What `tensor` is the mean of, if it is one in a spelling of the module docstring."""
    op = tensor.op
    if op.type == "Mean":
        return _reduction(tensor, op)
    # the inputs' types first: most divisions and products are no mean, and reading the types
    # costs less than building the op's inputs
    if op.type in _DIVISIONS:
        if tf_private.input_types(op)[0] != "Sum":
            return None
        total, count = op.inputs
        if is_count(count, total.op, inverse=False):
            return _reduction(tensor, total.op)
        return None
    if op.type == "Mul":
        if "Sum" not in tf_private.input_types(op):
            return None
        for total, factor in (op.inputs, op.inputs[::-1]):
            if total.op.type != "Sum":
                continue
            if factor.op.type == "Reciprocal" and is_count(factor.op.inputs[0], total.op, inverse=False):
                return _reduction(tensor, total.op)
            if factor.op.type == "Const" and is_count(factor, total.op, inverse=True):
                return _reduction(tensor, total.op)
    return None


def _reduction(tensor, op) -> MeanOf | None:
    source = op.inputs[0]
    rank = source.shape.rank
    if rank is None:
        return None
    axes = const_axes(op.inputs[1], rank)
    if not axes:
        return None
    return MeanOf(tensor, source, axes, bool(op.get_attr("keep_dims")))


def batch_axis_reason(x: tf.Tensor, axes: tuple) -> str | None:
    """Why statistics of `x` over `axes` are not batch statistics to synchronize (None if they are)."""
    k = ghost.virtual_batch_size(x, axes)
    if k is not None:
        return ghost.reason(k)
    if 0 not in axes:
        return f"moments over axes {list(axes)} exclude the batch axis 0: layer/instance/group norm"
    return None


def normalizes(x: tf.Tensor, mean: tf.Tensor, variance: tf.Tensor, depth: int = 6) -> bool:
    """Whether `mean` and `variance` normalize `x`: some forward op within `depth` consumers reads,
    through its inputs, all three (x by a path that avoids the statistics themselves) — what
    (x − m)·rsqrt(v + ε) and tf.nn.batch_normalization's x·s + (β − m·s) both build."""
    stops = {mean.op, variance.op}
    reached = [_downstream(t, depth, stops) for t in (x, mean, variance)]
    return bool(reached[0] & reached[1] & reached[2])


def _downstream(tensor: tf.Tensor, depth: int, stops) -> set:
    found, frontier = set(), [tensor]
    for _ in range(depth):
        nxt = []
        for t in frontier:
            for op in t.consumers():
                if op in found or op in stops or is_backward(op):
                    continue
                found.add(op)
                nxt.extend(op.outputs)
        frontier = nxt
    return found


def statistics_ops(x: tf.Tensor, tensors, limit: int = 64) -> tuple:
    """The ops that compute `tensors` from x (x's own op excluded): the statistics' subgraph."""
    found, stack = [], [t.op for t in tensors]
    while stack and len(found) < limit:
        op = stack.pop()
        if op is x.op or op in found:
            continue
        found.append(op)
        stack.extend(t.op for t in op.inputs)
    return tuple(found)
