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

import numpy as np
import tensorflow as tf

from graphsync.verification import data, discovery, run, trace
from graphsync.verification.report import CHECKS, Figures, VerifyReport

__all__ = ["verify", "VerifyReport", "Figures", "DEFAULT_TOLERANCE"]

# float32 rounding moves these figures by ~1e-7 on small models and up to ~1e-4 on MobileNetV2 (measured:
# tests/test_verify.py); per-tower statistics move them by 1e-3 and (much) more.
DEFAULT_TOLERANCE = 1e-3
ROUNDING_RUNS = 3       # exchanges and reorderings when a change exceeds the tolerance
ROUNDING_FACTOR = 10    # a change passes when within this factor of what reordering inside the towers changes…
ROUNDING_CAP = 0.1      # …up to this: per-tower statistics change the figures by 0.5 and more
ROUNDING_FLOOR = 1.2e-7  # float32's epsilon: reordering may happen to change a figure by exactly 0 (e.g. the
                         # loss when the statistics are accurate); one rounding step is still rounding


def verify(graph, *, original=None, towers=None, inputs=None, loss=None, num_classes=None, feeds=None,
           batch_size=None, group_size=None, seed=0, tolerance=DEFAULT_TOLERANCE, tags=None) -> VerifyReport:
    """Checks that exchanging examples between the towers of `graph` changes nothing.

    graph, original:  a tf.Graph, a path to a saved graph (GraphDef, MetaGraphDef, SavedModel
                      directory; `tags` picks the SavedModel's meta graph) or a `graphsync.io.LoadedGraph`.
                      `original`, the graph before the rewrite, gets the same data, the same
                      variable values (matched by name) and is reported next to `graph`.
    towers:           as for rewrite_towers (None: discover tower_0/, tower0/, clone_0/, replica_1/…).
    inputs:           names of the tensors to feed with examples (relative to a tower, or one tower's
                      tensor, for per-tower inputs; any tensor can be fed). Default: what carries each
                      tower's examples, found by structure (placeholders, a whole batch split into
                      the towers, iterators, queues, staging areas, random inputs made in the towers;
                      see graphsync.verification.discovery).
    loss:             the loss tensor's name (per tower, or one global loss). Default: the `losses`
                      collection, else a float scalar named total_loss, loss or *_loss in every tower.
    num_classes:      range of integer inputs (default: inferred from what reads them, e.g. the logits).
    feeds:            {tensor name: value} for other tensors, fed unchanged in both runs.
    batch_size:       examples per tower, one number or one per tower (default: what the graph
                      fixes, else 4).
    group_size:       towers synchronized in consecutive groups of this size (as for rewrite_towers):
                      examples are exchanged within groups only.
    seed, tolerance:  the random data's seed; the largest relative change that passes.

    Returns a VerifyReport (`passed`, `reason`, figures); raises GraphsyncError when the graph
    cannot be run or its inputs or loss cannot be found.
    """
    label, source_graph, collection = _source(graph, tags)
    working, devices, cpus = run.on_cpus(source_graph)
    subject = discovery.discover(working, towers=towers, inputs=inputs, loss=loss, num_classes=num_classes,
                                feeds=feeds, losses_collection=collection)
    batch = data.draw(subject.inputs, len(subject.towers), batch_size, seed, group_size)
    with run.Runner(subject, batch, cpus) as runner:
        drawn = runner.run(trace=True)
        figures = _figures(subject, drawn, [runner.run(batch.permutation)], runner.metadata)
        if figures.largest()[1] > tolerance:
            _measure_rounding(runner, batch, drawn, figures)
        initial_values = runner.initial_values

    original_figures = None
    if original is not None:
        _, original_graph, original_collection = _source(original, tags)
        original_working, _, original_cpus = run.on_cpus(original_graph)
        original_subject = discovery.discover(
            original_working, towers=towers, inputs=inputs, loss=loss, num_classes=num_classes, feeds=feeds,
            losses_collection=original_collection)
        with run.Runner(original_subject, batch, original_cpus, initial_values) as runner:
            original_drawn = runner.run(trace=True)
            original_figures = _figures(original_subject, original_drawn, [runner.run(batch.permutation)],
                                        runner.metadata)

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


def _changes(drawn, others) -> dict:
    """check → the median over `others` of its relative change from `drawn` (None: nothing to compare)."""
    changes = {}
    for check, _ in CHECKS:
        if check == "loss":
            total = lambda fetched: [sum(float(np.sum(v)) for v in fetched.loss)]  # noqa: E731
            values = [run.relative_change(total(drawn), total(o)) for o in others] if drawn.loss else [None]
        else:
            values = [run.relative_change(getattr(drawn, check), getattr(o, check)) for o in others]
        changes[check] = None if values[0] is None else float(np.median(values))
    return changes


