"""A plan that synchronizes nothing, in towers that hold batch statistics, is a refusal, not a success.

Every other refusal comes from the batch axis's verdicts (plan/rule.py). This one asks the graph
again, more plainly: does any tower still normalize its examples with statistics of its own batch?
A report of 0 layers then means graphsync missed them (a backward misjudged, a form it does not
know), and the step would train per tower without a word. It is a success only for graphs with no
batch statistic at all.

A batch statistic here is a forward op of a tower that is either a fused batch norm in training
mode read by the forward, or a reduction over the batch axis (axis 0) whose value is read back
into the examples it reduced: an op that reads it, through reshapes and the like, and also reads
the reduced tensor (x − mean, SquaredDifference(x, mean), x · rsqrt(var)). Ghost batch norms and
the forms graphsync keeps per tower on purpose are said elsewhere (Plan.kept_per_tower) and do not
count, nor do the ones a merge across towers already combines (a graph rewritten before).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.batch_axis import Verdict
from graphsync.errors import GraphsyncError
from graphsync.graph.backward import is_backward
from graphsync.graph.op_types import FUSED_BATCH_NORM_TYPES
from graphsync.match.fused import made_by_graphsync
from graphsync.towers.scopes import tower_of

_FUSED = frozenset(FUSED_BATCH_NORM_TYPES)
_REDUCTIONS = frozenset({"Mean", "Sum"})
_PASSING = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Cast", "Snapshot"})
_LEFT_ON_PURPOSE = (Verdict.GHOST, Verdict.PER_TOWER, Verdict.SYNCHRONIZED)


def refuse(graph: tf.Graph, plan) -> None:
    """Raises GraphsyncError in one line when `plan` synchronizes no layer while two or more of its
    towers (or a worker of a process group) hold batch statistics."""
    if plan.layers or (len(plan.towers) < 2 and not plan.across_processes):
        return
    said = {row.op for row in plan.cross_example if row.verdict in _LEFT_ON_PURPOSE} | \
        {op for op, _ in plan.kept_per_tower}
    found = [op for op in graph.get_operations()
             if op.name not in said and _is_batch_statistic(op) and tower_of(op.name, plan.towers) is not None]
    towers = {tower_of(op.name, plan.towers).label for op in found}
    if not found or (len(towers) < 2 and not plan.across_processes):
        return
    why = dict(plan.skipped).get(found[0].name) or next(
        (row.why for row in plan.cross_example if row.op == found[0].name), None) or \
        "no batch-norm form graphsync knows reads it"
    raise GraphsyncError(f"{found[0].name} ({found[0].type}) normalizes with its tower's own batch in "
                         f"{len(towers)} towers ({len(found)} such ops), but graphsync synchronizes no layer: {why}; "
                         "the step would train per tower (graphsync inspect lists every verdict)")


def _is_batch_statistic(op: tf.Operation) -> bool:
    if op.type in _FUSED:
        return bool(op.get_attr("is_training")) and not made_by_graphsync(op) and not is_backward(op) and \
            any(not is_backward(c) for c in op.outputs[0].consumers())
    if op.type not in _REDUCTIONS or not _over_batch(op) or is_backward(op):
        return False
    x = op.inputs[0]
    return any(_reads(reader, x) for reader in _readers(op.outputs[0]) if not is_backward(reader))


def _over_batch(op: tf.Operation) -> bool:
    axes = tf.get_static_value(op.inputs[1])
    if axes is None or op.inputs[0].shape.rank is None:
        return False
    rank = op.inputs[0].shape.rank
    axes = {int(a) % rank for a in (axes.ravel() if hasattr(axes, "ravel") else [axes])} if rank else set()
    return 0 in axes and len(axes) < rank   # the batch, not every axis (a loss)


def _readers(t: tf.Tensor, depth: int = 3) -> list:
    found, frontier = [], [t]
    for _ in range(depth):
        nxt = []
        for tensor in frontier:
            for c in tensor.consumers():
                (nxt.extend(c.outputs) if c.type in _PASSING else found.append(c))
        frontier = nxt
    return found


def _reads(reader: tf.Operation, x: tf.Tensor) -> bool:
    """Whether `reader` reads x itself, or through ops that pass it on."""
    for t in reader.inputs:
        while True:
            if t is x:
                return True
            if t.op.type not in _PASSING or not t.op.inputs:
                break
            t = t.op.inputs[0]
    return False
