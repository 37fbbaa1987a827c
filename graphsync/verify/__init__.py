"""`verify`: proves on the user's own graph, without a single-device model, that its towers share
batch statistics.

With synchronized statistics every example's contribution is independent of the tower it sits in,
so moving examples between towers (keeping every tower's size) leaves the sum of the tower losses,
the gradients the optimizer applies and the moving-statistics updates unchanged, up to float
rounding. With per-tower statistics each of them changes, typically by 1e-2 or more. `verify` feeds
random examples twice, as drawn and exchanged across towers, from the same variable values, and
compares. From the first run's step statistics it also reports which per-tower batch-norm ops still
execute (after a rewrite: none) and the bytes each synchronized layer moves across devices.

    report = graphsync.verify("train_sync.meta", original="train.meta")
    print(report)            # the figures for both graphs; report.passed, report.reason
"""
from __future__ import annotations

import os

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.verify import data, discover, run, trace
from graphsync.verify.report import CHECKS, Figures, VerifyReport

__all__ = ["verify", "VerifyReport", "Figures", "DEFAULT_TOLERANCE"]

# float32 rounding moves these figures by ~1e-7 on small models and up to ~1e-4 on MobileNetV2 (measured:
# tests/test_verify.py); per-tower statistics move them by 1e-3 and (much) more.
DEFAULT_TOLERANCE = 1e-3


def verify(graph, *, original=None, towers=None, inputs=None, loss=None, num_classes=None, feeds=None,
           batch_size=None, group_size=None, seed=0, tolerance=DEFAULT_TOLERANCE, tags=None) -> VerifyReport:
    """Checks that exchanging examples between the towers of `graph` changes nothing.

    graph, original:  a tf.Graph, a path to a saved graph (GraphDef, MetaGraphDef, SavedModel
                      directory; `tags` picks the SavedModel's meta graph) or a `graphsync.io.LoadedGraph`.
                      `original`, the graph before the rewrite, gets the same data, the same
                      variable values (matched by name) and is reported next to `graph`.
    towers:           as for rewrite_towers (None: discover tower_0/, tower0/, clone_0/, replica_1/…).
    inputs:           names of the tensors to feed with examples (relative to a tower, or one tower's
                      tensor, for per-tower inputs; any tensor can be fed). Default: the placeholders
                      in the towers that the loss and gradients depend on.
    loss:             the loss tensor's name (per tower, or one global loss). Default: the `losses`
                      collection, else a float scalar named total_loss, loss or *_loss in every tower.
    num_classes:      range of integer inputs (default: inferred from what reads them, e.g. the logits).
    feeds:            {tensor name: value} for other tensors, fed unchanged in both runs.
    batch_size:       examples per tower (default: what the graph fixes, else 4).
    group_size:       towers synchronized in consecutive groups of this size (as for rewrite_towers):
                      examples are exchanged within groups only.
    seed, tolerance:  the random data's seed; the largest relative change that passes.

    Returns a VerifyReport (`passed`, `reason`, figures); raises GraphsyncError when the graph
    cannot be run or its inputs or loss cannot be found.
    """
    label, source_graph, collection = _source(graph, tags)
    working, devices, cpus = run.on_cpus(source_graph)
    subject = discover.discover(working, towers=towers, inputs=inputs, loss=loss, num_classes=num_classes,
                                feeds=feeds, losses_collection=collection)
    batch = data.draw(subject.inputs, len(subject.towers), batch_size, seed, group_size)
    runs = run.run_twice(subject, batch, cpus)
    figures = _figures(subject, runs)

    original_figures = None
    if original is not None:
        _, original_graph, original_collection = _source(original, tags)
        original_working, _, original_cpus = run.on_cpus(original_graph)
        original_subject = discover.discover(
            original_working, towers=towers, inputs=inputs, loss=loss, num_classes=num_classes, feeds=feeds,
            losses_collection=original_collection)
        original_runs = run.run_twice(original_subject, batch, original_cpus, runs.initial_values)
        original_figures = _figures(original_subject, original_runs)

    notes = subject.notes + batch.notes
    passed, reason = _verdict(figures, batch, tolerance)
    if original_figures is not None and passed and original_figures.largest()[1] <= tolerance:
        notes.append("the un-rewritten graph passes too: on this graph the exchange cannot tell "
                     "synchronized from per-tower statistics")
    return VerifyReport(
        graph=label, towers=[t.label for t in subject.towers], inputs=[_describe(i, batch) for i in subject.inputs],
        loss=subject.loss, loss_source=subject.loss_source, examples=batch.examples,
        per_tower=batch.per_tower, moved=batch.moved, seed=seed, tolerance=tolerance, rewritten=figures,
        original=original_figures, passed=passed, reason=reason, group_size=group_size, devices=devices,
        notes=notes)


