"""Whether a divisor is the number of elements a Sum reduces: a constant equal to the product of
the summed tensor's static dimensions over the axes, or a small subgraph of its shape
(tf.nn.sufficient_statistics' `count`, `tf.cast(tf.shape(t)[0], …) * H * W`) that evaluates to
that product when the unknown dimensions are set to distinct primes. Evaluated here in numpy, for
the few ops shape arithmetic uses, so matching never runs a session.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync.graph import shapes

_COUNT_OPS = ("Cast", "Prod", "GatherV2", "Gather", "StridedSlice", "Pack", "ConcatV2", "Identity",
              "Mul", "Reshape", "Squeeze", "Const", "Shape", "Size")
_PROBE_DIMS = (7, 11, 13, 17, 19, 23, 29, 31)   # unknown dimensions, distinct so a wrong count shows


def _const_axes(axes_tensor: tf.Tensor, rank: int):
    axes = tf.get_static_value(axes_tensor)
    return None if axes is None else tuple(sorted({int(a) % rank for a in np.ravel(axes)}))


def is_count(count: tf.Tensor, total_op: tf.Operation, inverse: bool) -> bool:
    """Whether `count` (or 1/count) is the number of elements each of Sum `total_op`'s outputs adds.
    A computed count is evaluated (`_evaluate`) with Shape/Size of the summed tensor (or of an
    input of the elementwise op that makes it, as Square(x) is counted by Shape(x)) set to its
    static dimensions, the unknown ones distinct primes, and must equal their product over the axes."""
    source = total_op.inputs[0]
    rank = source.shape.rank
    axes = _const_axes(total_op.inputs[1], rank) if rank is not None else None
    if axes is None:
        return False
    value = tf.get_static_value(count)
    if value is not None:
        dims = [shapes.dim(source.shape, a) for a in axes]
        if np.size(value) != 1 or any(d is None for d in dims):
            return False
        want = float(np.prod(dims))
        try:
            got = float(np.ravel(value)[0])
        except (TypeError, ValueError):   # a complex or string constant counts nothing
            return False
        if inverse:   # got = 1/want, compared without dividing: a factor may be 0 (x * 0.0) or NaN
            return want > 0 and abs(got * want - 1.0) <= 1e-6
        return want > 0 and abs(got - want) <= 1e-6 * want
    if inverse:
        return False
    probe = [d if d is not None else _PROBE_DIMS[i % len(_PROBE_DIMS)] for i, d in enumerate(source.shape.as_list())]
    try:
        got = _evaluate(count, source, np.array(probe, np.int64), {}, [0])
    except (_NotACount, ValueError, IndexError, TypeError):
        return False
    want = float(np.prod([probe[a] for a in axes]))
    return want > 0 and np.size(got) == 1 and abs(float(np.ravel(got)[0]) - want) <= 1e-6 * want


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
    op_type = op.type
    if op_type == "Cast":
        return args[0].astype(op.outputs[0].dtype.as_numpy_dtype)
    if op_type in ("Identity", "Squeeze"):
        return np.squeeze(args[0]) if op_type == "Squeeze" else args[0]
    if op_type == "Reshape":
        return np.reshape(args[0], args[1])
    if op_type == "Prod":
        return np.prod(args[0], axis=tuple(np.ravel(args[1])), keepdims=bool(op.get_attr("keep_dims")))
    if op_type in ("GatherV2", "Gather"):
        return np.take(args[0], args[1], axis=int(args[2]) if op_type == "GatherV2" else 0)
    if op_type == "Mul":
        return args[0] * args[1]
    if op_type == "Pack":
        return np.stack(args, axis=op.get_attr("axis"))
    if op_type == "ConcatV2":
        return np.concatenate(args[:-1], axis=int(args[-1]))
    if op_type == "StridedSlice":
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
