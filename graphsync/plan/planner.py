"""make_plan: candidates (graphsync/match/) → towers (graphsync/towers/) → the same layer paired
across towers → every check, before the first edit.

Building the plan never changes the graph, so a graph that cannot be rewritten is left exactly
as it was; the plan itself (graphsync/plan/data.py) is frozen.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync import batch_axis, match
from graphsync.graph.backward import is_backward
from graphsync.batch_axis.findings import Crossing
from graphsync.errors import GraphsyncError, NoTowersError
from graphsync.graph import by_type, order, shapes, tf_private
from graphsync.batch_axis import unfollowed
from graphsync.match import hidden
from graphsync.match.candidate import MomentsParts
from graphsync.match.layer_form import LayerForm
from graphsync.plan import left_alone, normalizations, reductions, rule, shared_tasks, training_flag
from graphsync.plan.data import LayerPlan, MomentsGrad, Plan, Site, check_gradient_calls
from graphsync.plan.options import RewriteOptions, Strategy
from graphsync.stats import Layout
from graphsync.towers import names as tower_names
from graphsync.towers import structure as tower_structure
from graphsync.towers.scopes import ROOT, Tower, conventional_families, find_towers, known_convention, tower_of


def make_plan(graph: tf.Graph, options: RewriteOptions = RewriteOptions(), *, refuse: bool = True) -> Plan:
    """Everything the splice needs, validated; raises GraphsyncError and leaves the graph alone.
    Without `refuse`, a batch statistic the rewrite would refuse is kept in `Plan.refused` instead,
    so that `graphsync inspect` can list every verdict, the refused ones too. The options alone
    were validated when built (graphsync/plan/options.py); what they ask of this graph is checked here."""
    towers, processes = options.towers, options.process_group is not None
    candidates = match.candidates(graph)
    analysis = batch_axis.analyze(graph)
    plan = _match_and_pair(graph, towers, options.device, processes, candidates, analysis)
    covered = rule.covered_ops(graph, plan.layers, candidates)
    rows, analysis = rule.verdicts(graph, plan.towers, towers is not None, covered, analysis=analysis,
                                   processes=processes)
    if not plan.calls:   # else planned again once the calls are inlined
        plan, rows, covered = _with_reductions(graph, plan, rows, analysis, covered, towers is not None, processes)
    plan = dataclasses.replace(plan, cross_example=rows, covered=covered,
                               trace_ended=tuple((op.name, why) for op, why in analysis.ended),
                               unfollowed=_unfollowed(plan, analysis, covered, processes))
    if not plan.calls:   # else planned again once the calls are inlined
        plan = _refusals(graph, plan, refuse)
        if refuse:
            _refuse_unpaired_gradients(plan.layers)
    layers, skipped = _in_forward_order(graph, plan.layers, plan.skipped)
    layers = normalizations.grouped(layers)   # which normalization each layer is part of, for reports
    plan = dataclasses.replace(plan, layers=layers, skipped=tuple(skipped), across_processes=processes,
                               groups=_groups(len(plan.towers), options.group_size))
    if processes and plan.layers:   # parameter servers: the exchange goes through them
        plan = dataclasses.replace(plan, ps_tasks=shared_tasks.shared_tasks(
            [site.op for layer in plan.layers for site in layer.sites]))
    if options.strategy is Strategy.ALLREDUCE:
        _check_own_devices(plan)
    return plan


def _refusals(graph: tf.Graph, plan: Plan, refuse: bool) -> Plan:
    """Raises the first refusal: a batch statistic no layer synchronizes (plan/rule.py), then an op
    type without a rule read back (batch_axis/unfollowed.py), then towers that normalize per tower while
    the plan synchronizes nothing (plan/left_alone.py); without `refuse`, keeps its line instead."""
    try:
        rule.refuse(plan.cross_example)
        unfollowed.refuse(plan.unfollowed)
        left_alone.refuse(graph, plan)
    except GraphsyncError as refusal:
        if refuse:
            raise
        return dataclasses.replace(plan, refused=str(refusal))
    return plan


def _refuse_unpaired_gradients(layers) -> None:
    """A layer whose gradient ops were not found (so that the rewrite would leave the backward to
    gradients built later) while a backward already reads its statistics: that backward, built by
    a GradientTape whose ops graphsync cannot pair with the forward yet, would stay per tower."""
    for layer in layers:
        if layer.has_gradients or not layer.form.spelled_out:   # the forms paired by tf.gradients' scopes
            continue
        site = layer.sites[0]
        starts = [site.op, getattr(getattr(site, "parts", None), "variance", None)]
        reader = _backward_reader([op for op in starts if op is not None])
        if reader is not None:
            raise GraphsyncError(
                f"{site.op.name} ({layer.form.value}): its gradient is already built ({reader.name} reads it) by "
                "ops graphsync cannot pair with this layer, so the backward would use each tower's own "
                "statistics; build the gradients after graphsync's rewrite, or use a fused batch norm")


def _backward_reader(ops, depth: int = 4):
    """A backward op reading the outputs of `ops` within `depth` forward ops, or None."""
    frontier, seen = list(ops), set(ops)
    for _ in range(depth):
        following = []
        for op in frontier:
            for consumer in (c for t in op.outputs for c in t.consumers()):
                if is_backward(consumer):
                    return consumer
                if consumer not in seen:
                    seen.add(consumer)
                    following.append(consumer)
        frontier = following
    return None


def _unfollowed(plan: Plan, analysis, covered: dict, processes: bool) -> tuple:
    """The reductions the rule could not check (batch_axis/unfollowed.py), where towers could differ:
    several towers in the graph (the plan's, else those the trace ended in), or worker processes."""
    towers = list(plan.towers)
    if len(towers) < 2 and not processes:
        towers = find_towers([op.name for op, _ in analysis.ended], None) if analysis.ended else []
        if len([t for t in towers if t.prefix != ROOT]) < 2:
            return ()
    towers = towers or find_towers([], [ROOT])
    return tuple(unfollowed.unfollowed(analysis, lambda op: tower_of(op.name, towers) is not None, covered))


def _with_reductions(graph: tf.Graph, plan: Plan, rows, analysis, covered: dict, explicit: bool,
                     processes: bool):
    """The plan with a "reduction" layer for every Sum or Mean the rule refused that can be summed
    over the towers (graphsync/plan/reductions.py), and the verdicts and covered ops with them.
    Between worker processes (`processes`) one tower per graph has peers too: its reductions are
    summed over every worker's towers by the same exchange as the batch norms (collectives, or
    queues on a parameter server)."""
    if not any(r.verdict is batch_axis.Verdict.REFUSED and r.type in reductions.TYPES for r in rows):
        return plan, rows, covered
    if processes:
        towers = list(plan.towers) or find_towers([], [ROOT])
    else:
        towers = list(plan.towers) if plan.layers else \
            [Tower(i, t.prefix) for i, t in enumerate(rule.rule_towers(analysis, plan.towers, explicit))]
    layers, dependent = reductions.layer_plans(graph, rows, analysis, towers, processes)
    if layers:
        covered = {**covered, **{site.op: rule.SUMMED_REDUCTION for layer in layers for site in layer.sites}}
        rows, _ = rule.verdicts(graph, towers, explicit, covered, analysis=analysis, processes=processes)
        plan = dataclasses.replace(plan, towers=tuple(towers), layers=plan.layers + tuple(layers),
                                   device=plan.device or default_device(layers[0].sites[0].op),
                                   found_by=plan.found_by or ("towers= option" if explicit
                                                              else known_convention(towers)))
    rows = tuple(dataclasses.replace(r, why=dependent[r.op]) if r.op in dependent else r for r in rows)
    return plan, rows, covered


def _check_own_devices(plan: Plan) -> None:
    """All-reduce runs on the towers' own devices: two towers of a sync group may not share one."""
    for layer in plan.layers:
        for members in plan.groups:
            devices = [_canonical(layer.sites[i].device) for i in members]
            if (len(devices) > 1 and "" in devices) or len(set(devices)) < len(devices):
                raise GraphsyncError(
                    f"strategy='allreduce' needs every tower of a sync group on its own device, but "
                    f"{layer.sites[members[0]].op.name} and its peers sit on {sorted(set(devices))}: "
                    "place the towers with tf.device, or use strategy='gather'")


def _in_forward_order(graph: tf.Graph, layers: list, skipped: list) -> tuple[list, list]:
    """Layers in the order the first tower's forward pass runs them, and the ops left alone in
    the order they run (graphsync/graph/order.py): listings read the network from input to output."""
    return (order.in_forward_order(layers, lambda layer: layer.sites[0].op),
            order.in_forward_order(skipped, lambda item: graph.get_operation_by_name(item[0])))


def _groups(n_towers: int, group_size: int | None) -> tuple[tuple[int, ...], ...]:
    """Consecutive groups of `group_size` towers (all towers by default)."""
    if not group_size or n_towers == 0:
        return (tuple(range(n_towers)),)
    if group_size < 1 or n_towers % group_size:
        raise GraphsyncError(f"group_size={group_size} does not divide the {n_towers} towers into equal groups")
    return tuple(tuple(range(i, i + group_size)) for i in range(0, n_towers, group_size))


def _canonical(device: str) -> str:
    return tf.DeviceSpec.from_string(device).to_string() if device else ""


def _match_and_pair(graph: tf.Graph, towers, device, processes: bool, candidates, analysis) -> Plan:
    """Candidates → towers → layers paired across towers; a Plan without the options' checks."""
    skipped = [(c.name, c.skip_reason) for c in candidates if c.skip_reason]
    live = [c for c in candidates if not c.skip_reason]
    explicit = towers is not None
    hiding, unfused = _calls_hiding(graph, candidates)
    statistics = [op for op in _calls_with_statistics(analysis) if op not in hiding and op not in unfused]
    hiding = hiding + statistics
    found_towers, found_by, left_out = _towers(graph, candidates, live, hiding + unfused, towers)
    # Between-graph replication with no towers: one replica per worker graph, the whole graph.
    whole_graph = find_towers([], [ROOT]) if not found_towers and processes else None
    in_towers = whole_graph or [t for t in found_towers if explicit or t.prefix != ROOT]
    calls = [op for op in hiding + unfused if op.type in hidden.CALL_TYPES and tower_of(op.name, in_towers) is not None]
    _reject_hidden([op for op in hiding if op not in calls], in_towers)
    if len(in_towers) > 1 or processes:
        if calls:   # planned once inlined (splice/inline.py)
            return Plan(tuple(found_towers), device or "", (), tuple(skipped), found_by=found_by, calls=tuple(calls))
    if not live:
        return Plan(tuple(found_towers), device or "", (), tuple(skipped), found_by=found_by)
    if whole_graph:
        found_towers, explicit, found_by = whole_graph, True, "process group: the whole graph"
    if not found_towers:
        parallel = tower_structure.parallel_scopes(graph, live)
        raise NoTowersError(
            f"no towers found among {len(live)} batch-norm ops (e.g. {live[0].name}): "
            + (parallel if parallel else "no sibling scopes numbered like gpu_0/, gpu_1/ hold them in parallel; "
               "name yours with towers=REGEX or a list of prefixes"), parallel_structure=parallel is not None)

    by_layer = _pair(live, found_towers, left_out, skipped)
    found_towers = _drop_unpaired_root(found_towers, by_layer, explicit)
    if len(found_towers) < 2 and not processes:
        for cands in by_layer.values():
            skipped.extend((c.name, "single tower: nothing to synchronize with") for c in cands.values())
        return Plan(tuple(found_towers), device or "", (), tuple(skipped), found_by=found_by)

    layers = _layers(graph, by_layer, found_towers, live, explicit, skipped)
    if layers and not device:
        device = default_device(layers[0].sites[0].op)
    return Plan(tuple(found_towers), device or "", tuple(layers), tuple(skipped), found_by=found_by)


def _calls_hiding(graph: tf.Graph, candidates) -> tuple[list, list]:
    """The calls hiding a batch norm graphsync does not already understand as a conditional layer
    (match/conditional.py), and the tf.function calls hiding only unfused batch moments."""
    understood = {c.op for c in candidates if c.form.in_branches and c.parts}
    fused_calls, unfused_calls = _calls_hiding_batch_norm(graph)
    return [op for op in fused_calls if op not in understood], [op for op in unfused_calls if op not in fused_calls]


def _calls_with_statistics(analysis) -> list:
    """The tf.function calls whose bodies hold a batch statistic (batch_axis: a cross-example op
    over a batch-carrying argument, read back into the examples or returned): inlined like the calls
    hiding a batch norm, so that the rule sees it in the main graph and plan/reductions.py
    synchronizes it as if written without tf.function. Calls that only carry the batch (gelu,
    swish) are left alone."""
    found = [op for op, crossed in analysis.cross.items() if crossed.how is Crossing.BODY and op.type in hidden.CALL_TYPES]
    found += [op for op in analysis.bodies if op.type in hidden.CALL_TYPES and _imported(op)]
    return sorted({op for op in found if not hidden.is_inlined(op)}, key=tf_private.creation_order)


def _imported(op: tf.Operation) -> bool:
    """A call an inlined body held (nested calls): imported, it has no gradient function, so it is
    inlined too, whatever its body computes."""
    return hidden.INLINED_SUFFIX + "/" in op.name


def _towers(graph: tf.Graph, candidates, live, hiding, towers):
    """(towers, how they were found, scopes left out and why): known names or towers= first,
    the graph's structure when names do not settle it."""
    explicit = towers is not None
    found = find_towers([c.name for c in candidates] + [op.name for op in hiding], towers)
    found_by = ("towers= option" if explicit else known_convention(found)) if found else ""
    if not explicit and live and not _known_names_suffice(found, live):
        by_structure = tower_structure.discover(graph, live)
        if by_structure is not None:
            return by_structure.towers, by_structure.how, by_structure.left_out
    return found, found_by, []


def _pair(live, found_towers, left_out, skipped: list) -> dict:
    """{layer name: {tower: candidate}}; candidates outside every tower are added to `skipped`."""
    per_tower: dict[Tower, list] = {}
    for cand in live:
        tower = tower_of(cand.name, found_towers)
        if tower is None:
            reason = next((why for prefix, why in left_out if cand.name.startswith(prefix)), "outside every tower")
            skipped.append((cand.name, reason))
            continue
        per_tower.setdefault(tower, []).append((cand.name[len(tower.prefix):], tf_private.creation_order(cand.op), cand))
    return tower_names.pair_by_name(per_tower)


def _layers(graph: tf.Graph, by_layer: dict, found_towers, live, explicit: bool, skipped: list) -> list:
    """One validated LayerPlan per paired layer, by name; an unscoped layer with no counterpart in
    a numbered tower is outside every tower (added to `skipped`)."""
    scopes = match.gradient_scopes(graph) if any(c.form.spelled_out for c in live) else {}
    layers = []
    for name, cands in sorted(by_layer.items()):
        cands = {t: c for t, c in cands.items() if t in found_towers}
        if not cands:
            continue
        if set(cands) == {found_towers[0]} and found_towers[0].prefix == ROOT and not explicit:
            skipped.append((cands[found_towers[0]].name, "outside every tower"))
            continue
        layers.append(_layer_plan(name, [(t, cands.get(t)) for t in found_towers], scopes))
    return layers


def _known_names_suffice(found_towers, live) -> bool:
    """The fast path: two or more scoped towers of one known convention, which structure need
    not confirm (several conventions, or nested ones, are left to graphsync/towers/structure.py)."""
    return sum(t.prefix != ROOT for t in found_towers) >= 2 and \
        len(conventional_families([c.name for c in live])) == 1


def _drop_unpaired_root(towers, by_layer, explicit):
    """An auto-detected root tower stays only if it holds a counterpart of a numbered tower's layer."""
    if explicit or not towers or towers[0].prefix != ROOT:
        return towers
    root = towers[0]
    if any(root in ops and len(ops) > 1 for ops in by_layer.values()):
        return towers
    for ops in by_layer.values():
        ops.pop(root, None)
    return [Tower(i, t.prefix) for i, t in enumerate(towers[1:])]


def _calls_hiding_batch_norm(graph: tf.Graph) -> tuple[list, list]:
    """The If/While/call ops whose function bodies run a training fused batch norm (a tensor-valued
    `training` flag under control flow v2, a tf.function), and the tf.function calls whose bodies
    compute batch moments the unfused way (tf.nn.moments), where get_operations() cannot see them;
    calls graphsync inlined are no longer run. One pass over the graph, only when a function of
    its library holds either."""
    fused, unfused = match.functions_with_training_batch_norm(graph), match.functions_with_batch_moments(graph)
    if not fused and not unfused:
        return [], []
    found = ([], [])
    for op in by_type.ops_of_types(graph, match.FUNCTION_CALL_TYPES):
        if not hidden.is_inlined(op):
            called = match.called_functions(op)
            if called & fused:
                found[0].append(op)
            if op.type in hidden.CALL_TYPES and called & unfused:
                found[1].append(op)
    return found


def _reject_hidden(ops, towers):
    """Refuses loudly when such a hidden batch norm (not a tf.function call: those are inlined)
    would run inside a tower."""
    for op in ops:
        if tower_of(op.name, towers) is not None:
            raise GraphsyncError(
                f"{op.name} ({op.type}) runs a batch norm inside a function body, which graphsync cannot "
                "rewrite: pass training=True as a Python bool, or call "
                "tf.compat.v1.disable_control_flow_v2() before building the model")


def _layer_plan(name: str, per_tower, scopes) -> LayerPlan:
    missing = [t.label for t, cand in per_tower if cand is None]
    present = [cand.op for _, cand in per_tower if cand is not None]
    if missing:
        raise GraphsyncError(
            f"layer {name!r} ({present[0].name}) is missing from tower(s) {', '.join(missing)}: "
            "every tower must build the same layers (or pass towers= to choose the towers)")
    first, form = present[0], per_tower[0][1].form
    if form.in_branches:
        return training_flag.layer_plan(name, per_tower)
    for op in present:
        if tf_private.in_while_loop(op):
            raise GraphsyncError(
                f"{op.name} sits inside a v1 tf.while_loop, which graphsync cannot rewrite: "
                "build the batch norm outside the loop")
    flags = {t.label: tf_private.cond_predicate(cand.op) for t, cand in per_tower}
    if any(f is not None for f in flags.values()):   # a v1 tf.cond around the op (a tensor training flag)
        training_flag.check_one_flag(name, {label: training_flag.predicate(f) if f is not None else None
                                          for label, f in flags.items()})
    attrs = [_signature(cand) for _, cand in per_tower]
    for op, sig in zip(present[1:], attrs[1:]):
        if sig != attrs[0]:
            diff = ", ".join(f"{k}: {attrs[0][k]} vs {sig[k]}" for k in sig if sig[k] != attrs[0][k])
            raise GraphsyncError(f"{first.name} and {op.name} are paired as layer {name!r} but differ ({diff})")
    rank = _input(per_tower[0][1]).shape.rank
    if rank is None:
        raise GraphsyncError(f"{first.name}: the rank of its input is unknown; set a static rank")
    if form.spelled_out:
        sites = tuple(Site(t, c.op, tuple(_moments_grads(c, scopes)), c.parts) for t, c in per_tower)
        layout = Layout(rank, per_tower[0][1].parts.axes)
        avg, epsilon = 1.0, 0.0
    else:
        sites = tuple(Site(t, c.op, tuple(match.fused_gradient_ops(c.op))) for t, c in per_tower)
        layout = Layout.from_data_format(rank, first.get_attr("data_format").decode())
        avg = first.get_attr("exponential_avg_factor") if first.type == "FusedBatchNormV3" else 1.0
        epsilon = first.get_attr("epsilon")
    check_gradient_calls(f"layer {name!r}", sites)
    return LayerPlan(name, form, sites, layout, epsilon, avg)


def _moments_grads(cand, scopes) -> list[MomentsGrad]:
    """The gradient calls through a moments subgraph, by the scope tf.gradients gave each."""
    parts = cand.parts
    mean_op, variance_op = cand.op, parts.variance
    mean_calls, variance_calls = scopes.get(mean_op.name, {}), scopes.get(variance_op.name, {})
    grads = []
    for call in sorted(set(mean_calls) | set(variance_calls)):
        entries = []
        for op, calls in ((mean_op, mean_calls), (variance_op, variance_calls)):
            ops = calls.get(call, [])
            entry = match.gradient_entry(ops, list(op.inputs) + list(op.outputs)) if ops else None
            if not ops and parts.statistics is not None:   # a gradient handed on unchanged (Add, Sub)
                entry = match.passed_through_entry(op, call, scopes, parts.statistics)
                ops = [op] if any(scopes.get(t.op.name, {}).get(call) for t in op.inputs) else []
            if ops and entry is None:
                raise GraphsyncError(
                    f"cannot tell which tensor is the incoming gradient of {op.name} in {call}/: "
                    "rewrite before building the gradients")
            if entry is not None and parts.statistics is not None:
                entries += [entry, match.entry_readers(entry, call, scopes, parts.statistics)]
            else:
                entries += [entry, tuple(o for o in ops if entry is not None and any(entry is t for t in o.inputs))]
        shifted = parts.shifted_mean
        readers = tuple(o for o in scopes.get(parts.square.name, {}).get(call, [])
                        if any(t is shifted for t in o.inputs)) if shifted is not None else ()
        grads.append(MomentsGrad(call, *entries, readers))
    return grads


def _input(cand) -> tf.Tensor:
    """The activation a layer normalizes."""
    return cand.parts.x if isinstance(cand.parts, MomentsParts) else cand.op.inputs[0]


def _signature(cand) -> dict:
    """The attributes paired ops must share."""
    op = cand.op
    if cand.form.spelled_out:
        x = _input(cand)
        return {"kind": LayerForm.MOMENTS.value, "axes": cand.parts.axes, "dtype": x.dtype.name, "rank": x.shape.rank,
                "statistics shape": shapes.text(op.outputs[0].shape[1:]), "keep_dims": cand.parts.keep_dims}
    channels = shapes.dim(op.inputs[1].shape, 0) if op.inputs[1].shape.rank == 1 else None
    return {"kind": op.type, "channels": channels, "dtype": op.inputs[0].dtype.name,
            "rank": op.inputs[0].shape.rank, "epsilon": op.get_attr("epsilon"),
            "data_format": op.get_attr("data_format").decode(),
            "exponential_avg_factor": op.get_attr("exponential_avg_factor")
            if op.type == "FusedBatchNormV3" else 1.0}


def default_device(op: tf.Operation) -> str:
    """The CPU of the host of the first tower, as in the seed's hand-written version."""
    spec = tf.DeviceSpec.from_string(op.device or "")
    return spec.replace(device_type="CPU", device_index=0).to_string()
