"""`rewrite_towers`: the options validated (RewriteOptions), then a short list of passes, each
returning its result:

    plan      tower tf.function calls inlined, then candidates → towers → pairs → every check
              (plan_with: splice/inline.py around plan/planner.py make_plan) → Plan
    exchange  how the plan's statistics cross devices (exchange/) → Gather or AllReduce
    splice    every planned layer synchronized (splice/) → Splice
    check     nothing reads an old op, and the analysis again finds no batch statistic per tower

`plan_towers` is the API's way to a plan alone; `graphsync run` (graphsync/autosync/) and
`graphsync inspect` plan through `plan_with`, the saved-file rewrite and `graphsync run` rewrite
through `rewrite_with`, each with the RewriteOptions its entry point built."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import warnings
import weakref

import tensorflow as tf

from graphsync.splice import inline
from graphsync.graph import ref_races
from graphsync.splice import layer as splice
from graphsync.splice import reduction, ref_reads, segments, shared_averages, shared_updates
from graphsync.graph import tape, tf_private
from graphsync.errors import GraphsyncError, GraphsyncWarning
from graphsync.batch_axis import Verdict
from graphsync.between_graph.process_group import ProcessGroup
from graphsync.exchange import make_exchange
from graphsync.plan.data import Plan, digest, fingerprints
from graphsync.plan import moving_updates, rule
from graphsync.plan.normalizations import normalizations
from graphsync.plan.options import Recompute, RewriteOptions, Strategy
from graphsync.plan.planner import make_plan
from graphsync.report import Backward, LayerReport, RewriteReport, SkippedReport

_rewritten_graphs = weakref.WeakSet()   # every graph rewrite_towers changed (see was_rewritten)
tape.record_always()   # a step the script traces itself is paired as under graphsync run (graph/tape.py)


def rewrite_towers(graph: tf.Graph | None = None, *, towers=None, device: str | None = None,
                   strategy: str = "gather", group_size: int | None = None,
                   process_group: ProcessGroup | None = None, recompute: bool | str = False) -> RewriteReport:
    """Makes every batch norm in every tower of `graph` use the statistics of the whole multi-tower
    batch, forward and backward, in place.

    graph:   a tf.Graph (default: the default graph), before or after its gradients are built.
    towers:  None to discover them: known scopes (tower_0/, tower_0/v0/, tower0/, clone_0/, replica_1/),
             else by structure (graphsync/towers/structure.py: index-numbered sibling scopes holding the
             same batch norms in parallel, e.g. gpu_0/, gpu_1/); a regular expression matching each
             tower's prefix, or a list of prefixes ('' = root).
    device:  where the statistics of all towers are combined (default: CPU 0 of tower 0's host).
    strategy: 'gather' (statistics merged on `device`) or 'allreduce' (one CollectiveReduceV2 per
             layer and direction on the towers' own devices; every tower must then run each step:
             fetch train_op, or anything that depends on every tower).
    group_size: synchronize within consecutive groups of this many towers (default: all towers).
    process_group: ProcessGroup(tasks, index, timeout=0) for between-graph replication (one graph
             per worker process, strategy='allreduce'); each server's config needs
             experimental.collective_group_leader. Workers whose layers differ never pair up
             (their collectives time out after `timeout` seconds, when set). A step that also
             runs ops on ps tasks synchronizes through queues there instead, with no collective
             (report.strategy "ps"; graphsync/exchange/through_ps.py). With
             ProcessGroup(…, heartbeat=SECONDS) the graph's steps are watched: a lost worker ends
             this process with status 1 and one line naming it (graphsync.between_graph.watched_steps).
    recompute: the backward reads each layer's normalized output, and the activation, scale and
             bias after it, recomputed from the synchronized statistics once it reaches the layer,
             so the forward's tensors die after the forward (less memory, the same step bit for
             bit; graphsync/splice/recompute.py), with gradients built before the rewrite or after.
             "segments": the backward reads whole forward segments — convolutions included —
             recomputed from checkpoints about √n layers apart, from the statistics the forward
             exchanged (about half the memory for one more forward; graphsync/splice/segments.py).

    Batch norm inside tf.function calls in the towers is inlined first (graphsync/splice/inline.py; the
    report lists the calls), gradient calls included, after a rehearsal on a copy of the graph.

    Raises GraphsyncError, leaving the graph untouched, when the graph cannot be rewritten.
    """
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    options = RewriteOptions.of(towers=towers, device=device, strategy=strategy, group_size=group_size,
                                process_group=process_group, recompute=recompute)   # before anything is inlined
    _refuse_finalized(graph)
    with _collector_paused(), tf_private.as_default(graph):   # once, not in each of the splice's scopes
        return _rewrite(graph, options)   # as deep below the caller as from rewrite_with: warnings' stacklevel


def rewrite_with(graph: tf.Graph, options: RewriteOptions) -> RewriteReport:
    """rewrite_towers with the options its entry point built (graphsync.io's rewrite_file,
    `graphsync run`)."""
    _refuse_finalized(graph)
    with _collector_paused(), tf_private.as_default(graph):
        return _rewrite(graph, options)


def plan_towers(graph: tf.Graph, *, towers=None, device: str | None = None, strategy: str = "gather",
                group_size: int | None = None, process_group: ProcessGroup | None = None,
                inline_calls: bool = True, recompute: bool = False, refuse: bool = True) -> tuple[Plan, list[str]]:
    """What rewrite_towers would splice, for users and tests: plan_with, the options built from
    rewrite_towers' keyword arguments."""
    options = RewriteOptions.of(towers=towers, device=device, strategy=strategy, group_size=group_size,
                                process_group=process_group, recompute=recompute)
    return plan_with(graph, options, inline_calls=inline_calls, refuse=refuse)


