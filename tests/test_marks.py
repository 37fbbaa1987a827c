"""graphsync finds its own ops by their marks (graphsync/graph/marks.py), never by parsing their
names back; the names stay what TensorBoard shows. On a small model rewritten by each strategy,
before and after its gradients: every op named as an exchange's (`graphsync/<layer>/forward…/`,
`<tower><layer>_sync/backward…/`) carries that layer and direction, no other op does, and the
marks survive a MetaGraphDef's export and import.
"""
from __future__ import annotations

import re

import pytest
import tensorflow as tf

import graphsync
import models
import towerlib as tl
from graphsync.graph import marks
from graphsync.graph.backward import is_backward
from graphsync.verification import trace

pytestmark = pytest.mark.plumbing   # tiers.py: builds graphs, runs none

tf1 = tf.compat.v1
_GATHERED = re.compile(r"^graphsync/(?P<layer>.+?)/(?P<phase>forward|backward)(?:_\d+)?[^/]*/")
_IN_TOWER = re.compile(r"^tower_\d+/(?P<layer>.+?)_sync/(?P<phase>forward|backward)(?:_\d+)?[^/]*/")


def _named(op):
    """(layer, direction) an op's name says, as graphsync's readers parsed it before the marks."""
    found = _GATHERED.match(op.name) or _IN_TOWER.match(op.name)
    return (found.group("layer"), found.group("phase")) if found else None


def _marked(op):
    found = marks.exchanged(op)
    return (found[0], found[1].value) if found else None


@pytest.mark.parametrize("strategy", ["gather", "allreduce"])
@pytest.mark.parametrize("gradients", ["after", "before"])
def test_marks_say_what_the_names_say_and_survive_a_saved_graph(strategy, gradients):
    built = tl.build(models.resnetish(depth=2), [3, 5], gradients=gradients,
                     rewrite=lambda g: graphsync.rewrite_towers(g, strategy=strategy))
    ops = built.graph.get_operations()
    named = {op.name: _named(op) for op in ops if _named(op)}
    assert {layer for layer, _ in named.values()} == {"bn0_1", "bn1_1"}
    assert {direction for _, direction in named.values()} == {"forward", "backward"}
    assert {op.name: _marked(op) for op in ops if _marked(op)} == named
    if gradients == "after":   # no tf.gradients call after the rewrite: every such op is the splice's
        assert all(marks.made_by_graphsync(op) for op in ops
                   if "_sync" in op.name or re.match(r"graphsync/(?!constants/)", op.name))
    # every op made for a layer says which pass of the step it is for (an exchange's: its
    # direction), and no op marked forward is one the gradient's seed reaches (graph/backward.py)
    made = [op for op in ops if marks.made_by_graphsync(op)]
    passes = {op.name: marks.pass_of(op) for op in made}
    assert None not in passes.values() and set(passes.values()) == set(marks.Direction), passes
    assert all(passes[name].value == direction for name, (_, direction) in named.items())
    assert not [op.name for op in made if passes[op.name] is marks.Direction.FORWARD and is_backward(op)]

    exported = tf1.train.export_meta_graph(graph=built.graph)
    imported = tf.Graph()
    with imported.as_default():
        tf1.train.import_meta_graph(exported)
    assert {name: (e.layer, e.direction) for name, e in trace.exchanges(imported).items()} == named