def _source(graph, tags):
    """(label, tf.Graph, names in its `losses` collection) for a graph, a path or a LoadedGraph."""
    from graphsync import io  # noqa: PLC0415 (graphsync.io imports more than verify needs up front)

    if isinstance(graph, tf.Graph):
        collection = [t.name for t in graph.get_collection(tf.compat.v1.GraphKeys.LOSSES)
                      if isinstance(t, tf.Tensor)]
        return "graph", graph, collection
    loaded = graph if isinstance(graph, io.LoadedGraph) else io.load(os.fspath(graph), tags)
    collection = []
    meta = loaded.meta_graph
    if meta is not None and tf.compat.v1.GraphKeys.LOSSES in meta.collection_def:
        collection = list(meta.collection_def[tf.compat.v1.GraphKeys.LOSSES].node_list.value)
    return loaded.path, loaded.graph, collection


def _figures(subject, runs) -> Figures:
    drawn, exchanged = runs.drawn, runs.exchanged
    loss = run.relative_change([sum(float(v) for v in drawn.loss)], [sum(float(v) for v in exchanged.loss)]) \
        if drawn.loss else None
    ran = trace.executed(runs.metadata)
    traffic, other = trace.traffic(runs.metadata, subject.layers, subject.towers)
    return Figures(
        loss=loss, gradients=run.relative_change(drawn.gradients, exchanged.gradients),
        updates=run.relative_change(drawn.updates, exchanged.updates),
        counts={"loss": len(subject.loss), "gradients": len(subject.gradients), "updates": len(subject.updates)},
        batch_norm_running=[name for name in subject.batch_norm_ops if name in ran],
        batch_norm_ops=len(subject.batch_norm_ops), layers=subject.layers, traffic=traffic, other_bytes=other)


def _verdict(figures: Figures, batch, tolerance: float) -> tuple[bool, str]:
    check, change = figures.largest()
    what = dict(CHECKS)[check]
    moved = f"moving {batch.moved} of {batch.examples} examples to other towers"
    if change == float("inf"):
        return False, f"the graph computes non-finite {what} (NaN or infinity)"
    if change > tolerance:
        hint = "" if figures.layers else "; the graph has no synchronized layer: rewrite it with graphsync first"
        return False, (f"not synchronized: {moved} changes the {what} by {change:.1e} "
                       f"(tolerance {tolerance:.0e}){hint}")
    if figures.batch_norm_running:
        return False, (f"{len(figures.batch_norm_running)} per-tower batch-norm ops still run each step "
                       f"(e.g. {figures.batch_norm_running[0]}): something still reads them")
    if not figures.layers and not figures.batch_norm_ops:
        return True, f"{moved} changes nothing (largest change {change:.1e}); the towers have no batch norm"
    return True, (f"synchronized: {moved} changes nothing beyond float rounding "
                  f"(largest change {change:.1e}, tolerance {tolerance:.0e})")


def _describe(item, batch) -> dict:
    """One input as the report shows it: the shape fed to each tensor."""
    per_example = [data.UNKNOWN_DIM if d is None else d for d in item.example_shape]
    examples = batch.per_tower if item.kind == "per_tower" else batch.examples
    shape = per_example if item.kind == "fixed" else [examples] + per_example
    value = item.value.tolist() if item.kind == "fixed" and hasattr(item.value, "tolist") else None
    return {"name": item.label, "kind": item.kind, "dtype": item.dtype.name,
            "shape": "[" + ", ".join(str(d) for d in shape) + "]",
            "classes": item.classes, "classes_from": item.classes_from, "value": value}
