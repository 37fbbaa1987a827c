"""Ops that move, add or copy axes, keeping every example: transpose, expand and squeeze, concat
and stack, broadcast, pad, tile, reverse, roll, one-hot, and the blocks SpaceToBatch moves into the
batch axis and back. The batch follows its axes; a move that cannot be read (a computed
permutation or axis, an unknown rank) ends the trace."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync.batch_axis.axes import only, rank_of
from graphsync.batch_axis.registry import End, register
from graphsync.graph import shapes


@register("data movement", "Transpose")
def _transpose(op, ins, context):
    axes = only(ins, 0, op)
    perm = tf.get_static_value(op.inputs[1])
    if perm is None:
        raise End("its permutation is not constant")
    perm = [int(p) for p in np.ravel(perm)]
    return [frozenset(perm.index(a) for a in axes)], None


@register("data movement", "ExpandDims")
def _expand_dims(op, ins, context):
    axes = only(ins, 0, op)
    rank = rank_of(op.inputs[0])
    dim = int(np.ravel(tf.get_static_value(op.inputs[1]))[0]) if tf.get_static_value(op.inputs[1]) is not None \
        else None
    if dim is None or (rank is None and dim < 0):
        raise End("its axis is not constant")
    dim = dim % (rank + 1) if rank is not None else dim
    return [frozenset(a + (a >= dim) for a in axes)], None


@register("data movement", "Squeeze")
def _squeeze(op, ins, context):
    axes = only(ins, 0, op)
    dims_in = shapes.dims(op.inputs[0].shape)
    listed = list(op.get_attr("squeeze_dims"))
    if dims_in is None:
        raise End("a squeeze of unknown rank")
    removed = {d % len(dims_in) for d in listed} if listed else {i for i, d in enumerate(dims_in) if d == 1}
    if rank_of(op.outputs[0]) != len(dims_in) - len(removed):
        raise End("a squeeze of unknown dimensions")
    if axes & removed:
        raise End("a squeeze of the batch axis")
    return [frozenset(a - sum(r < a for r in removed) for a in axes)], None


@register("data movement", "ConcatV2")
def _concat(op, ins, context):
    values = [a for a in ins[:-1] if a]
    if ins[-1]:
        raise End("a concatenation along a computed axis")
    if len(set(values)) > 1:
        raise End("a concatenation of tensors carrying the batch on different axes")
    return [values[0] if values else None], None


@register("data movement", "Concat")
def _concat_axis_first(op, ins, context):
    """Concat takes its axis first, ConcatV2 last."""
    return _concat(op, ins[1:] + ins[:1], context)


@register("data movement", "Pack")
def _pack(op, ins, context):
    values = {a for a in ins if a}
    if len(values) > 1:
        raise End("a stack of tensors carrying the batch on different axes")
    rank = rank_of(op.outputs[0])
    axis = op.get_attr("axis")
    if rank is None:
        raise End("a stack of unknown rank")
    axis %= rank
    axes = values.pop() if values else frozenset()
    return [frozenset(a + (a >= axis) for a in axes) or None], None


@register("data movement", "BroadcastTo")
def _broadcast_to(op, ins, context):
    axes = only(ins, 0, op)
    rank_in, rank_out = rank_of(op.inputs[0]), rank_of(op.outputs[0])
    if rank_in is None or rank_out is None:
        raise End("a broadcast of unknown rank")
    return [frozenset(a + rank_out - rank_in for a in axes)], None


@register("data movement", "Pad", "PadV2", "MirrorPad", "Tile", "ReverseV2", "Roll")
def _same_axes(op, ins, context):
    return [only(ins, 0, op)] * len(op.outputs), None


@register("data movement", "OneHot")
def _one_hot(op, ins, context):
    axes = only(ins, 0, op)
    axis = op.get_attr("axis")
    rank = rank_of(op.inputs[0])
    if axis == -1:
        return [axes], None
    if rank is None:
        raise End("a one-hot of unknown rank")
    return [frozenset(a + (a >= axis) for a in axes)], None


@register("data movement", "SpaceToBatchND", "BatchToSpaceND", "SpaceToBatch", "BatchToSpace")
def _space_batch(op, ins, context):
    """SpaceToBatchND / BatchToSpaceND (atrous convolution): blocks of the spatial axes moved into
    the batch axis and back. Axis 0 carries the examples on both sides (with spatial blocks in
    between, which a reduction over axis 0 and the spatial axes sums all the same)."""
    axes = only(ins, 0, op)
    if axes != frozenset({0}):
        raise End("spatial blocks moved into or out of an axis other than the batch's")
    return [axes], None