def plan_with(graph: tf.Graph, options: RewriteOptions, *, inline_calls: bool = True,
              refuse: bool = True) -> tuple[Plan, list[str]]:
    """The plan pass, for the rewrite, `graphsync run` and `inspect`: (the plan, the names of the
    tf.function calls inlined). With `inline_calls` the towers' calls are inlined into `graph`
    first, after a rehearsal on a copy (graphsync/splice/inline.py); without, the plan lists them
    (Plan.calls) and the graph is untouched. Without `refuse`, what a rewrite would refuse is kept
    in `Plan.refused` (graphsync inspect lists the verdicts anyway)."""
    def plan(g):
        return make_plan(g, options, refuse=refuse)
    return inline.planned(graph, plan) if inline_calls else (plan(graph), [])


@dataclasses.dataclass
class Splice:
    """What the splice pass made: the layers it synchronized (a conditional layer's stand-ins),
    and what the report counts."""

    layers: list = dataclasses.field(default_factory=list)
    recomputed: int = 0
    edges_moved: int = 0
    grad_ops_replaced: int = 0


def _rewrite(graph, options: RewriteOptions) -> RewriteReport:
    """The passes (plan → exchange → splice → check), then what the user is told."""
    plan, inlined = plan_with(graph, options)
    report = _planned_report(plan, options, inlined)
    exchange = make_exchange(graph, options, plan.device, plan.groups, digest("\n".join(report.fingerprints)),
                             plan.ps_tasks) if plan.layers else None
    if plan.layers and exchange.name == "ps":
        report.strategy, report.device = "ps", ", ".join(plan.ps_tasks)
    moving_writes = moving_updates.writes_per_layer(plan.layers)
    shared_writes = shared_averages.shared_writes(plan)
    version = graph.version   # the ops created from here on are the splice's
    spliced = _splice(graph, plan, options.recompute, exchange)
    report.recomputed, report.edges_moved = spliced.recomputed, spliced.edges_moved
    report.grad_ops_replaced = spliced.grad_ops_replaced
    report.layers.extend(_layer_reports(plan.layers))
    _check(spliced.layers)
    if plan.layers:   # the analysis again, on the result: no batch statistic left per tower
        rule.check_rewritten(graph, plan, plan.covered, version, processes=plan.across_processes)
    report.shared_moving = shared_averages.leave_to_first_worker(graph, shared_writes, options.process_group)
    if plan.layers and plan.across_processes:
        shared_updates.lock_shared_updates(graph, plan.ps_tasks)
    _say_kept_per_tower(plan.kept_per_tower)
    _say_unfollowed(plan.unfollowed)
    _say_undecided(plan.cross_example)
    _say_repeated_updates(moving_updates.repeated(moving_writes))
    if options.recompute:
        report.recompute_deferred = sum(not layer.has_gradients and layer.form.recomputes
                                        for layer in plan.layers)   # a reduction has nothing to recompute
    if report.changed:
        _rewritten_graphs.add(graph)
        unordered = ref_reads.order_before_updates(graph, version)
        _say_unordered(unordered)
        _say_races([r for r in ref_races.find_races(graph) if r not in unordered])
        if options.process_group is not None and options.process_group.heartbeat:
            from graphsync.between_graph import watched_steps
            watched_steps.watch(graph, options.process_group, report.fingerprints)
    return report


