"""Pairing the same layer across towers, and checking everything before the first edit.

The plan is plain data: which ops form each synchronized layer, where its aggregation runs and
which gradient ops its backward replaces. Building it never changes the graph, so a graph that
cannot be rewritten is left exactly as it was.
"""
from __future__ import annotations

import dataclasses
import hashlib

import tensorflow as tf

from graphsync import inline, match, order, shapes, shared_tasks, tf_private, tower_names, tower_structure
from graphsync.errors import GraphsyncError, NoTowersError
from graphsync.stats import Layout
from graphsync.towers import ROOT, Tower, conventional_families, find_towers, known_convention, tower_of


@dataclasses.dataclass
class Site:
    """One layer in one tower: its op (the fused op, or the moments' mean), the other ops of a
    moments subgraph, and one entry per gradient call that differentiates it (a FusedBatchNormGrad
    op, or a `MomentsGrad`)."""

    tower: Tower
    op: tf.Operation
    grad_ops: list
    parts: dict = dataclasses.field(default_factory=dict)

    @property
    def device(self) -> str:
        return self.op.device


@dataclasses.dataclass(frozen=True)
class MomentsGrad:
    """One gradient call through a moments subgraph: the gradients arriving at its mean and
    variance (None when nothing differentiates that output), and the ops of the call that read
    them (the Mean gradient functions)."""

    call: str
    mean: tf.Tensor | None
    mean_readers: tuple
    variance: tf.Tensor | None
    variance_readers: tuple
    shifted_mean_readers: tuple = ()   # ops of the call that read a shifted mean (match/sufficient.py)


@dataclasses.dataclass
class LayerPlan:
    """One layer to synchronize: the same op in every tower, and its common attributes."""

    name: str
    kind: str
    sites: list[Site]
    layout: Layout
    epsilon: float
    avg_factor: float

    @property
    def has_gradients(self) -> bool:
        return bool(self.sites[0].grad_ops)

    @property
    def shown_kind(self) -> str:
        """What reports call the layer: "conditional" behind a tensor training flag (a v2 If, or a
        fused op inside a v1 tf.cond), else its kind."""
        if self.kind == "fused" and tf_private.control_flow_context(self.sites[0].op) is not None:
            return "conditional"
        return self.kind

    @property
    def residual_epsilon(self) -> float | None:
        """The ε of a fused layer's residuals: its statistics kernel uploads Σ(x − m̂)/√(v + ε)
        (graphsync/fused.py), which the merge scales back; moments residuals are Σ(x − m̂) (None)."""
        return self.epsilon if self.kind == "fused" else None


@dataclasses.dataclass
class Plan:
    towers: list[Tower]
    device: str
    layers: list[LayerPlan]
    skipped: list[tuple[str, str]]
    strategy: str = "gather"
    groups: list = dataclasses.field(default_factory=list)   # tower indices per sync group
    process_group: object = None
    found_by: str = ""     # how the towers were found: "known name", "structure: gpu_%d", "towers= option"
    calls: list = dataclasses.field(default_factory=list)   # tower tf.function calls to inline first (inline.py)

    @property
    def kept_per_tower(self) -> list[tuple[str, str]]:
        """The skipped batch statistics that train inside one of several towers (or one worker's)
        and stay per tower (match.PerTower reasons): the step is not one device's there."""
        if len(self.towers) < 2 and self.process_group is None:
            return []
        return [(op, why) for op, why in self.skipped
                if isinstance(why, match.PerTower) and tower_of(op, self.towers) is not None]


def make_plan(graph: tf.Graph, towers=None, device: str | None = None, *, strategy: str = "gather",
              group_size: int | None = None, process_group=None) -> Plan:
    """Everything the splice needs, validated; raises GraphsyncError and leaves the graph alone."""
    plan = _match_and_pair(graph, towers, device, process_group)
    plan.layers, plan.skipped = _in_forward_order(graph, plan.layers, plan.skipped)
    plan.strategy, plan.process_group = strategy, process_group
    plan.groups = _groups(len(plan.towers), group_size)
    if strategy not in ("gather", "allreduce"):
        raise GraphsyncError(f"unknown strategy {strategy!r}: use 'gather' or 'allreduce'")
    if process_group is not None and strategy != "allreduce":
        raise GraphsyncError("between-graph replication (a process group) needs strategy='allreduce'")
    if process_group is not None and plan.layers:
        shared_tasks.check([site.op for layer in plan.layers for site in layer.sites])
    if strategy == "allreduce":
        for layer in plan.layers:
            for members in plan.groups:
                devices = [_canonical(layer.sites[i].device) for i in members]
                if (len(devices) > 1 and "" in devices) or len(set(devices)) < len(devices):
                    raise GraphsyncError(
                        f"strategy='allreduce' needs every tower of a sync group on its own device, but "
                        f"{layer.sites[members[0]].op.name} and its peers sit on {sorted(set(devices))}: "
                        "place the towers with tf.device, or use strategy='gather'")
    return plan


