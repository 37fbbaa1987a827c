"""Gathers: rows of params picked by indices. The batch of the indices goes to the axes they take
in the output, that of params around the gathered axis; gathering along the batch axis itself
picks examples and ends the trace."""
from __future__ import annotations

import tensorflow as tf

from graphsync.batch_axis.axes import rank_of
from graphsync.batch_axis.registry import End, register


@register("gather", "GatherV2", "Gather", "ResourceGather")
def _gather(op, ins, context):
    params, indices = ins[0], ins[1]
    if len(ins) > 2 and ins[2]:
        raise End("a gather along a computed axis")
    rank_p, rank_i = rank_of(op.inputs[0]), rank_of(op.inputs[1])
    if op.type == "ResourceGather":
        axis = 0
    else:
        axis = 0 if op.type == "Gather" else tf.get_static_value(op.inputs[2])
    if axis is None or rank_i is None or (params and rank_p is None):
        raise End("a gather of unknown rank or along a computed axis")
    axis = int(axis) % rank_p if rank_p else int(axis)
    if op.type != "ResourceGather" and op.get_attr("batch_dims") if op.type == "GatherV2" else False:
        raise End("a gather with batch_dims")
    found = set()
    if params:
        if axis in params:
            raise End("a gather of examples")
        found |= {a if a < axis else a - 1 + rank_i for a in params}
    if indices:
        found |= {a + axis for a in indices}
    return [frozenset(found) or None], None
