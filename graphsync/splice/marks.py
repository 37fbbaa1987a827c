"""The statistics each tower of a synchronized layer reads, marked in the graph for `graphsync verify`.

verify judges a rewritten graph layer by layer, by the statistics each layer normalizes with
(graphsync/verification/discovery/layer_statistics.py). In a saved graph nothing else says which
tensors those are: what the exchange hands a tower differs by strategy, form and transport. So the
splice marks, per layer and tower, an op whose inputs are exactly what the tower's readers now read
(μ and σ² of a fused or moments layer, a reduction's value): a fused layer's normalization, which
reads μ and σ² itself, carries the mark (`attributes`, given when it is made: no op more); other
forms get one unread `IdentityN`, `<op>_sync/statistics_read` (`mark`), that no step runs
(TensorFlow runs only what a fetch reaches) and no gradient passes through. The attributes name the
layer, its form, each statistic with the input that holds it, the tower (`towers` reads them back:
structure found the towers of a graph whose batch norms the rewrite has since replaced), and the
normalization the layer is part of with how it was found (a batch norm written by hand is several
reduction layers: graphsync/plan/normalizations.py; `normalization_of`). A recomputed copy of a marked op does not
carry the mark (graphsync/splice/recompute.py): each tower reads its statistics once.

Every other op the splice makes for a layer carries the layer's name too (`made_for_layer`): verify
leaves graphsync's own batch-norm ops out of the towers' by that mark, not by their `_sync` names.
"""
from __future__ import annotations

import functools

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.graph.tf_private import create_op, marked, pristine_scope
from graphsync.towers.scopes import Tower

MARK = "statistics_read"
_FORWARD, _BACKWARD = (marks.value(d.value) for d in (marks.Direction.FORWARD, marks.Direction.BACKWARD))


def attributes(layer, site, statistics: dict) -> dict:
    """The mark's attributes (attribute name → AttrValue) for an op that reads the statistics of
    tower `site` of `layer` (a LayerPlan): `statistics` maps what each is ("mean", "variance",
    "sum", …) to the index of the input that holds it."""
    return {Mark.LAYER.value: marks.value(layer.name),
            Mark.TOWER.value: marks.value(f"{site.tower.index}:{site.tower.prefix}"),
            Mark.FORM.value: marks.value(layer.shown_kind.value),
            Mark.STATISTICS.value: marks.value(",".join(f"{what}:{i}" for what, i in statistics.items())),
            # the normalization the layer is part of (plan/normalizations.py), and how it was found
            Mark.NORMALIZATION.value: marks.value(layer.normalization or layer.name),
            Mark.FOUND_AS.value: marks.value(layer.found_as or layer.shown_kind.value)}


def mark(graph: tf.Graph, layer, site, **statistics: tf.Tensor) -> tf.Operation:
    """Marks what tower `site` of `layer` now reads, by an `IdentityN` of the `statistics` (what
    each is → the tensor), where no op the splice makes reads them all."""
    tensors = list(statistics.values())
    attrs = {"T": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                 type=[t.dtype.as_datatype_enum for t in tensors])),
             **attributes(layer, site, {what: i for i, what in enumerate(statistics)})}
    with pristine_scope(graph, site.device, site.op.name + "_sync"):
        return create_op(graph, "IdentityN", tensors, attrs, MARK)


def is_mark(op: tf.Operation) -> bool:
    return marks.has(op, Mark.STATISTICS)


def towers(graph: tf.Graph) -> list[Tower]:
    """The towers the marks name, in index order: those of the rewrite that made them (none in a
    graph not rewritten, or rewritten by a graphsync that did not mark them)."""
    found = set()
    for op in graph.get_operations():
        if marks.has(op, Mark.TOWER):
            index, _, prefix = marks.text(op, Mark.TOWER).partition(":")
            found.add(Tower(int(index), prefix))
    return sorted(found, key=lambda tower: tower.index)


def made_for_layer(splice):
    """Decorates splice(graph, layer, …): every op it makes carries `Mark.LAYER` and `Mark.PASS`,
    forward unless made inside a `made_for_backward` function (the exchange's add their
    direction, graphsync/exchange/marking.py)."""
    @functools.wraps(splice)
    def marking_splice(graph: tf.Graph, layer, *args, **kwargs):
        with marked(graph, {Mark.LAYER.value: marks.value(layer.name), Mark.PASS.value: _FORWARD}):
            return splice(graph, layer, *args, **kwargs)
    return marking_splice


def made_for_backward(splice_backward):
    """Decorates a splice's backward part, splice_backward(graph, layer, …): every op it makes
    carries `Mark.PASS` "backward"."""
    @functools.wraps(splice_backward)
    def marking_backward(graph: tf.Graph, *args, **kwargs):
        with marked(graph, {Mark.PASS.value: _BACKWARD}):
            return splice_backward(graph, *args, **kwargs)
    return marking_backward


def read(op: tf.Operation) -> tuple[str, str, dict]:
    """(layer name, form, {what: tensor}) of a mark (a statistic without an input index is the
    input at its position: marks written before fused normalizations carried them)."""
    statistics = {}
    for position, entry in enumerate(marks.text(op, Mark.STATISTICS).split(",")):
        what, _, index = entry.partition(":")
        statistics[what] = op.inputs[int(index) if index else position]
    return marks.text(op, Mark.LAYER), marks.text(op, Mark.FORM), statistics


def normalization_of(op: tf.Operation) -> tuple[str, str]:
    """(normalization name, how it was found) of a mark; a mark without them is its own layer."""
    name, form, _ = read(op)
    normalization = marks.text(op, Mark.NORMALIZATION) if marks.has(op, Mark.NORMALIZATION) else name
    found_as = marks.text(op, Mark.FOUND_AS) if marks.has(op, Mark.FOUND_AS) else form
    return normalization, found_as