def _in_forward_order(graph: tf.Graph, layers: list, skipped: list) -> tuple[list, list]:
    """Layers in the order the first tower's forward pass runs them, and the ops left alone in
    the order they run (graphsync/order.py): listings read the network from input to output."""
    return (order.in_forward_order(layers, lambda layer: layer.sites[0].op),
            order.in_forward_order(skipped, lambda item: graph.get_operation_by_name(item[0])))


def _groups(n_towers: int, group_size: int | None) -> list[list[int]]:
    """Consecutive groups of `group_size` towers (all towers by default)."""
    if not group_size or n_towers == 0:
        return [list(range(n_towers))]
    if group_size < 1 or n_towers % group_size:
        raise GraphsyncError(f"group_size={group_size} does not divide the {n_towers} towers into equal groups")
    return [list(range(i, i + group_size)) for i in range(0, n_towers, group_size)]


def _canonical(device: str) -> str:
    return tf.DeviceSpec.from_string(device).to_string() if device else ""


def _match_and_pair(graph: tf.Graph, towers, device, process_group) -> Plan:
    candidates = match.candidates(graph)
    skipped = [(c.name, c.skip_reason) for c in candidates if c.skip_reason]
    live = [c for c in candidates if not c.skip_reason]
    explicit = towers is not None
    understood = {c.op for c in candidates if c.kind == "conditional" and c.parts}   # see match/conditional.py
    fused_calls, unfused_calls = _calls_hiding_batch_norm(graph)
    hidden = [op for op in fused_calls if op not in understood]
    unfused = [op for op in unfused_calls if op not in fused_calls]
    found_towers = find_towers([c.name for c in candidates] + [op.name for op in hidden + unfused], towers)
    found_by, left_out = ("towers= option" if explicit else known_convention(found_towers)) if found_towers else "", []
    if not explicit and live and not _known_names_suffice(found_towers, live):
        by_structure = tower_structure.discover(graph, live)
        if by_structure is not None:
            found_towers, found_by, left_out = by_structure.towers, by_structure.how, by_structure.left_out
    in_towers = [t for t in found_towers if explicit or t.prefix != ROOT]
    if not found_towers and process_group is not None:
        in_towers = find_towers([], [ROOT])   # one replica per worker graph: the whole graph
    calls = [op for op in hidden if op.type in inline.CALL_TYPES and tower_of(op.name, in_towers) is not None]
    _reject_hidden([op for op in hidden if op not in calls], in_towers)
    if len(in_towers) > 1 or process_group is not None:
        _reject_unfused_in_calls(unfused, in_towers)
        if calls:   # planned once inlined (inline.py)
            return Plan(found_towers, device or "", [], skipped, found_by=found_by, calls=calls)
    if not live:
        return Plan(found_towers, device or "", [], skipped, found_by=found_by)
    if not found_towers and process_group is not None:
        found_towers = find_towers([], [ROOT])   # one replica per worker graph: the whole graph
        explicit, found_by = True, "process group: the whole graph"
    if not found_towers:
        parallel = tower_structure.parallel_scopes(graph, live)
        raise NoTowersError(
            f"no towers found among {len(live)} batch-norm ops (e.g. {live[0].name}): "
            + (parallel if parallel else "no sibling scopes numbered like gpu_0/, gpu_1/ hold them in parallel; "
               "name yours with towers=REGEX or a list of prefixes"), parallel_structure=parallel is not None)

    per_tower: dict[Tower, list] = {}
    for cand in live:
        tower = tower_of(cand.name, found_towers)
        if tower is None:
            reason = next((why for prefix, why in left_out if cand.name.startswith(prefix)), "outside every tower")
            skipped.append((cand.name, reason))
            continue
        per_tower.setdefault(tower, []).append((cand.name[len(tower.prefix):], cand.op._id, cand))  # noqa: SLF001
    by_layer = tower_names.pair_by_name(per_tower)

    found_towers = _drop_unpaired_root(found_towers, by_layer, explicit)
    if len(found_towers) < 2 and process_group is None:
        for cands in by_layer.values():
            skipped.extend((c.name, "single tower: nothing to synchronize with") for c in cands.values())
        return Plan(found_towers, device or "", [], skipped, found_by=found_by)

    scopes = match.gradient_scopes(graph) if any(c.kind == "moments" for c in live) else {}
    layers = []
    for name, cands in sorted(by_layer.items()):
        cands = {t: c for t, c in cands.items() if t in found_towers}
        if not cands:
            continue
        if set(cands) == {found_towers[0]} and found_towers[0].prefix == ROOT and not explicit:
            skipped.append((cands[found_towers[0]].name, "outside every tower"))
            continue
        layers.append(_layer_plan(name, [(t, cands.get(t)) for t in found_towers], scopes))
    if layers and not device:
        device = default_device(layers[0].sites[0].op)
    return Plan(found_towers, device or "", layers, skipped, found_by=found_by)