def _planned_report(plan: Plan, options: RewriteOptions, inlined: list) -> RewriteReport:
    """The report of what the plan will synchronize, before the splice counts what it made."""
    process_group = options.process_group
    gathered = options.strategy is Strategy.GATHER
    report = RewriteReport([t.label for t in plan.towers], plan.device if gathered else "",
                           skipped=[SkippedReport(op, why) for op, why in plan.skipped], strategy=options.strategy.value,
                           groups=[[plan.towers[i].label for i in g] for g in plan.groups],
                           process_group=process_group and (process_group.tasks, process_group.index),
                           inlined=inlined, recompute=options.recompute.value)
    if process_group is not None:
        report.fingerprints = fingerprints(plan)
    return report


def _splice(graph: tf.Graph, plan: Plan, recompute: Recompute, exchange) -> Splice:
    """The splice pass: every planned layer synchronized through `exchange`, in forward order."""
    made_in_all = Splice()
    per_tower = {}   # recompute="segments": each tower's layers, in forward order
    for layer in plan.layers:
        made = reduction.splice_reduction(graph, layer, exchange) if layer.form.reduces else \
            splice.splice_layer(graph, layer, exchange, recompute=recompute)
        made_in_all.layers.append(made.layer)
        for site, entry in zip(made.layer.sites if made.layer else (), getattr(made, "segments", ())):
            per_tower.setdefault(site.tower.label, []).append(entry)
        made_in_all.recomputed += made.recomputed
        made_in_all.edges_moved += made.edges
        made_in_all.grad_ops_replaced += made.grads_replaced
    if recompute is Recompute.SEGMENTS:
        made_in_all.recomputed += segments.place(graph, list(per_tower.values())).tensors
    return made_in_all


def _refuse_finalized(graph: tf.Graph) -> None:
    if graph.finalized:
        raise GraphsyncError("the graph is finalized (a MonitoredSession or Supervisor froze it): "
                             "call rewrite_towers() before creating the session")


def _layer_reports(layers) -> list[LayerReport]:
    """One LayerReport per normalization, its reductions listed (graphsync/plan/normalizations.py)."""
    reports = []
    for name, members in normalizations(layers):
        first = members[0]
        reports.append(LayerReport(
            name, first.shown_kind, tuple(s.op.name for s in first.sites),
            Backward.REWRITTEN if any(layer.has_gradients for layer in members) else Backward.AUTODIFF, first.found_as,
            tuple(layer.name for layer in members) if first.form.reduces else ()))
    return reports


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused while the rewrite creates its ops.

    Each op creates a few dozen Python objects, so a rewrite of a few thousand ops triggers
    hundreds of young-generation collections and several full ones, each of which walks every
    object the model graph holds (tens of thousands of ops): measured at 0.29 s of a 0.78 s
    ResNet-50 × 8 rewrite. The rewrite makes no garbage cycles worth collecting midway; the
    collector resumes (and catches up) when it returns."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _say_kept_per_tower(kept: list) -> None:
    """A GraphsyncWarning (one line under `graphsync run` and the CLI) when batch statistics that
    train in the towers stay per tower: the user asked for synchronized statistics and must not
    get a step that is not one device's without being told."""
    if kept:
        (op, why), more = kept[0], len(kept) - 1
        others = f" (and {more} more: report.skipped, graphsync inspect)" if more else ""
        warnings.warn(f"{len(kept)} batch statistic{'s' if len(kept) > 1 else ''} in the towers "
                      f"stay{'' if len(kept) > 1 else 's'} per tower, unsynchronized: {op}: {why}{others}",
                      GraphsyncWarning, stacklevel=4)


