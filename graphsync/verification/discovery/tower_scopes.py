"""Which towers verify exchanges examples between, and which tower each op of the model belongs to."""
from __future__ import annotations

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.plan.options import RewriteOptions
from graphsync.plan.planner import make_plan
from graphsync.splice import marks as splice_marks
from graphsync.towers.scopes import ROOT, Tower, find_towers, tower_of


def find(graph: tf.Graph, towers) -> list[Tower]:
    """The rewrite's towers (or those --towers names); at least two: as a rewrite would find
    them, else as the one that rewrote the graph marked them, else by their names."""
    found = []
    try:
        found = make_plan(graph, RewriteOptions(towers=towers)).towers
    except GraphsyncError:
        pass
    if len(found) < 2 and towers is None:
        found = splice_marks.towers(graph)
    if len(found) < 2:
        found = find_towers([op.name for op in graph.get_operations()], towers)
    if len(found) < 2:
        what = "no towers" if not found else f"a single tower ({found[0].label})"
        raise GraphsyncError(f"found {what}: verify exchanges examples between towers (expected name "
                             "scopes like tower_0/, tower_1/; name yours with --towers REGEX)")
    return found


def membership(graph: tf.Graph, towers: list[Tower]):
    """op → the tower whose model it belongs to, or None for what the towers share (input
    splitting, gradient averaging, graphsync's aggregation: `Mark.AGGREGATION`).

    A tower with a name scope owns the ops in it. When the root is a tower (MirroredStrategy leaves
    replica 0 unscoped), it owns the root ops that have a counterpart in another tower (the same
    name under that tower's scope): a root `split` or `IteratorGetNext_1` is shared, a root
    `conv2d/Conv2D` next to `replica_1/conv2d/Conv2D` is replica 0's."""
    scoped = [t for t in towers if t.prefix != ROOT]
    root = next((t for t in towers if t.prefix == ROOT), None)
    counterparts = set()
    if root is not None:
        for op in graph.get_operations():
            tower = tower_of(op.name, scoped)
            if tower is not None:
                counterparts.add(op.name[len(tower.prefix):])

    def tower_of_op(op: tf.Operation) -> Tower | None:
        if marks.has(op, Mark.AGGREGATION):
            return None
        tower = tower_of(op.name, scoped)
        if tower is not None:
            return tower
        return root if root is not None and op.name in counterparts else None

    return tower_of_op
