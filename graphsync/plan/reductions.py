"""Batch statistics the rule finds (graphsync/plan/rule.py) and no form of graphsync/match/ covers,
planned as reduction layers (LayerForm.REDUCTION): a `Sum` or `Mean` over all of a tower's batch axes, whose value
flows back into the model, becomes the sum over every tower's `Sum` (a `Mean`: divided by every
tower's count), a `Max` or `Min` the extremum over every tower's, forward and backward
(graphsync/splice/reduction.py).

The same reduction is paired across towers as batch norms are, by its name without the tower
prefix (graphsync/towers/names.py). A reduction that cannot be synchronized this way keeps its
verdict "refused": `Prod` and the other reductions, contractions (MatMul over the
batch), reductions over computed axes or of unknown rank, integer or half-precision ones,
reductions under control flow (in a v1 loop's frame, found by structure), one some tower lacks
or spells differently, and one that a value depending on the tower's share of the batch meets (its
own batch size, a shift taken from one of its examples: graphsync/plan/tower_dependent.py), which
its verdict then names.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync import match
from graphsync.batch_axis.findings import Crossing
from graphsync.batch_axis import Verdict
from graphsync.errors import GraphsyncError
from graphsync.graph import tf_private
from graphsync.match.layer_form import LayerForm
from graphsync.match.reductions import const_axes
from graphsync.plan import tower_dependent
from graphsync.plan.data import LayerPlan, ReductionGrad, Site, check_gradient_calls
from graphsync.stats import Layout
from graphsync.towers import names as tower_names
from graphsync.towers.scopes import tower_of

TYPES = ("Sum", "Mean", "Max", "Min")
EXTREMA = ("Max", "Min")
_DTYPES = (tf.float32, tf.float64)


def layer_plans(graph: tf.Graph, rows, analysis, towers, processes: bool = False) -> tuple[list[LayerPlan], dict]:
    """(One LayerPlan per reduction refused in `rows` (rule.verdicts) that every tower of `towers`
    computes alike and that can be synchronized; {op name: why} for those a value depending on the
    tower's share of the batch meets (plan/tower_dependent.py)). The others stay refused. Between
    worker processes (`processes`) a single tower has peers: the other workers'."""
    ops = [graph.get_operation_by_name(r.op) for r in rows if r.verdict is Verdict.REFUSED and r.type in TYPES]
    frames = loop_frames(graph) if ops else frozenset()
    ops = [op for op in ops if synchronizable(op, analysis) and op not in frames]
    dependent = {op.name: why for op in ops if (why := tower_dependent.reason(op, analysis))}
    ops = [op for op in ops if op.name not in dependent]
    if not ops or (len(towers) < 2 and not processes):
        return [], dependent
    per_tower: dict = {}
    for op in ops:
        tower = tower_of(op.name, towers)
        if tower is not None:
            per_tower.setdefault(tower, []).append((op.name[len(tower.prefix):], tf_private.creation_order(op), op))
    scopes = match.gradient_scopes(graph)
    layers = []
    for name, by_tower in sorted(tower_names.pair_by_name(per_tower).items()):
        if any(t not in by_tower for t in towers):
            continue   # a tower lacks it: refused, by its name
        sites = [(t, by_tower[t]) for t in towers]
        if len({_signature(op) for _, op in sites}) > 1:
            continue   # spelled differently in some tower: refused
        layer = _layer_plan(name, sites, scopes)
        if layer is not None:
            layers.append(layer)
    return layers, dependent


def synchronizable(op: tf.Operation, analysis) -> bool:
    """Whether the splice can synchronize `op`: a full reduction over the batch (not ghost), of a
    float32/64 tensor of known rank over constant axes, outside control flow."""
    crossed = analysis.cross.get(op)
    if crossed is None or crossed.how is not Crossing.REDUCE or crossed.partial or op.type not in TYPES:
        return False
    x = op.inputs[0]
    if x.dtype.base_dtype not in _DTYPES or x.shape.rank is None or x.shape.rank == 0:
        return False
    axes = const_axes(op.inputs[1], x.shape.rank)
    return bool(axes) and tf_private.control_flow_context(op) is None


def loop_frames(graph: tf.Graph) -> frozenset:
    """The ops inside a control flow v1 loop's frame, by structure: downstream of an Enter, up to
    the loop's Exits (the Python-side contexts tf_private.control_flow_context reads are gone from
    an imported graph). A reduction there runs once per iteration: not synchronized."""
    stack = [op for op in graph.get_operations() if op.type in ("Enter", "RefEnter")]
    inside = set(stack)
    while stack:
        for t in stack.pop().outputs:
            for reader in t.consumers():
                if reader not in inside and reader.type not in ("Exit", "RefExit"):
                    inside.add(reader)
                    stack.append(reader)
    return frozenset(inside)


def _signature(op: tf.Operation) -> tuple:
    x = op.inputs[0]
    return (op.type, x.dtype.name, x.shape.rank, const_axes(op.inputs[1], x.shape.rank),
            bool(op.get_attr("keep_dims")))


def _layer_plan(name: str, sites, scopes) -> LayerPlan | None:
    first = sites[0][1]
    rank = first.inputs[0].shape.rank
    grads = [_grads(op, scopes) for _, op in sites]
    if any(g is None for g in grads):
        return None   # a Max/Min gradient whose count of ties cannot be found: refused
    planned = tuple(Site(t, op, tuple(g)) for (t, op), g in zip(sites, grads))
    check_gradient_calls(f"reduction {name!r} ({first.name})", planned)
    return LayerPlan(name, LayerForm.REDUCTION, planned, Layout(rank, const_axes(first.inputs[1], rank)), 0.0, 1.0)


def _grads(op: tf.Operation, scopes) -> list[ReductionGrad] | None:
    """The gradient calls through `op`, by the scopes tf.gradients names after it (None: a Max or
    Min whose gradient function does not count its ties as TensorFlow's does)."""
    grads = []
    for call, ops in sorted(scopes.get(op.name, {}).items()):
        entry = match.gradient_entry(ops, list(op.inputs) + list(op.outputs))
        if entry is None:
            raise GraphsyncError(f"cannot tell which tensor is the incoming gradient of {op.name} in {call}/: "
                                 "rewrite before building the gradients")
        readers = tuple(o for o in ops if any(t is entry for t in o.inputs))
        if op.type in EXTREMA:
            ties = _ties(ops)
            if ties is None:
                return None
            grads.append(ReductionGrad(call, entry, readers, ties, tuple(c for c in ties.consumers() if c in ops)))
        else:
            grads.append(ReductionGrad(call, entry, readers))
    return grads


def _ties(ops) -> tf.Tensor | None:
    """In the ops of a Max or Min gradient function, the number of elements equal to the extremum
    it divides by: Sum(Cast(Equal(y, x))), reshaped to the kept dimensions."""
    members = set(ops)
    for op in ops:
        if op.type == "Sum" and op.inputs[0].op.type == "Cast" and op.inputs[0].op.inputs[0].op.type == "Equal":
            reshaped = [c for c in op.outputs[0].consumers() if c in members and c.type == "Reshape"]
            return reshaped[0].outputs[0] if len(reshaped) == 1 else op.outputs[0]
    return None
