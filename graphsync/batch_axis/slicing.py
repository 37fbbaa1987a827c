"""Ops that take parts of a tensor: slices, strided slices, splits, unstacks. Along an axis that
does not carry the batch they keep every example; one that would take some of the examples, or
single ones, ends the trace."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync.batch_axis.axes import only, rank_of
from graphsync.batch_axis.registry import End, register


@register("slicing", "Unpack")
def _unpack(op, ins, context):
    axes = only(ins, 0, op)
    rank = rank_of(op.inputs[0])
    if rank is None:
        raise End("an unstack of unknown rank")
    axis = op.get_attr("axis") % rank
    if axis in axes:
        raise End("an unstack of the batch axis into single examples")
    return [frozenset(a - (a > axis) for a in axes)] * len(op.outputs), None


@register("slicing", "Split", "SplitV")
def _split(op, ins, context):
    value = 1 if op.type == "Split" else 0
    axes = only(ins, value, op)
    rank, axis = rank_of(op.inputs[value]), tf.get_static_value(op.inputs[0 if op.type == "Split" else 2])
    if axes and (rank is None or axis is None or int(axis) % rank in axes) and len(op.outputs) > 1:
        raise End("a split of the examples into parts")
    return [axes] * len(op.outputs), None


@register("slicing", "Slice")
def _slice(op, ins, context):
    axes = only(ins, 0, op)
    begin, size = tf.get_static_value(op.inputs[1]), tf.get_static_value(op.inputs[2])
    if axes and (begin is None or size is None or any(begin[a] != 0 or size[a] != -1 for a in axes)):
        raise End("a slice that selects some of the examples")
    return [axes], None


@register("slicing", "StridedSlice")
def _strided_slice(op, ins, context):
    axes = only(ins, 0, op)
    rank = rank_of(op.inputs[0])
    n = op.inputs[1].shape.num_elements()   # which axes go where needs the spec's length and masks only
    if rank is None or n is None:            # (a loop's x[i] slices at a computed step)
        raise End("a strided slice of unknown rank or spec length")
    masks = {k: op.get_attr(k) for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    mapping, spec, i_in, i_out = {}, {}, 0, 0
    for s in range(n):
        bit = 1 << s
        if masks["ellipsis_mask"] & bit:
            later = sum(1 for j in range(s + 1, n) if not masks["new_axis_mask"] & (1 << j))
            for _ in range(rank - i_in - later):
                mapping[i_in] = i_out
                i_in, i_out = i_in + 1, i_out + 1
        elif masks["new_axis_mask"] & bit:
            i_out += 1
        elif masks["shrink_axis_mask"] & bit:
            mapping[i_in] = None
            i_in += 1
        else:
            mapping[i_in], spec[i_in] = i_out, s
            i_in, i_out = i_in + 1, i_out + 1
    while i_in < rank:
        mapping[i_in] = i_out
        i_in, i_out = i_in + 1, i_out + 1
    if any(mapping.get(a) is None for a in axes):
        raise End("a slice that selects single examples")
    if any(not _whole(op, spec.get(a)) for a in axes):
        raise End("a slice that selects some of the examples")
    return [frozenset(mapping[a] for a in axes)], None


def _whole(op, s) -> bool:
    """Whether slice spec `s` of a StridedSlice (None: under the ellipsis) takes a whole axis."""
    if s is None:
        return True
    begin, end, strides = (tf.get_static_value(t) for t in op.inputs[1:4])
    bit = 1 << s
    starts = bool(op.get_attr("begin_mask") & bit) or (begin is not None and int(np.ravel(begin)[s]) == 0)
    ends = bool(op.get_attr("end_mask") & bit) or (end is not None and int(np.ravel(end)[s]) >= 2 ** 31 - 1)
    return starts and ends and strides is not None and int(np.ravel(strides)[s]) == 1
