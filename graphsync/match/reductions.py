"""Reading a mean over axes in any of the spellings real code uses, and telling whether those axes
make it a batch statistic.

    Mean(t, axes)                                   tf.reduce_mean
    RealDiv | Div | DivNoNan (Sum(t, axes), count)  tf.reduce_sum(t) / n
    Mul(Sum(t, axes), Reciprocal(count) | 1/count)  tf.nn.normalize_moments

`count` must be the number of elements each statistic reduces: a constant equal to the product of
t's static dimensions over the axes, or a small subgraph of t's shape (tf.nn.sufficient_statistics'
`count`, `tf.cast(tf.shape(t)[0], …) * H * W`) that evaluates to that product when t's unknown
dimensions are set to distinct primes.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import tensorflow as tf

from graphsync.match import ghost

_DIVISIONS = ("RealDiv", "Div", "DivNoNan")
_COUNT_OPS = ("Cast", "Prod", "GatherV2", "Gather", "StridedSlice", "Pack", "ConcatV2", "Identity",
              "Mul", "Reshape", "Squeeze", "Const", "Shape", "Size")
_GRADIENT_SCOPE = re.compile(r"(?:^|/)gradients(?:_\d+)?/")


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
    if op.type in _DIVISIONS:
        total, count = op.inputs
        if total.op.type == "Sum" and _is_count(count, total.op, inverse=False):
            return _reduction(tensor, total.op)
        return None
    if op.type == "Mul":
        for total, factor in (op.inputs, op.inputs[::-1]):
            if total.op.type != "Sum":
                continue
            if factor.op.type == "Reciprocal" and _is_count(factor.op.inputs[0], total.op, inverse=False):
                return _reduction(tensor, total.op)
            if factor.op.type == "Const" and _is_count(factor, total.op, inverse=True):
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


def _is_count(count: tf.Tensor, total_op: tf.Operation, inverse: bool) -> bool:
    """Whether `count` (or 1/count) is the number of elements each of Sum `total_op`'s outputs adds.
    A computed count is evaluated (`_evaluate`) with Shape/Size of the summed tensor (or of an
    input of the elementwise op that makes it, as Square(x) is counted by Shape(x)) set to its
    static dimensions, the unknown ones distinct primes, and must equal their product over the axes."""
    source = total_op.inputs[0]
    rank = source.shape.rank
    axes = const_axes(total_op.inputs[1], rank) if rank is not None else None
    if axes is None:
        return False
    value = tf.get_static_value(count)
    if value is not None:
        dims = [source.shape[a] for a in axes]
        if np.size(value) != 1 or any(d is None for d in dims):
            return False
        want = float(np.prod(dims))
        got = 1.0 / float(np.ravel(value)[0]) if inverse else float(np.ravel(value)[0])
        return abs(got - want) <= 1e-6 * want
    if inverse or source.shape.rank is None:
        return False
    probe = [d if d is not None else _PROBE_DIMS[i % len(_PROBE_DIMS)] for i, d in enumerate(source.shape.as_list())]
    try:
        got = _evaluate(count, source, np.array(probe, np.int64), {}, [0])
    except (_NotACount, ValueError, IndexError, TypeError):
        return False
    want = float(np.prod([probe[a] for a in axes]))
    return np.size(got) == 1 and abs(float(np.ravel(got)[0]) - want) <= 1e-6 * want


_PROBE_DIMS = (7, 11, 13, 17, 19, 23, 29, 31)   # unknown dimensions, distinct so a wrong count shows


class _NotACount(Exception):
    pass


def _evaluate(tensor, source, dims, memo, budget):
    """`tensor`'s value as numpy, its shape reads replaced by `dims`; _NotACount outside the op set."""
    if tensor.ref() in memo:
        return memo[tensor.ref()]
    op = tensor.op
    budget[0] += 1
    if budget[0] > 32 or op.type not in _COUNT_OPS or len(op.outputs) != 1:
        raise _NotACount
    if op.type in ("Shape", "Size"):
        if not _same_shape(op.inputs[0], source):
            raise _NotACount
        value = dims if op.type == "Shape" else np.prod(dims)
        value = np.asarray(value, tensor.dtype.as_numpy_dtype)
    elif op.type == "Const":
        value = tf.get_static_value(tensor)
    else:
        args = [_evaluate(t, source, dims, memo, budget) for t in op.inputs]
        value = _apply(op, args)
    memo[tensor.ref()] = value
    return value


def _apply(op, args):
    kind = op.type
    if kind == "Cast":
        return args[0].astype(op.outputs[0].dtype.as_numpy_dtype)
    if kind in ("Identity", "Squeeze"):
        return np.squeeze(args[0]) if kind == "Squeeze" else args[0]
    if kind == "Reshape":
        return np.reshape(args[0], args[1])
    if kind == "Prod":
        return np.prod(args[0], axis=tuple(np.ravel(args[1])), keepdims=bool(op.get_attr("keep_dims")))
    if kind in ("GatherV2", "Gather"):
        return np.take(args[0], args[1], axis=int(args[2]) if kind == "GatherV2" else 0)
    if kind == "Mul":
        return args[0] * args[1]
    if kind == "Pack":
        return np.stack(args, axis=op.get_attr("axis"))
    if kind == "ConcatV2":
        return np.concatenate(args[:-1], axis=int(args[-1]))
    if kind == "StridedSlice":
        return _strided_slice_1d(op, *args)
    raise _NotACount


def _strided_slice_1d(op, vector, begin, end, strides):
    """A StridedSlice of a shape vector (1-D, no ellipsis or new axes): what `shape[i]` and
    `shape[1:]` build."""
    masks = {name: op.get_attr(name) for name in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                                   "shrink_axis_mask")}
    if np.ndim(vector) != 1 or np.size(begin) != 1 or masks["ellipsis_mask"] or masks["new_axis_mask"]:
        raise _NotACount
    if masks["shrink_axis_mask"] & 1:
        return vector[int(begin[0])]
    start = None if masks["begin_mask"] & 1 else int(begin[0])
    stop = None if masks["end_mask"] & 1 else int(end[0])
    return vector[start:stop:int(strides[0])]


def _same_shape(tensor: tf.Tensor, source: tf.Tensor) -> bool:
    if tensor is source:
        return True
    return any(tensor is t for t in source.op.inputs) and tensor.shape.rank == source.shape.rank and \
        tensor.shape.is_compatible_with(source.shape)


def batch_axis_reason(x: tf.Tensor, axes: tuple) -> str | None:
    """Why statistics of `x` over `axes` are not batch statistics to synchronize (None if they are)."""
    k = ghost.virtual_batch_size(x, axes)
    if k is not None:
        return ghost.reason(k)
    if 0 not in axes:
        return f"moments over axes {list(axes)} exclude the batch axis 0: layer/instance/group norm"
    return None


def is_gradient_op(op: tf.Operation) -> bool:
    return bool(_GRADIENT_SCOPE.search(op.name))


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
                if op in found or op in stops or is_gradient_op(op):
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