def _known_names_suffice(found_towers, live) -> bool:
    """The fast path: two or more scoped towers of one known convention, which structure need
    not confirm (several conventions, or nested ones, are left to graphsync/tower_structure.py)."""
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
    for op in graph.get_operations():
        if op.type in match.FUNCTION_CALL_TYPES and not inline.is_inlined(op):
            called = match.called_functions(op)
            if called & fused:
                found[0].append(op)
            if op.type in inline.CALL_TYPES and called & unfused:
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


def _reject_unfused_in_calls(calls: list, towers) -> None:
    """Refuses a tower's tf.function call whose body computes batch moments the unfused way and
    holds no fused batch norm to inline the call for: its gradient, when already built, is another
    call that sums nothing across towers, so inlining the forward alone would train wrong, and
    leaving it would train per tower in silence."""
    for op in calls:
        if tower_of(op.name, towers) is not None:
            raise GraphsyncError(
                f"{op.name} ({op.type}) computes batch statistics (tf.nn.moments, an unfused batch norm) inside "
                f"a tf.function, which graphsync cannot synchronize there: {inline.REMEDY}, or use fused batch norm")


def _layer_plan(name: str, per_tower, scopes) -> LayerPlan:
    missing = [t.label for t, cand in per_tower if cand is None]
    present = [cand.op for _, cand in per_tower if cand is not None]
    if missing:
        raise GraphsyncError(
            f"layer {name!r} ({present[0].name}) is missing from tower(s) {', '.join(missing)}: "
            "every tower must build the same layers (or pass towers= to choose the towers)")
    first, kind = present[0], per_tower[0][1].kind
    if kind == "conditional":
        from graphsync.conditional import layer_plan   # pylint: disable=import-outside-toplevel (a cycle)
        return layer_plan(name, per_tower)
    for op in present:
        if tf_private.in_while_loop(op):
            raise GraphsyncError(
                f"{op.name} sits inside a v1 tf.while_loop, which graphsync cannot rewrite: "
                "build the batch norm outside the loop")
    flags = {t.label: tf_private.cond_predicate(cand.op) for t, cand in per_tower}
    if any(f is not None for f in flags.values()):   # a v1 tf.cond around the op (a tensor training flag)
        from graphsync.conditional import check_one_flag, predicate   # pylint: disable=import-outside-toplevel
        check_one_flag(name, {label: predicate(f) if f is not None else None for label, f in flags.items()})
    attrs = [_signature(cand) for _, cand in per_tower]
    for op, sig in zip(present[1:], attrs[1:]):
        if sig != attrs[0]:
            diff = ", ".join(f"{k}: {attrs[0][k]} vs {sig[k]}" for k in sig if sig[k] != attrs[0][k])
            raise GraphsyncError(f"{first.name} and {op.name} are paired as layer {name!r} but differ ({diff})")
    rank = _input(per_tower[0][1]).shape.rank
    if rank is None:
        raise GraphsyncError(f"{first.name}: the rank of its input is unknown; set a static rank")
    if kind == "moments":
        sites = [Site(t, c.op, _moments_grads(c, scopes), c.parts) for t, c in per_tower]
        layout = Layout(rank, per_tower[0][1].parts["axes"])
        avg, epsilon = 1.0, 0.0
    else:
        sites = [Site(t, c.op, match.fused_gradient_ops(c.op)) for t, c in per_tower]
        layout = Layout.from_data_format(rank, first.get_attr("data_format").decode())
        avg = first.get_attr("exponential_avg_factor") if first.type == "FusedBatchNormV3" else 1.0
        epsilon = first.get_attr("epsilon")
    counts = {s.tower.label: len(s.grad_ops) for s in sites}
    if len(set(counts.values())) > 1:
        raise GraphsyncError(
            f"layer {name!r} has a different number of gradient calls per tower ({counts}): "
            "build gradients for every tower, or rewrite before building them")
    return LayerPlan(name, kind, sites, layout, epsilon, avg)


