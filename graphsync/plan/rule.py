"""The rule, applied to a plan: every cross-example op inside the towers (graphsync/batch_axis/)
gets a verdict, and a batch statistic the plan does not synchronize is refused, in one line, before
the first edit; after the rewrite the same analysis runs again on the result (`check_rewritten`).

    synchronized  a batch-norm form of graphsync/match/ synchronizes it, or it is a Sum or Mean the plan
                  sums over every tower's (graphsync/plan/reductions.py), or its value is merged across towers
    terminal      it only reaches losses, metrics, summaries, variable updates: per tower, as one expects
    ghost         a reduction over part of the batch (virtual batches): per tower by design
    per tower     a form graphsync keeps per tower and says so (ghost batch norm), or a statistic outside the towers
    refused       a batch statistic no form synchronizes, or a sort/top-k/arg-max over the batch read back,
                  or one in a tf.cond branch (an If, named with the op in its branch), or one read
                  back inside a loop's body (a While, named with the op in its body; under
                  control flow v1 the op in the loop)

A tf.function call holding a statistic is no row here: the planner inlines it first (Plan.calls).
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync import batch_axis
from graphsync.batch_axis import Judgement, Verdict
from graphsync.errors import GraphsyncError
from graphsync.graph import tf_private
from graphsync.match import conditional
from graphsync.match.candidate import MomentsParts, PerTower
from graphsync.match.fused import made_by_graphsync
from graphsync.match.reductions import statistics_ops
from graphsync.towers.scopes import ROOT, find_towers, tower_of


# The judgements on the ops the plan covers (covered_ops, and plan/reductions.py's sums), given
# before the trace's: what the plan does with them is their verdict.
SYNCHRONIZED_FORM = Judgement(Verdict.SYNCHRONIZED, "a batch norm graphsync synchronizes")
SUMMED_REDUCTION = Judgement(Verdict.SYNCHRONIZED, "a reduction graphsync computes over every tower's examples")
KEPT_PER_TOWER = Judgement(Verdict.PER_TOWER, "a form kept per tower on purpose (its reason: left alone)")
MADE_BY_GRAPHSYNC = Judgement(Verdict.SYNCHRONIZED, "graphsync's statistics kernel (already synchronized)")


@dataclasses.dataclass(frozen=True)
class OpVerdict:
    """One row of the plan's cross-example ops (Plan.cross_example): the op, its tower's label,
    the verdict, and why, as `graphsync inspect` lists them."""

    op: str
    type: str
    tower: str | None
    verdict: Verdict
    why: str


def covered_ops(graph: tf.Graph, layers, candidates=()) -> dict:
    """{op: its Judgement} for every op a planned layer's statistics are made of (synchronized),
    and those of the candidates kept per tower on purpose."""
    covered = {}
    for layer in layers:
        for site in layer.sites:
            for op in _statistics(site.op, site.parts):
                covered[op] = SYNCHRONIZED_FORM
    for cand in candidates:
        if cand.form.in_branches and cand.parts is not None and conditional.is_rewritten(cand.op, cand.parts):
            covered[cand.op] = SYNCHRONIZED_FORM   # its branches' batch norm: an earlier rewrite's
        if isinstance(cand.skip_reason, PerTower):
            for op in _statistics(cand.op, cand.parts):
                covered.setdefault(op, KEPT_PER_TOWER)
    return covered


def _statistics(op, parts):
    found = {op}
    if isinstance(parts, MomentsParts):
        found.add(parts.variance)
        found.update(parts.statistics or ())
        found.update(statistics_ops(parts.x, [op.outputs[0], parts.variance.outputs[0]], limit=256))
    return found


def verdicts(graph: tf.Graph, towers, explicit: bool, covered: dict, analysis=None, skip=frozenset(),
             processes: bool = False) -> tuple:
    """Every cross-example op of `graph`'s forward, in forward order, with its verdict. `towers`:
    the plan's; when fewer than two, the towers holding batch statistics (known names, `towers=`).
    `processes`: between-graph replication, where even one tower per graph has peers in the other
    worker processes, so a batch statistic no layer synchronizes is refused there too."""
    analysis = analysis or batch_axis.analyze(graph)
    explicit = explicit or processes
    in_towers = (list(towers) or find_towers([], [ROOT])) if processes else _towers(analysis, towers, explicit)

    def tower(op):
        found = tower_of(op.name, in_towers) if in_towers else None
        return found if found is not None and (explicit or found.prefix != ROOT) else None

    rows = []
    for op, crossed in analysis.cross.items():
        if op in skip:
            continue
        where = tower(op)
        if made_by_graphsync(op):   # graphsync's own statistics kernel, from an earlier rewrite
            judgement = MADE_BY_GRAPHSYNC
        else:
            judgement = covered[op] if op in covered else batch_axis.judge(analysis, crossed, tower, skip)
        verdict, why = judgement.verdict, judgement.why
        if verdict in (Verdict.STATISTIC, Verdict.ORDER):
            verdict = Verdict.REFUSED if where is not None and (len(in_towers) > 1 or processes) else Verdict.PER_TOWER
            if where is None:
                why += " (outside the towers)"
        rows.append(OpVerdict(op.name, op.type, where and where.label, verdict, why))
    created = {op.name: tf_private.creation_order(op) for op in analysis.cross}   # the graph's op order
    return tuple(sorted(rows, key=lambda r: created.get(r.op, 0))), analysis


def rule_towers(analysis, towers, explicit) -> list:
    """The towers the verdicts are given in (see `verdicts`), root left out unless `explicit`."""
    return [t for t in _towers(analysis, towers, explicit) if explicit or t.prefix != ROOT]


def _towers(analysis, towers, explicit):
    scoped = [t for t in towers if explicit or t.prefix != ROOT]
    if len(scoped) > 1:
        return list(towers)
    names = [op.name for op in analysis.cross]
    found = find_towers(names, None) if names and not explicit else list(towers)
    return found if len([t for t in found if explicit or t.prefix != ROOT]) > 1 else []


def refuse(rows) -> None:
    """One line naming the first batch statistic the rewrite would leave per tower."""
    refused = [r for r in rows if r.verdict is Verdict.REFUSED]
    if refused:
        first = refused[0]
        more = f" (and {len(refused) - 1} more: graphsync inspect)" if len(refused) > 1 else ""
        raise GraphsyncError(
            f"{first.op} ({first.type}) computes a batch statistic graphsync cannot synchronize, which would "
            f"train per tower: it {first.why}{more}; write it with tf.nn.moments or a fused batch norm, "
            "or compute it outside the towers")


def check_rewritten(graph: tf.Graph, plan, covered: dict, version: int, processes: bool = False) -> None:
    """After the splice: the analysis again, on the result; a batch statistic still computed per
    tower (not replaced by the rewrite, not made by it since the graph's `version`) is an error
    naming the op. `processes`: the towers' peers include other worker processes' (Plan.across_processes)."""
    made = frozenset(tf_private.ops_added_since(graph, version))
    rows, _ = verdicts(graph, plan.towers, False, covered, skip=made, processes=processes)
    refused = [r for r in rows if r.verdict is Verdict.REFUSED]
    if refused:
        raise GraphsyncError(f"internal: {refused[0].op} ({refused[0].type}) still computes a batch statistic per "
                             f"tower after the rewrite ({refused[0].why}): please report it")
