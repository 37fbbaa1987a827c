"""The per-tower batch-norm ops (after a rewrite none of them may run) and the layers graphsync
synchronized (from its aggregation scopes or collectives)."""
from __future__ import annotations

import tensorflow as tf

from graphsync import match
from graphsync.graph import marks, order
from graphsync.graph.marks import Mark
from graphsync.graph import tf_private
from graphsync.plan.training_flag import predicate
from graphsync.match import conditional
from graphsync.towers.scopes import Tower, tower_of


def batch_norm_ops(graph: tf.Graph, towers: list[Tower]) -> list[str]:
    """Per-tower batch-norm ops that compute per-tower statistics: training-mode fused ops and
    their gradient ops, and the two Mean ops of `tf.nn.moments` over the batch axis (also once
    graphsync rerouted them: their StopGradient then reads `<mean op>_sync/…`), in the order they run;
    none graphsync made (its marks say which: graphsync/graph/marks.py)."""
    names = []
    for op in graph.get_operations():
        if op.type in match.FUSED_TYPES and match.is_training(op):
            names.append(op.name)
            names.extend(g.name for g in match.fused_gradient_ops(op))
        elif op.type == "SquaredDifference":
            names.extend(_moments_ops(graph, op))
    hidden = {}   # a conditional layer's ops, named as trace.executed names what ran inside an If
    for cand in conditional.candidates(graph):
        if cand.parts:
            hidden[f"{cand.name}/{cand.parts.node.name}"] = cand.name
            hidden.update({f"{grad.op.name}/{grad.node}": grad.op.name for grad in cand.parts.grads})
    names.extend(hidden)
    towers_own = {n for n in names if tower_of(n, towers) is not None
                  and not marks.made_by_graphsync(graph.get_operation_by_name(hidden.get(n, n)))}
    return order.sort_names(graph, towers_own, lambda name: hidden.get(name, name))


def training_flags(graph: tf.Graph, towers: list[Tower]) -> list[tf.Tensor]:
    """The placeholders that switch the towers' batch norms between training and inference (the
    predicate of a conditional batch norm's If, or of the v1 tf.cond around a fused op): verify
    must feed them True, or it would compare two inference runs."""
    flags = {}
    for cand in conditional.candidates(graph):
        if cand.parts and tower_of(cand.name, towers) is not None:
            flag = predicate(cand.op.inputs[0])
            flags[flag.name] = flag
    for op in graph.get_operations():
        if op.type in match.FUSED_TYPES and match.is_training(op) and tower_of(op.name, towers) is not None:
            pred = tf_private.cond_predicate(op)
            if pred is not None:
                flag = predicate(pred)
                flags[flag.name] = flag
    return [f for _, f in sorted(flags.items()) if f.op.type in ("Placeholder", "PlaceholderWithDefault")
            and f.shape.rank == 0]


def _moments_ops(graph: tf.Graph, sqdiff: tf.Operation) -> list[str]:
    """The Mean ops of a `tf.nn.moments` over the batch axis around this SquaredDifference(x,
    StopGradient(·)): its variance (the Mean reading it) and its mean (the Mean of x over the same
    axes), however a rewrite rewired the StopGradient."""
    x, stopped = sqdiff.inputs
    if stopped.op.type != "StopGradient":
        x, stopped = stopped, x
    if stopped.op.type != "StopGradient":
        return []
    found = []
    for variance in sqdiff.outputs[0].consumers():
        if variance.type != "Mean" or not _reduces_batch(variance):
            continue
        axes = _axes(variance)
        means = [c for c in x.consumers() if c.type == "Mean" and _axes(c) == axes
                 and c.get_attr("keep_dims") == variance.get_attr("keep_dims")]
        if means:
            found += [variance.name] + [m.name for m in means]
    return found


def _axes(op: tf.Operation):
    axes = tf.get_static_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if axes is None or not rank:
        return None
    return tuple(sorted({int(a) % rank for a in (axes.ravel() if hasattr(axes, "ravel") else [axes])}))


def _reduces_batch(op: tf.Operation) -> bool:
    axes = _axes(op)
    return axes is not None and op.inputs[0].shape.rank >= 2 and 0 in axes


def synchronized_layers(graph: tf.Graph, towers: list[Tower]) -> list[str]:
    """The layers graphsync synchronized: from the marks of their aggregation (graphsync/<layer>/…)
    or, all-reduced, of their collectives; in the order the first tower runs them (by its layer op,
    which the rewrite leaves in the graph)."""
    layers = set()
    for op in graph.get_operations():
        if marks.has(op, Mark.AGGREGATION) or op.type.startswith("Collective"):
            found = marks.exchanged(op)
            if found:
                layers.add(found[0])
    return order.sort_names(graph, layers, lambda layer: towers[0].prefix + layer)
