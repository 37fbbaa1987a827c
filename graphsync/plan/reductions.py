"""Batch statistics the rule finds (graphsync/plan/rule.py) and no form of graphsync/match/ covers,
planned as "reduction" layers: a `Sum` or `Mean` over all of a tower's batch axes, whose value
flows back into the model, becomes the sum over every tower's `Sum` (a `Mean`: divided by every
tower's count), forward and backward (graphsync/splice/reduction.py).

The same reduction is paired across towers as batch norms are, by its name without the tower
prefix (graphsync/towers/names.py). A reduction that cannot be synchronized this way keeps its
verdict "refused": `Max`, `Min`, `Prod` and the other reductions, contractions (MatMul over the
batch), reductions over computed axes or of unknown rank, integer or half-precision ones,
reductions under control flow, and one some tower lacks or spells differently.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync import match
from graphsync.errors import GraphsyncError
from graphsync.graph import tf_private
from graphsync.match.reductions import const_axes
from graphsync.plan.data import LayerPlan, ReductionGrad, Site
from graphsync.stats import Layout
from graphsync.towers import names as tower_names
from graphsync.towers.scopes import tower_of

TYPES = ("Sum", "Mean")
_DTYPES = (tf.float32, tf.float64)


def layer_plans(graph: tf.Graph, rows, analysis, towers) -> list[LayerPlan]:
    """One LayerPlan per reduction refused in `rows` (rule.verdicts) that every tower of `towers`
    computes alike and that can be synchronized; the others stay refused."""
    ops = [graph.get_operation_by_name(r.op) for r in rows if r.verdict == "refused" and r.type in TYPES]
    ops = [op for op in ops if synchronizable(op, analysis)]
    if not ops or len(towers) < 2:
        return []
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
        layers.append(_layer_plan(name, sites, scopes))
    return layers


def synchronizable(op: tf.Operation, analysis) -> bool:
    """Whether the splice can synchronize `op`: a full reduction over the batch (not ghost), of a
    float32/64 tensor of known rank over constant axes, outside control flow."""
    crossed = analysis.cross.get(op)
    if crossed is None or crossed.how != "reduce" or crossed.partial or op.type not in TYPES:
        return False
    x = op.inputs[0]
    if x.dtype.base_dtype not in _DTYPES or x.shape.rank is None or x.shape.rank == 0:
        return False
    axes = const_axes(op.inputs[1], x.shape.rank)
    return bool(axes) and tf_private.control_flow_context(op) is None


def _signature(op: tf.Operation) -> tuple:
    x = op.inputs[0]
    return (op.type, x.dtype.name, x.shape.rank, const_axes(op.inputs[1], x.shape.rank),
            bool(op.get_attr("keep_dims")))


def _layer_plan(name: str, sites, scopes) -> LayerPlan:
    first = sites[0][1]
    rank = first.inputs[0].shape.rank
    planned = tuple(Site(t, op, tuple(_grads(op, scopes))) for t, op in sites)
    counts = {s.tower.label: len(s.grad_ops) for s in planned}
    if len(set(counts.values())) > 1:
        raise GraphsyncError(
            f"reduction {name!r} ({first.name}) has a different number of gradient calls per tower ({counts}): "
            "build gradients for every tower, or rewrite before building them")
    return LayerPlan(name, "reduction", planned, Layout(rank, const_axes(first.inputs[1], rank)), 0.0, 1.0)


def _grads(op: tf.Operation, scopes) -> list[ReductionGrad]:
    """The gradient calls through `op`, by the scopes tf.gradients names after it."""
    grads = []
    for call, ops in sorted(scopes.get(op.name, {}).items()):
        entry = match.gradient_entry(ops, list(op.inputs) + list(op.outputs))
        if entry is None:
            raise GraphsyncError(f"cannot tell which tensor is the incoming gradient of {op.name} in {call}/: "
                                 "rewrite before building the gradients")
        grads.append(ReductionGrad(call, entry, tuple(o for o in ops if any(t is entry for t in o.inputs))))
    return grads
