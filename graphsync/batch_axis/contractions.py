"""Contractions: MatMul, BatchMatMul, Einsum. A free axis of an input carries its batch to the
output's axis it becomes; a contracted axis carrying the batch combines examples (CrossOp
"contract")."""
from __future__ import annotations

from graphsync.batch_axis.axes import rank_of
from graphsync.batch_axis.findings import CrossOp, Crossing
from graphsync.batch_axis.registry import End, register


@register("contractions", "MatMul")
def _matmul(op, ins, context):
    a, b = ins[0], ins[1]
    ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    out, crossed = set(), False
    if a:
        rows, inner = (1, 0) if ta else (0, 1)
        out |= {0} if rows in a else set()
        crossed |= inner in a
    if b:
        cols, inner = (0, 1) if tb else (1, 0)
        out |= {1} if cols in b else set()
        crossed |= inner in b
    return [frozenset(out) or None], CrossOp(op, Crossing.CONTRACT) if crossed else None


@register("contractions", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _batch_matmul(op, ins, context):
    out_rank = rank_of(op.outputs[0])
    if out_rank is None or any(rank_of(t) is None for t in op.inputs[:2]):
        raise End("a batch matmul of unknown rank")
    adj_a = op.get_attr("adj_x")
    adj_b = op.get_attr("adj_y")
    out, crossed = set(), False
    for t, axes, is_a in ((op.inputs[0], ins[0], True), (op.inputs[1], ins[1], False)):
        if not axes:
            continue
        r = rank_of(t)
        if is_a:
            rows, inner = (r - 1, r - 2) if adj_a else (r - 2, r - 1)
            keep_to = out_rank - 2
        else:
            inner, rows = (r - 1, r - 2) if adj_b else (r - 2, r - 1)
            keep_to = out_rank - 1
        for ax in axes:
            if ax == inner:
                crossed = True
            elif ax == rows:
                out.add(keep_to)
            else:
                out.add(ax + out_rank - r)
    return [frozenset(out) or None], CrossOp(op, Crossing.CONTRACT) if crossed else None


@register("contractions", "Einsum")
def _einsum(op, ins, context):
    equation = op.get_attr("equation").decode().replace(" ", "")
    if "..." in equation or "->" not in equation:
        raise End("an einsum with an ellipsis or no output")
    lhs, rhs = equation.split("->")
    terms = lhs.split(",")
    out, crossed = set(), False
    for term, axes in zip(terms, ins):
        for ax in axes or ():
            label = term[ax]
            if label in rhs:
                out.add(rhs.index(label))
            else:
                crossed = True
    return [frozenset(out) or None], CrossOp(op, Crossing.CONTRACT) if crossed else None
