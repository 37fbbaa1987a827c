"""The verdict on each cross-example op (`judge`): where its value goes.

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

The plan adds its own words to the same vocabulary (graphsync/plan/rule.py): "per tower" and
"refused". A judgement is a value (`Judgement`): its text is put together only when said.
"""
from __future__ import annotations

import dataclasses
import enum

import numpy as np
import tensorflow as tf

from graphsync.batch_axis.findings import Analysis, CrossOp, Crossing
from graphsync.batch_axis.registry import family_of
from graphsync.graph.walks import reads_variable
from graphsync.graph.backward import has_backward, is_backward
from graphsync.match.fused import gradient_type


class Verdict(str, enum.Enum):
    """The one vocabulary of verdicts: where the trace finds a cross-example value goes (the first
    six), and what the plan makes of a statistic it does not synchronize (per tower, refused). A
    str, so that its value is the word `graphsync inspect` prints and its JSON holds (enum.StrEnum's
    behaviour, which Python 3.10 lacks)."""
    STATISTIC = "statistic"
    TERMINAL = "terminal"
    GHOST = "ghost"
    ORDER = "order"
    UNDECIDED = "undecided"
    SYNCHRONIZED = "synchronized"
    PER_TOWER = "per tower"
    REFUSED = "refused"

    __str__ = str.__str__
    __format__ = str.__format__


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A verdict, and why in two parts kept apart: what the op does with the examples (`does`, the
    clause a function body's judgement is quoted by when its If or loop returns the value,
    graphsync/batch_axis/bodies.py), and where its value goes (`goes`, the rest of the sentence,
    punctuation included). Unpacks as (verdict, why), the pair the verdicts were before."""

    verdict: Verdict
    does: str
    goes: str = ""

    @property
    def why(self) -> str:
        return self.does + self.goes

    def __iter__(self):
        return iter((self.verdict, self.why))

    def __getitem__(self, index):
        return tuple(self)[index]


_MERGES = ("Collective", "Nccl")
# The gradient names of graphsync's statistics views (graphsync/exchange/views.py): a tower's own
# statistics enter them beside the merged ones, so a view combines the tower with the others.
GRAPHSYNC_VIEWS = ("GraphsyncStatisticsView", "GraphsyncSumView", "GraphsyncExtremumView")
# How a cross-example op "body" holds its body, by the family of its type (graphsync/batch_axis/bodies.py)
_RUNS = {"calls": "calls", "loops": "runs the loop body"}


def judge(analysis: Analysis, crossed: CrossOp, tower_of=None, skip=frozenset(), budget: int = 4000) -> Judgement:
    """The judgement on one cross-example op. `tower_of(op)`: the tower an op belongs to (None
    outside them), so that a value combined with other towers' (a merge reading several towers, a
    collective) counts as synchronized; `skip`: ops the walk does not enter."""
    op = crossed.op
    if crossed.how is Crossing.BODY:
        name, inner, why = crossed.inner
        where = _RUNS.get(family_of(op.type), "runs the branch")
        does = f"{where} {name}, whose {inner.name} ({inner.type}) {why}"
        if not crossed.returned:
            return Judgement(Verdict.STATISTIC, does)
        start = [op.outputs[k] for k in crossed.returned]
        reader, merged, _ = _flows_back(analysis, op, tower_of, skip, budget, start)
        if reader is _BEYOND_BUDGET:
            return Judgement(Verdict.STATISTIC, does, f"; {_BEYOND_BUDGET_WHY % budget}")
        if reader is None:
            if merged is not None:
                return Judgement(Verdict.SYNCHRONIZED, does, f"; {merged.name} combines it with the other towers'")
            return Judgement(Verdict.TERMINAL, does, "; it reaches no tensor that carries the batch into the model")
        return Judgement(Verdict.STATISTIC, does, f", and {reader.name} reads it back into the examples")
    how = crossed.how.described
    if crossed.how is Crossing.KERNEL:
        if any(not is_backward(c) for c in op.outputs[0].consumers()):
            return Judgement(Verdict.STATISTIC, how)
        return Judgement(Verdict.TERMINAL, how + ", but nothing reads its output")
    reader, merged, returned = _flows_back(analysis, op, tower_of, skip, budget)
    if reader is _BEYOND_BUDGET:
        return Judgement(Verdict.STATISTIC, how, f"; {_BEYOND_BUDGET_WHY % budget}")
    if reader is None:
        if merged is not None:
            return Judgement(Verdict.SYNCHRONIZED, how, f"; {merged.name} combines it with the other towers'")
        if returned is _UNDIFFERENTIATED and crossed.how is Crossing.REDUCE and not crossed.partial:
            return Judgement(Verdict.UNDECIDED, how, "; its value is read back into the examples, which reach no "
                             "variable, and the graph has no gradients yet to tell whether they reach the loss")
        if returned not in (None, _UNDIFFERENTIATED) and crossed.how is Crossing.REDUCE and not crossed.partial:
            # a batch norm at the model's end (normalize → pool → output): no variable after it, but
            # the examples it normalizes are differentiated; one device normalizes with the whole batch
            return Judgement(Verdict.STATISTIC, how, f", and {returned.name} reads it back into the examples the "
                             "gradients are taken of")
        return Judgement(Verdict.TERMINAL, how, "; its value reaches no tensor that carries the batch into the "
                         "model (a loss, a metric, a summary, a variable update)")
    if crossed.partial:
        return Judgement(Verdict.GHOST, f"{how} only in part (a reshape split the batch: virtual batches)",
                         f"; {reader.name} reads it")
    if crossed.how is Crossing.ORDER:
        return Judgement(Verdict.ORDER, how, f", and {reader.name} reads it back into the examples")
    return Judgement(Verdict.STATISTIC, how, f", and {reader.name} reads it back into the examples")


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


def _is_merge(op, tower_of, depth: int = 64) -> bool:
    if op.type.startswith(_MERGES) or _is_view(op):
        return True
    if tower_of is None or len(op.inputs) < 2:
        return False
    towers = {tower_of(t.op) for t in op.inputs} - {None}
    return len(towers) >= 2 or bool(towers) and depth > 0 and _continues_a_merge(op, tower_of, depth)


def _continues_a_merge(op, tower_of, depth: int) -> bool:
    """Whether `op` adds one more tower's value to a merge of the others': a sum in tower order,
    ((v0 + v1) + v2) + … (graphsync/graph/fast_ops.py sum_in_order), whose later adds each read
    one tower and the add before them."""
    return any(t.op.type == op.type and _is_merge(t.op, tower_of, depth - 1) for t in op.inputs)


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