def _moments_grads(cand, scopes) -> list[MomentsGrad]:
    """The gradient calls through a moments subgraph, by the scope tf.gradients gave each."""
    mean_op, variance_op = cand.op, cand.parts["variance"]
    mean_calls, variance_calls = scopes.get(mean_op.name, {}), scopes.get(variance_op.name, {})
    grads = []
    for call in sorted(set(mean_calls) | set(variance_calls)):
        entries = []
        for op, calls in ((mean_op, mean_calls), (variance_op, variance_calls)):
            ops = calls.get(call, [])
            entry = match.gradient_entry(ops, list(op.inputs) + list(op.outputs)) if ops else None
            if not ops and "statistics" in cand.parts:   # a gradient handed on unchanged (Add, Sub)
                entry = match.passed_through_entry(op, call, scopes, cand.parts["statistics"])
                ops = [op] if any(scopes.get(t.op.name, {}).get(call) for t in op.inputs) else []
            if ops and entry is None:
                raise GraphsyncError(
                    f"cannot tell which tensor is the incoming gradient of {op.name} in {call}/: "
                    "rewrite before building the gradients")
            if entry is not None and "statistics" in cand.parts:
                entries += [entry, match.entry_readers(entry, call, scopes, cand.parts["statistics"])]
            else:
                entries += [entry, tuple(o for o in ops if entry is not None and entry in list(o.inputs))]
        shifted = cand.parts.get("shifted_mean")
        readers = tuple(o for o in scopes.get(cand.parts["square"].name, {}).get(call, [])
                        if any(t is shifted for t in o.inputs)) if shifted is not None else ()
        grads.append(MomentsGrad(call, *entries, readers))
    return grads


def _input(cand) -> tf.Tensor:
    """The activation a layer normalizes."""
    return cand.parts.get("x", cand.op.inputs[0])


def _signature(cand) -> dict:
    """The attributes paired ops must share."""
    op = cand.op
    if cand.kind == "moments":
        x = _input(cand)
        return {"kind": "moments", "axes": cand.parts["axes"], "dtype": x.dtype.name, "rank": x.shape.rank,
                "statistics shape": shapes.text(op.outputs[0].shape[1:]), "keep_dims": cand.parts["keep_dims"]}
    channels = shapes.dim(op.inputs[1].shape, 0) if op.inputs[1].shape.rank == 1 else None
    return {"kind": op.type, "channels": channels, "dtype": op.inputs[0].dtype.name,
            "rank": op.inputs[0].shape.rank, "epsilon": op.get_attr("epsilon"),
            "data_format": op.get_attr("data_format").decode(),
            "exponential_avg_factor": op.get_attr("exponential_avg_factor")
            if op.type == "FusedBatchNormV3" else 1.0}


def fingerprints(plan: Plan) -> list[str]:
    """One line per synchronized layer with what every worker process of a between-graph job must
    agree on (name, op, dtype, per-example shape, attributes, towers, gradient calls); the batch
    size is left out, workers may differ in it."""
    lines = []
    for layer in plan.layers:
        op = layer.sites[0].op
        x = layer.sites[0].parts.get("x", op.inputs[0])
        lines.append(f"{layer.name} {op.type} {x.dtype.name} {shapes.text(x.shape[1:])} "
                     f"axes={layer.layout.axes} eps={layer.epsilon:g} avg={layer.avg_factor:g} "
                     f"towers={len(layer.sites)} gradients={len(layer.sites[0].grad_ops)}")
    return lines


def digest(text: str) -> int:
    """A stable 63-bit digest (the same in every process, unlike hash())."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def default_device(op: tf.Operation) -> str:
    """The CPU of the host of the first tower, as in the seed's hand-written version."""
    spec = tf.DeviceSpec.from_string(op.device or "")
    return spec.replace(device_type="CPU", device_index=0).to_string()
