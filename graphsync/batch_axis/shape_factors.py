"""A reader of symbolic shapes: a dimension by structure, as the ordered factors (outermost first)
it is the product of, each (key, size): key (tensor ref, axis) names the dimension of a tensor it
was read from (None for a constant), size its static size or None. Read through the ops
tf.tensordot and reshapes build: Shape, GatherV2, Prod, Pack, ConcatV2, StridedSlice, Cast; a
tensor's dimensions through Transpose, MatMul, Reshape and one-input elementwise ops. Anything else
is a factor of its own. The reshape rule (reshape.py) reads a shape computed at run time with it."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync.batch_axis.elementwise import ELEMENTWISE
from graphsync.graph import shapes

_SAME_DIMS = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient", "EnsureShape"}) | \
    frozenset(k for k in ELEMENTWISE if k not in ("Select", "SelectV2"))


def dim_factors(t, memo, depth=0):
    """Each axis of `t` as its factors, or None (unknown rank)."""
    if t.ref() in memo:
        return memo[t.ref()]
    dims = shapes.dims(t.shape)
    if dims is None:
        return None
    op, found = t.op, None
    if depth < 64:
        if op.type == "Transpose":
            perm, src = tf.get_static_value(op.inputs[1]), dim_factors(op.inputs[0], memo, depth + 1)
            if perm is not None and src is not None:
                found = [src[int(p)] for p in np.ravel(perm)]
        elif op.type in _SAME_DIMS and len(op.inputs) == 1 and op.outputs[0] is t:
            found = dim_factors(op.inputs[0], memo, depth + 1)
        elif op.type == "MatMul":
            a, b = (dim_factors(x, memo, depth + 1) for x in op.inputs[:2])
            if a is not None and b is not None and len(a) == len(b) == 2:
                found = [a[1 if op.get_attr("transpose_a") else 0], b[0 if op.get_attr("transpose_b") else 1]]
        elif op.type == "Reshape":
            value = shape_value(op.inputs[1], memo, depth + 1)
            if value is not None and not value[0] and all(v is not None for v in value[1]):
                src = dim_factors(op.inputs[0], memo, depth + 1)
                if all(len(v) == 1 and v[0][0] is None for v in value[1]):   # constant: a regrouping?
                    found = _regrouped(src, [v[0][1] for v in value[1]])
                else:   # computed: only as a regrouping of the input's own factors, in their order
                    found = _regrouped_as(src, value[1])
    if found is None or len(found) != len(dims):
        found = [None] * len(dims)
    out = []
    for i, (d, factors) in enumerate(zip(dims, found)):
        sizes = [s for _, s in factors] if factors is not None else [None]
        if factors is None or (d is not None and (None in sizes or int(np.prod(sizes, dtype=object)) != d)):
            factors = [((t.ref(), i), d)]
        out.append(list(factors))
    memo[t.ref()] = out
    return out


def _regrouped(factors, sizes):
    """The input's factors grouped into the output's axes of `sizes` when each output axis is a
    run of whole input axes of static sizes (a merge such as [N, H, W, C] → [N·H·W, C]), else None."""
    if factors is None or any(s is None for axis in factors for _, s in axis):
        return None
    out, k = [], 0
    for size in sizes:
        group, product = [], 1
        while k < len(factors) and (product < size or not group):
            group += factors[k]
            product *= int(np.prod([s for _, s in factors[k]], dtype=object))
            k += 1
        if product != size:
            return None
        out.append(group)
    return out if k == len(factors) else None


def _regrouped_as(factors, groups):
    """The input's factors grouped as `groups` (a shape's factors) when these are the same factors
    in the same order (a dimension read from the same tensor, or of the same static size), else
    None: a reshape to the shape of another layout (a transposed tensor put back into its
    original's shape) mixes the factors, and says nothing about which of them holds the examples."""
    if factors is None:
        return None
    flat = [f for axis in factors for f in axis if f[1] != 1]
    out, k = [], 0
    for group in groups:
        regrouped = []
        for key, size in group:
            if size == 1:
                continue
            if k >= len(flat) or not ((key is not None and key == flat[k][0]) or
                                      (size is not None and size == flat[k][1])):
                return None
            regrouped.append(flat[k])
            k += 1
        out.append(regrouped or [(None, 1)])
    return out if k == len(flat) else None


def shape_value(t, memo, depth=0):
    """An int tensor's value as factors: (scalar?, [each element's factors, or None]), or None."""
    if depth > 64 or t.shape.rank not in (0, 1):
        return None
    op = t.op
    const = tf.get_static_value(t) if op.type == "Const" else None
    if const is not None:
        return np.ndim(const) == 0, [[(None, int(v))] if v >= 0 else None for v in np.ravel(const)]
    if op.type == "Shape":
        dims = dim_factors(op.inputs[0], memo, depth + 1)
        return None if dims is None else (False, dims)
    if op.type in ("Identity", "Cast"):
        return shape_value(op.inputs[0], memo, depth + 1)
    if op.type == "GatherV2":
        params, indices, axis = shape_value(op.inputs[0], memo, depth + 1), \
            tf.get_static_value(op.inputs[1]), tf.get_static_value(op.inputs[2])
        if params is None or params[0] or indices is None or axis is None or int(axis) != 0 or \
                op.get_attr("batch_dims"):
            return None
        picked = [params[1][int(k)] if -len(params[1]) <= int(k) < len(params[1]) else None for k in np.ravel(indices)]
        if None in picked and any(int(k) >= len(params[1]) or int(k) < -len(params[1]) for k in np.ravel(indices)):
            return None
        return np.ndim(indices) == 0, picked
    if op.type == "Prod":
        value, along = shape_value(op.inputs[0], memo, depth + 1), tf.get_static_value(op.inputs[1])
        if value is None or along is None or any(int(a) not in (0, -1) for a in np.ravel(along)) or \
                any(v is None for v in value[1]):
            return None
        product = [f for v in value[1] for f in v] if not value[0] else value[1][0]
        return not op.get_attr("keep_dims") or value[0], [product or [(None, 1)]]
    if op.type == "Mul":
        a, b = (shape_value(x, memo, depth + 1) for x in op.inputs)
        if a is None or b is None or not (a[0] and b[0]) or a[1][0] is None or b[1][0] is None:
            return None
        return True, [a[1][0] + b[1][0]]
    if op.type == "Pack" and op.get_attr("axis") == 0:
        pieces = [shape_value(x, memo, depth + 1) for x in op.inputs]
        if any(p is None or not p[0] for p in pieces):
            return None
        return False, [p[1][0] for p in pieces]
    if op.type == "ConcatV2":
        axis = tf.get_static_value(op.inputs[-1])
        pieces = [shape_value(x, memo, depth + 1) for x in op.inputs[:-1]]
        if axis is None or int(axis) not in (0, -1) or any(p is None or p[0] for p in pieces):
            return None
        return False, [v for p in pieces for v in p[1]]
    if op.type == "Slice":   # tf.nn.softmax_cross_entropy_with_logits: Slice(Shape(x), [rank − 1], [1])
        value, begin, size = shape_value(op.inputs[0], memo, depth + 1), _small_int(op.inputs[1]), \
            _small_int(op.inputs[2])
        if value is None or value[0] or begin is None or size is None:
            return None
        end = len(value[1]) if size == -1 else begin + size
        return (False, value[1][begin:end]) if 0 <= begin <= end <= len(value[1]) else None
    if op.type == "StridedSlice":
        value = shape_value(op.inputs[0], memo, depth + 1)
        spec = [tf.get_static_value(x) for x in op.inputs[1:4]]
        masks = [op.get_attr(k) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                          "shrink_axis_mask")]
        if value is None or value[0] or any(s is None or np.size(s) != 1 for s in spec) or any(masks[2:4]):
            return None
        begin, end, stride = (int(np.ravel(s)[0]) for s in spec)
        if masks[4] & 1:
            return (True, [value[1][begin]]) if -len(value[1]) <= begin < len(value[1]) else None
        sl = slice(None if masks[0] & 1 else begin, None if masks[1] & 1 else end, stride)
        return False, value[1][sl]
    return None


def _small_int(t, depth=0):
    """A one-element int tensor's value, also when computed by Add/Sub/Pack from constants and
    ranks (TensorFlow's static values stop at arithmetic), else None."""
    value = tf.get_static_value(t)
    if value is not None:
        return int(np.ravel(value)[0]) if np.size(value) == 1 else None
    op = t.op
    if depth < 8 and op.type in ("Sub", "Add", "AddV2"):
        a, b = (_small_int(x, depth + 1) for x in op.inputs)
        return None if a is None or b is None else a - b if op.type == "Sub" else a + b
    if depth < 8 and op.type in ("Pack", "Identity") and len(op.inputs) == 1:
        return _small_int(op.inputs[0], depth + 1)
    if op.type == "Rank" and op.inputs[0].shape.rank is not None:
        return op.inputs[0].shape.rank
    return None
