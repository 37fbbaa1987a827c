"""`verify`: proves on the user's own graph, without a single-device model, that its towers share
batch statistics.

With synchronized statistics every example's contribution is independent of the tower it sits in,
so moving examples between towers (keeping every tower's size) leaves the sum of the tower losses,
the gradients the optimizer applies and the moving-statistics updates unchanged, up to float
rounding. With per-tower statistics each of them changes, typically by 1e-2 or more. `verify` feeds
random examples twice, as drawn and exchanged across towers, from the same variable values, and
compares. That holds only where the towers compute one function and the writes compared are
statistics of the batch: a replicated trainer's per-tower variable copies start as the main
tower's (as the trainer copies them before its first step), and writes fed by one tower's scalars
(moving summaries of its loss) are compared apart, not judged. From the first run's step
statistics it also reports which per-tower batch-norm ops still execute (after a rewrite: none)
and the bytes each synchronized layer moves across devices.

The flow: sources.load → run.on_cpus → discovery.discover (inputs, loss, gradients, updates) →
data.draw (the examples and their exchange) → run.Runner → verdict (changes, rounding, reason) →
findings.VerifyReport.

    report = graphsync.verify("train_sync.meta", original="train.meta")
    print(report)            # the figures for both graphs; report.passed, report.outcome, report.reason
"""
from __future__ import annotations

from graphsync.verification import data, discovery, run, side_effects, sources, verdict
from graphsync.verification.findings import Figures, Outcome, VerifyReport
from graphsync.verification.verdict import DEFAULT_TOLERANCE

__all__ = ["verify", "VerifyReport", "Outcome", "Figures", "DEFAULT_TOLERANCE"]


def verify(graph, *, original=None, towers=None, inputs=None, loss=None, num_classes=None, feeds=None,
           batch_size=None, group_size=None, seed=0, tolerance=DEFAULT_TOLERANCE, tags=None,
           allow_side_effects=False) -> VerifyReport:
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
                      collection, else what tf.gradients differentiates, else a float scalar named
                      total_loss, loss or *_loss in every tower: the first that depends on the examples.
    num_classes:      range of integer inputs (default: inferred from what reads them, e.g. the logits).
    feeds:            {tensor name: value} for other tensors, fed unchanged in both runs.
    batch_size:       examples per tower, one number or one per tower (default: what the graph
                      fixes, else 4).
    group_size:       towers synchronized in consecutive groups of this size (as for rewrite_towers):
                      examples are exchanged within groups only.
    seed, tolerance:  the random data's seed; the largest relative change that passes.
    allow_side_effects: run graphs that reach outside this process (read or write files, open
                      connections, call Python: see side_effects.py); refused by default, before
                      anything runs, and listed in the report's notes when allowed.

    Returns a VerifyReport (`outcome`: pass, fail or inconclusive; `passed`, `reason`, figures); raises GraphsyncError when the graph
    cannot be run or its inputs or loss cannot be found.
    """
    label, source_graph, collection = sources.load(graph, tags)
    subject, cpus, devices = _discovered(source_graph, collection, towers, inputs, loss, num_classes, feeds)
    reaching = [side_effects.check(subject, allow_side_effects)]
    original_subject = None
    if original is not None:   # both graphs are checked before either runs
        _, original_graph, original_collection = sources.load(original, tags)
        original_subject, original_cpus, _ = _discovered(original_graph, original_collection, towers, inputs, loss,
                                                         num_classes, feeds)
        reaching.append(side_effects.check(original_subject, allow_side_effects, "the original graph"))
    batch = data.draw(subject.inputs, len(subject.towers), batch_size, seed, group_size)
    with run.Runner(subject, batch, cpus) as runner:
        drawn = runner.run(trace=True)
        figures = verdict.figures_of(subject, drawn, [runner.run(batch.permutation)],
                                     [runner.run(batch.reorders(1)[0])], runner.metadata)
        if verdict.needs_rounding(figures, tolerance):
            verdict.measure_rounding(runner, batch, drawn, figures, subject)
        initial_values = runner.initial_values

    original_figures = None
    if original_subject is not None:
        with run.Runner(original_subject, batch, original_cpus, initial_values) as runner:
            original_drawn = runner.run(trace=True)
            original_figures = verdict.figures_of(original_subject, original_drawn, [runner.run(batch.permutation)],
                                                  [runner.run(batch.reorders(1)[0])], runner.metadata)

    notes = subject.notes + batch.notes + [note for note in reaching if note]
    outcome, reason = verdict.verdict(figures, batch, tolerance, fixed_batch=batch.fixed)
    if original_figures is not None and outcome is Outcome.PASS and original_figures.largest()[1] <= tolerance:
        notes.append("the un-rewritten graph passes too: on this graph the exchange cannot tell "
                     "synchronized from per-tower statistics")
    return VerifyReport(
        graph=label, towers=[t.label for t in subject.towers],
        inputs=[sources.describe(i, batch) for i in subject.inputs],
        loss=subject.loss, loss_source=subject.loss_source, examples=batch.examples,
        per_tower=batch.per_tower, moved=batch.moved, seed=seed, tolerance=tolerance, rewritten=figures,
        original=original_figures, outcome=outcome, reason=reason, group_size=group_size, devices=devices,
        notes=notes, copies=subject.copies.describe())


def _discovered(source_graph, collection, towers, inputs, loss, num_classes, feeds):
    """(what verify runs in the graph, the CPUs to run it on, the devices it maps to them)."""
    working, devices, cpus = run.on_cpus(source_graph)
    subject = discovery.discover(working, towers=towers, inputs=inputs, loss=loss, num_classes=num_classes,
                                 feeds=feeds, losses_collection=collection)
    return subject, cpus, devices