def _figures(subject, drawn, exchanged: list, metadata) -> Figures:
    ran = trace.executed(metadata)
    traffic, other = trace.traffic(metadata, subject.layers, subject.towers)
    return Figures(
        **_changes(drawn, exchanged),
        counts={"loss": len(subject.loss), "gradients": len(subject.gradients), "updates": len(subject.updates)},
        batch_norm_running=[name for name in subject.batch_norm_ops if name in ran],
        batch_norm_ops=len(subject.batch_norm_ops), layers=subject.layers, traffic=traffic, other_bytes=other)


def _measure_rounding(runner, batch, drawn, figures: Figures) -> None:
    """When a change exceeds the tolerance: is it float rounding? Some models amplify rounding
    enormously in their backward pass (deep batch-norm nets at initialization, tiny batches:
    reordering the examples *inside* each tower, which changes no statistic, then moves their
    gradients by up to 1e-1). The figures become the medians over ROUNDING_RUNS exchanges, each
    compared with the median over ROUNDING_RUNS reorderings inside the towers."""
    exchanged = [runner.run(batch.permutation)] + [runner.run(p) for p in batch.other_exchanges(ROUNDING_RUNS - 1)]
    reordered = [runner.run(p) for p in batch.reorders(ROUNDING_RUNS)]
    for check, value in _changes(drawn, exchanged).items():
        setattr(figures, check, value)
    figures.rounding = _changes(drawn, reordered)
    figures.exchanges = ROUNDING_RUNS


def _limit(figures: Figures, check: str, tolerance: float) -> float:
    """The largest change of `check` that passes: the tolerance, or ROUNDING_FACTOR times what
    reordering inside the towers changes (up to ROUNDING_CAP)."""
    rounding = (figures.rounding or {}).get(check)
    if rounding is None:
        return tolerance
    return max(tolerance, min(ROUNDING_FACTOR * max(rounding, ROUNDING_FLOOR), ROUNDING_CAP))


def _verdict(figures: Figures, batch, tolerance: float) -> tuple[bool, str]:
    moved = f"moving {batch.moved} of {batch.examples} examples to other towers"
    checks = [(c, getattr(figures, c)) for c, _ in CHECKS if getattr(figures, c) is not None]
    for check, change in checks:
        if change == float("inf"):
            return False, f"the graph computes non-finite {dict(CHECKS)[check]} (NaN or infinity)"
    failing = [(check, change) for check, change in checks if change > _limit(figures, check, tolerance)]
    if failing:
        check, change = max(failing, key=lambda item: item[1])
        rounding = (figures.rounding or {}).get(check)
        hint = "" if figures.layers else "; it has no synchronized layer: rewrite it first"
        if rounding is not None and ROUNDING_FACTOR * rounding > ROUNDING_CAP:
            return False, (f"inconclusive: {moved} changes the {dict(CHECKS)[check]} by {change:.1e}, but reordering "
                           f"examples inside their towers already changes them by {rounding:.1e} (float rounding, "
                           "amplified by this model): try --batch-size 16 or trained weights")
        scale = f"float rounding: {rounding:.1e}" if rounding is not None else f"tolerance {tolerance:.0e}"
        return False, f"not synchronized: {moved} changes the {dict(CHECKS)[check]} by {change:.1e} ({scale}){hint}"
    if figures.batch_norm_running:
        return False, (f"{len(figures.batch_norm_running)} per-tower batch-norm ops still run each step "
                       f"(e.g. {figures.batch_norm_running[0]}): something still reads them")
    check, change = figures.largest()
    if not figures.layers and not figures.batch_norm_ops:
        return True, f"{moved} changes nothing (largest change {change:.1e}); the towers have no batch norm"
    if change > tolerance:
        return True, (f"synchronized: {moved} changes the {dict(CHECKS)[check]} by {change:.1e} (median of "
                      f"{figures.exchanges}), as much as float rounding does here (reordering examples inside "
                      f"their towers: {figures.rounding[check]:.1e})")
    return True, (f"synchronized: {moved} changes nothing beyond float rounding "
                  f"(largest change {change:.1e}, tolerance {tolerance:.0e})")


def _describe(item, batch) -> dict:
    """One input as the report shows it: the shape fed to each tensor, and where it was found."""
    per_example = [data.UNKNOWN_DIM if d is None else d for d in item.example_shape]
    sizes = "|".join(str(n) for n in sorted(set(batch.sizes), key=batch.sizes.index))
    examples = sizes if item.kind == "per_tower" else batch.examples
    shape = per_example if item.kind == "fixed" else [examples] + per_example
    value = item.value.tolist() if item.kind == "fixed" and hasattr(item.value, "tolist") else None
    return {"name": item.label, "kind": item.kind, "dtype": item.dtype.name,
            "shape": "[" + ", ".join(str(d) for d in shape) + "]",
            "classes": item.classes, "classes_from": item.classes_from, "value": value, "origin": item.origin}