def _say_unfollowed(found: tuple) -> None:
    """A GraphsyncWarning when a reduction past where the batch axis's trace ended is read back
    into the model (graphsync/batch_axis/unfollowed.py): it may be a batch statistic left per tower.
    (Past an op type without a rule the plan has refused already: the user can declare it.)"""
    if found:
        more = f" (and {len(found) - 1} more: graphsync inspect)" if len(found) > 1 else ""
        warnings.warn(f"{found[0].line()}{more}: graphsync cannot tell whether it is a batch statistic, which "
                      "would stay per tower; if it is, write it with tf.nn.moments or a fused batch norm",
                      GraphsyncWarning, stacklevel=4)


def _say_undecided(rows) -> None:
    """A GraphsyncWarning for reductions over the batch read back into the examples that reach no
    variable, in a graph without gradients yet (graphsync/batch_axis/verdicts.py, "undecided"): a
    batch norm at the model's end would stay per tower; rewritten after the gradients exist,
    graphsync can tell and synchronizes it."""
    undecided = [r for r in rows if r.verdict is Verdict.UNDECIDED and r.tower is not None]
    if len({r.tower for r in undecided}) > 1:
        more = f" (and {len(undecided) - 1} more: graphsync inspect)" if len(undecided) > 1 else ""
        warnings.warn(f"{undecided[0].op} ({undecided[0].type}) {undecided[0].why}{more}: it stays per tower; if it "
                      "normalizes the model's output, rewrite after the gradients are built",
                      GraphsyncWarning, stacklevel=4)


def _say_repeated_updates(repeated: list) -> None:
    """A GraphsyncWarning when one step updates a layer's moving averages from several towers
    (graphsync/plan/moving_updates.py)."""
    if repeated:
        (name, towers), more = repeated[0], len(repeated) - 1
        others = f" and {more} more layer{'s' * (more > 1)}" if more else ""
        warnings.warn(f"the moving averages of layer '{name}'{others} are updated by {towers} towers in the same step, "
                      f"each with the same synchronized statistics: they move up to {towers}× as far per step as on one device; run "
                      "one tower's update ops (tf.compat.v1.get_collection(UPDATE_OPS, scope=<first tower>))",
                      GraphsyncWarning, stacklevel=4)


def _say_unordered(races: list) -> None:
    """A GraphsyncWarning for reads of TF1 ref variables racing an update across the rewrite's
    ops that splice/ref_reads.py could not order before it: the step may differ from one
    device's, from run to run."""
    if races:
        others = f" (and {len(races) - 1} more)" if len(races) > 1 else ""
        warnings.warn(f"{races[0].line()}{others}, and graphsync cannot order the read before the update (an update "
                      "inside a while loop, or the variable switched by a v1 cond): the step may use the new value; "
                      "use resource variables", GraphsyncWarning, stacklevel=4)


def _say_races(races: list) -> None:
    """A GraphsyncWarning for reads of TF1 ref variables that race their update (ungated
    gradients): the user's own race, but lockstep towers make the wrong outcome likely, and the
    step would then differ from one device's (graphsync/graph/ref_races.py)."""
    if races:
        others = f" (and {len(races) - 1} more)" if len(races) > 1 else ""
        warnings.warn(f"{races[0].line()}{others}: ungated gradients on TF1 ref variables, which synchronized "
                      "towers in lockstep make likely to use the new value; gate them (optimizer.compute_gradients' "
                      "default GATE_OP, tf.gradients(..., gate_gradients=True)) or use resource variables",
                      GraphsyncWarning, stacklevel=4)


def was_rewritten(graph: tf.Graph) -> bool:
    """Whether rewrite_towers already synchronized `graph` in this process (the script's own call,
    a SyncBatchNormHook, or `graphsync run`): graphsync.autosync.patching then leaves it alone."""
    return graph in _rewritten_graphs


def _check(spliced: list) -> None:
    """After the splice nothing may still read an old op: it would keep running every step.
    `spliced`: the layers splice_layer synchronized (a conditional layer's stand-ins)."""
    for layer in spliced:
        for site in layer.sites:
            for op, outputs in layer.form.replaced(site):
                if any(t.consumers() for t in outputs) or tf_private.control_outputs(op):
                    raise GraphsyncError(f"internal: {op.name} still has consumers after the rewrite")
