"""Every batch-norm layer of the towers and, per tower, the statistics it normalizes with: what
verify judges layer by layer.

A layer's statistics are where synchronization shows first and cleanest. Moving examples between
towers leaves global statistics unchanged up to the rounding of a few sums, and changes per-tower
ones by the spread of the examples moved; rounding has grown through the fewest layers there,
unlike at the loss or the gradients, which a deep model at initialization can move by 1e-1 by
reordering examples alone.

Two sources, one list in forward order:
- synchronized layers: the marks the splice leaves (graphsync/splice/marks.py) name the layer and
  the tensors each tower now reads (μ and σ², or a reduction's value);
- layers still per tower: the planner, run on the graph as a rewrite would (nothing is changed),
  finds every batch norm and batch statistic it would synchronize: a fused op's batch mean and
  biased variance (its reserve outputs), a moments layer's mean and variance, a reduction's value.
Each layer also gets the moving-statistics writes its statistics feed (the nearest layer above a
write's value), so that its update is judged with it.
"""
from __future__ import annotations

import collections
import dataclasses
import warnings

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.graph import order
from graphsync.match.layer_form import LayerForm
from graphsync.plan.options import RewriteOptions
from graphsync.plan.planner import make_plan
from graphsync.splice import marks
from graphsync.towers.scopes import Tower, tower_of

_UPDATE_DEPTH = 8   # ops between a moving-statistics write's value and the statistic it averages


@dataclasses.dataclass
class LayerStatistics:
    """One layer in every tower: what each statistic is, and its tensor in each tower."""

    name: str                    # as the rewrite names it: the op's name relative to its tower, or the
                                 # normalization's name when several reductions make one
    form: LayerForm              # as reports show it (a normalization of several reductions: REDUCTION)
    synchronized: bool           # marked by the splice, else found per tower by the planner
    statistics: dict             # what it is ("mean", "variance", "sum", …) → [tensor name per tower]
    updates: list = dataclasses.field(default_factory=list)   # judged writes' values it feeds
    members: list = dataclasses.field(default_factory=list)   # a normalization's reductions (their layer names)
    normalization: tuple = ()    # (the normalization it belongs to, how it was found), until grouped
    found_as: str = ""           # for display only: how a normalization of several reductions was found

    @property
    def shown_as(self) -> str:
        """What verify shows as the layer's form: how a normalization of several reductions was
        found ("reductions: mean + mean of squares"), else its form."""
        return self.found_as or self.form.value

    @property
    def tensors(self) -> list[str]:
        return [name for names in self.statistics.values() for name in names]


def find(graph: tf.Graph, towers: list[Tower], tower_option, updates: list[str], notes: list) -> list[LayerStatistics]:
    """The layers of `graph`'s towers in forward order (`tower_option` as the user gave --towers,
    for the planner); `updates` are the judged writes' values, given to the layers they average."""
    layers = _marked(graph, towers) + _per_tower(graph, tower_option, notes)
    layers = [layer for layer in layers if all(graph.is_fetchable(graph.get_tensor_by_name(n).op)
                                               for n in layer.tensors)]
    layers = _normalizations(graph, layers)
    first = {id(layer): graph.get_tensor_by_name(layer.tensors[0]).op for layer in layers}
    layers = order.in_forward_order(layers, lambda layer: first[id(layer)])
    _attach_updates(graph, layers, updates)
    return layers


def _marked(graph: tf.Graph, towers: list[Tower]) -> list[LayerStatistics]:
    by_layer: dict = collections.defaultdict(list)
    for op in graph.get_operations():
        if marks.is_mark(op):
            name, form, statistics = marks.read(op)
            tower = tower_of(op.name, towers)
            by_layer[name, form, marks.normalization_of(op)].append(
                (tower.index if tower is not None else len(towers), statistics))
    layers = []
    for (name, form, (normalization, found_as)), sites in by_layer.items():
        sites.sort(key=lambda item: item[0])
        what = list(sites[0][1])
        layers.append(LayerStatistics(name, LayerForm(form), True, {w: [s[w].name for _, s in sites] for w in what},
                                      normalization=(normalization, found_as)))
    return layers


def _per_tower(graph: tf.Graph, tower_option, notes: list) -> list[LayerStatistics]:
    """What a rewrite of this graph would synchronize: the layers still per tower."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = make_plan(graph, RewriteOptions(towers=tower_option), refuse=False)
    except GraphsyncError as exc:
        notes.append(f"layers left per tower not looked for: {exc}")
        return []
    if plan.calls:
        notes.append(f"{len(plan.calls)} tf.function calls in the towers hold batch norms: their layers are "
                     "judged end to end only (rewrite inlines them)")
    return [LayerStatistics(layer.name, layer.shown_kind, False,
                            {what: [t.name for t in tensors] for what, tensors in _site_statistics(layer).items()},
                            normalization=(layer.normalization_name, layer.found_as or layer.shown_kind.value))
            for layer in plan.layers]


def _normalizations(graph: tf.Graph, layers: list[LayerStatistics]) -> list[LayerStatistics]:
    """One entry per normalization: the reductions the plan grouped into one (a mean and
    reduce_variance written by hand, weighted moments) become one layer, whose statistics are
    theirs, each named "what (reduction)"."""
    grouped: dict = collections.defaultdict(list)
    for layer in layers:
        grouped[layer.normalization[0], layer.synchronized].append(layer)
    found = []
    for (normalization, synchronized), parts in grouped.items():
        if len(parts) == 1 and parts[0].name == normalization:
            found.append(parts[0])
            continue
        prefix = normalization + "/"
        statistics = {f"{what} ({part.name[len(prefix):] if part.name.startswith(prefix) else part.name})": tensors
                      for part in parts for what, tensors in part.statistics.items()}
        found.append(LayerStatistics(normalization, parts[0].form, synchronized, statistics,
                                     members=[part.name for part in parts], normalization=parts[0].normalization,
                                     found_as=parts[0].normalization[1]))
    return found


def _site_statistics(layer) -> dict:
    """What → [tensor per tower] for a planned layer: what each tower's readers read now."""
    found: dict = collections.defaultdict(list)
    for site in layer.sites:
        for what, tensor in layer.form.statistics(site).items():
            found[what].append(tensor)
    return {what: tensors for what, tensors in found.items() if len(tensors) == len(layer.sites)}


def _attach_updates(graph: tf.Graph, layers: list[LayerStatistics], updates: list[str]) -> None:
    """Each write's value goes to the layer whose statistic is nearest above it (within
    _UPDATE_DEPTH ops): AssignMovingAvg's (v − s)·(1 − decay), a fused op's own moving output."""
    layer_of = {}
    for layer in layers:
        for name in layer.tensors:
            layer_of.setdefault(graph.get_tensor_by_name(name).op, layer)
    for value in updates:
        frontier, seen = [graph.get_tensor_by_name(value).op], set()
        for _ in range(_UPDATE_DEPTH):
            hit = next((layer_of[op] for op in frontier if op in layer_of), None)
            if hit is not None:
                hit.updates.append(value)
                break
            seen.update(frontier)
            frontier = [t.op for op in frontier for t in op.inputs if t.op not in seen]
