"""The verdict on each cross-example op (`verdict`): where its value goes.

    statistic     its value flows back into tensors that still carry the batch and on into the
                  model (an op reading a variable): a batch statistic, to synchronize across towers
    terminal      its value only reaches losses, metrics, summaries, variable updates: stays per tower
    undecided     a reduction read back into the examples, which reach no variable, in a graph with no
                  gradients yet: a batch norm at the model's end, or a monitor; said, stays per tower
    ghost         it reduces only part of the batch axes (a reshape split the batch: virtual batches)
    order         a sort, top-k or arg-max over the batch whose value flows back: cannot be synchronized
    synchronized  a merge across towers (a collective, graphsync's views) combines it with the other
                  towers' before it flows back

A value whose readers outnumber the walk's budget is taken for a statistic, never judged terminal
on the part the walk saw.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync.batch_axis.findings import Analysis, CrossOp, Crossing
from graphsync.batch_axis.registry import family_of
from graphsync.batch_axis.walks import reads_variable
from graphsync.graph.backward import has_backward, is_backward
from graphsync.match.fused import gradient_type

STATISTIC, TERMINAL, GHOST, ORDER, UNDECIDED = "statistic", "terminal", "ghost", "order", "undecided"
SYNCHRONIZED = "synchronized"
_MERGES = ("Collective", "Nccl")
# The gradient names of graphsync's statistics views (graphsync/exchange/views.py): a tower's own
# statistics enter them beside the merged ones, so a view combines the tower with the others.
GRAPHSYNC_VIEWS = ("GraphsyncStatisticsView", "GraphsyncSumView", "GraphsyncExtremumView")
# How a cross-example op "body" holds its body, by the family of its type (graphsync/batch_axis/bodies.py)
_RUNS = {"calls": "calls", "loops": "runs the loop body"}


def verdict(analysis: Analysis, crossed: CrossOp, tower_of=None, skip=frozenset(), budget: int = 4000) -> tuple:
    """(verdict, why) for one cross-example op. `tower_of(op)`: the tower an op belongs to (None
    outside them), so that a value combined with other towers' (a merge reading several towers, a
    collective) counts as synchronized; `skip`: ops the walk does not enter."""
    op = crossed.op
    if crossed.how is Crossing.BODY:
        name, inner, why = crossed.inner
        where = _RUNS.get(family_of(op.type), "runs the branch")
        why = f"{where} {name}, whose {inner.name} ({inner.type}) {why}"
        if not crossed.returned:
            return STATISTIC, why
        start = [op.outputs[k] for k in crossed.returned]
        reader, merged, _ = _flows_back(analysis, op, tower_of, skip, budget, start)
        if reader is _BEYOND_BUDGET:
            return STATISTIC, f"{why}; {_BEYOND_BUDGET_WHY % budget}"
        if reader is None:
            if merged is not None:
                return SYNCHRONIZED, f"{why}; {merged.name} combines it with the other towers'"
            return TERMINAL, f"{why}; it reaches no tensor that carries the batch into the model"
        return STATISTIC, f"{why}, and {reader.name} reads it back into the examples"
    how = crossed.how.described
    if crossed.how is Crossing.KERNEL:
        if any(not is_backward(c) for c in op.outputs[0].consumers()):
            return STATISTIC, how
        return TERMINAL, how + ", but nothing reads its output"
    reader, merged, returned = _flows_back(analysis, op, tower_of, skip, budget)
    if reader is _BEYOND_BUDGET:
        return STATISTIC, f"{how}; {_BEYOND_BUDGET_WHY % budget}"
    if reader is None:
        if merged is not None:
            return SYNCHRONIZED, f"{how}; {merged.name} combines it with the other towers'"
        if returned is _UNDIFFERENTIATED and crossed.how is Crossing.REDUCE and not crossed.partial:
            return UNDECIDED, f"{how}; its value is read back into the examples, which reach no variable, and the " \
                              "graph has no gradients yet to tell whether they reach the loss"
        if returned not in (None, _UNDIFFERENTIATED) and crossed.how is Crossing.REDUCE and not crossed.partial:
            # a batch norm at the model's end (normalize → pool → output): no variable after it, but
            # the examples it normalizes are differentiated; one device normalizes with the whole batch
            return STATISTIC, f"{how}, and {returned.name} reads it back into the examples the gradients " \
                              "are taken of"
        return TERMINAL, f"{how}; its value reaches no tensor that carries the batch into the model " \
                         "(a loss, a metric, a summary, a variable update)"
    if crossed.partial:
        return GHOST, f"{how} only in part (a reshape split the batch: virtual batches); {reader.name} reads it"
    if crossed.how is Crossing.ORDER:
        return ORDER, f"{how}, and {reader.name} reads it back into the examples"
    return STATISTIC, f"{how}, and {reader.name} reads it back into the examples"


# A value whose readers outnumber the walk's budget is not judged terminal on what the walk saw.
_BEYOND_BUDGET = object()
_UNDIFFERENTIATED = object()   # read back into the examples in a graph without gradients yet
_BEYOND_BUDGET_WHY = "its value reaches more than %d ops, not all followed: taken for a batch statistic"


def _flows_back(analysis: Analysis, op: tf.Operation, tower_of, skip, budget, start=None):
    """(the first forward op downstream of `op` (of its outputs `start` when given) whose output
    carries the batch and that reads one of the model's variables: the statistic went back into
    the model, or None, or _BEYOND_BUDGET when more than `budget` ops were left to walk; the first
    merge across towers met, or None; the first op whose output carries the batch and is read by
    the backward, variable or not, or None). Merges, and products with a constant zero, are not entered."""
    seen, stack, merged, returned = {op}, [list(op.outputs) if start is None else start], None, None
    while stack and budget > 0:
        for t in stack.pop():
            for reader in t.consumers():
                if reader in seen or reader in skip or is_backward(reader):
                    continue
                seen.add(reader)
                budget -= 1
                if _is_merge(reader, tower_of):
                    merged = merged or reader
                    continue
                if reader.type in ("Mul", "MulNoNan") and _times_zero(reader):
                    continue
                if any(analysis.carries(o) for o in reader.outputs):
                    if reads_variable(reader):
                        return reader, merged, reader
                    if returned in (None, _UNDIFFERENTIATED):
                        returned = reader if _differentiated(reader) else \
                            _UNDIFFERENTIATED if not has_backward(reader.graph) else returned
                stack.append(reader.outputs)
    return (_BEYOND_BUDGET if stack else None), merged, returned


def _differentiated(op) -> bool:
    """Whether the backward reads `op`'s outputs: its examples reach what the gradients are taken
    of (a monitor's or an unused normalization's are not)."""
    return any(is_backward(c) for t in op.outputs for c in t.consumers())


def _is_merge(op, tower_of) -> bool:
    if op.type.startswith(_MERGES) or _is_view(op):
        return True
    if tower_of is None or len(op.inputs) < 2:
        return False
    return len({tower_of(t.op) for t in op.inputs} - {None}) >= 2


def _is_view(op) -> bool:
    if op.type != "IdentityN":
        return False
    return gradient_type(op) in GRAPHSYNC_VIEWS


def _times_zero(op) -> bool:
    for t in op.inputs:
        value = tf.get_static_value(t) if t.op.type == "Const" else None
        if value is not None and np.size(value) and not np.any(value):
            return True
    return False
