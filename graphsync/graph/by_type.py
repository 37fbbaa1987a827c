"""A graph's ops grouped by type, listed once per graph version.

Each batch-norm form, the analysis' seeds and the planner's look for calls start from a few op
types; each walking all of a 30,000-op graph (`op.type` is a call into TensorFlow's C API per op)
cost more than the matching itself. Ops are never removed from a graph and never change type,
so the grouping holds until the graph's version (the number of ops created) moves on, and then
only the ops created since need reading.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable

import tensorflow as tf

from graphsync.graph import tf_private

_grouped = weakref.WeakKeyDictionary()   # graph → (graph.version, {op type: [ops in creation order]})


def ops_of_types(graph: tf.Graph, types: Iterable[str]) -> list[tf.Operation]:
    """The graph's ops of these types, in creation order (the order get_operations() lists them)."""
    by_type = _by_type(graph)
    found = [op for t in set(types) for op in by_type.get(t, ())]
    return sorted(found, key=tf_private.creation_order)


def grouped(graph: tf.Graph) -> dict:
    """{op type: the graph's ops of it, in creation order}, up to date (read-only: shared)."""
    return _by_type(graph)


def _by_type(graph: tf.Graph) -> dict:
    """The grouping of `graph`'s ops, brought up to date with the ops created since it was made
    (a rewrite asks again after each of its stages: only the new ops are read)."""
    cached = _grouped.get(graph)
    if cached is not None and cached[0] == graph.version:
        return cached[1]
    by_type, new_ops = ({}, graph.get_operations()) if cached is None else \
        (cached[1], tf_private.ops_added_since(graph, cached[0]))
    for op in new_ops:
        by_type.setdefault(op.type, []).append(op)
    _grouped[graph] = (graph.version, by_type)
    return by_type
