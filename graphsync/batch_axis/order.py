"""Ops that order or select among the elements along an axis: sorts, top-k, arg-max, cumulative
sums and products, unique. Along an axis that carries the batch they order or select among the
examples (CrossOp "order"): a value no synchronization can make one device's."""
from __future__ import annotations

from graphsync.batch_axis.axes import const_axes, only, rank_of
from graphsync.batch_axis.findings import CrossOp, Crossing
from graphsync.batch_axis.reductions import reduced
from graphsync.batch_axis.registry import End, register

ORDER_TYPES = frozenset("TopKV2 TopK ArgMax ArgMin Cumsum Cumprod CumulativeLogsumexp Unique UniqueV2 "
                        "UniqueWithCounts".split())


@register("order", *ORDER_TYPES)
def _order(op, ins, context):
    kind = op.type
    axes = only(ins, 0, op)
    if not axes:
        return [None] * len(op.outputs), None
    rank = rank_of(op.inputs[0])
    if kind in ("TopKV2", "TopK"):
        if rank is None:
            raise End("top-k of a tensor of unknown rank")
        last = frozenset({rank - 1})
        if axes & last:
            return [None] * len(op.outputs), CrossOp(op, Crossing.ORDER, partial=bool(axes - last))
        return [axes] * len(op.outputs), None
    if kind in ("Unique", "UniqueV2", "UniqueWithCounts"):
        return [None] * len(op.outputs), CrossOp(op, Crossing.ORDER)
    along = const_axes(op.inputs[1], rank)
    if kind in ("ArgMax", "ArgMin"):
        return reduced(op, axes, along, False, Crossing.ORDER)
    if axes & along:   # a cumulative sum or product along the batch
        return [axes], CrossOp(op, Crossing.ORDER)
    return [axes], None
