"""What verify reads and shows: the graph from any source, and each input as the report lists it."""
from __future__ import annotations

import os

import tensorflow as tf

from graphsync.verification import data
from graphsync.verification.discovery.inputs import Feed


def load(graph, tags):
    """(label, tf.Graph, names in its `losses` collection) for a graph, a path or a LoadedGraph."""
    from graphsync import io  # noqa: PLC0415 (graphsync.io imports more than verify needs up front)

    if isinstance(graph, tf.Graph):
        collection = [t.name for t in graph.get_collection(tf.compat.v1.GraphKeys.LOSSES)
                      if isinstance(t, tf.Tensor)]
        return "graph", graph, collection
    loaded = graph if isinstance(graph, io.LoadedGraph) else io.load(os.fspath(graph), tags)
    collection = []
    meta = loaded.meta_graph
    if meta is not None and tf.compat.v1.GraphKeys.LOSSES in meta.collection_def:
        collection = list(meta.collection_def[tf.compat.v1.GraphKeys.LOSSES].node_list.value)
    return loaded.path, loaded.graph, collection


def describe(item, batch) -> dict:
    """One input as the report shows it: the shape fed to each tensor, and where it was found."""
    per_example = [data.UNKNOWN_DIM if d is None else d for d in item.example_shape]
    sizes = "|".join(str(n) for n in sorted(set(batch.sizes), key=batch.sizes.index))
    examples = sizes if item.kind is Feed.PER_TOWER else batch.examples
    shape = per_example if item.kind is Feed.FIXED else [examples] + per_example
    value = item.value.tolist() if item.kind is Feed.FIXED and hasattr(item.value, "tolist") else None
    return {"name": item.label, "kind": item.kind, "dtype": item.dtype.name,
            "shape": "[" + ", ".join(str(d) for d in shape) + "]",
            "classes": item.classes, "classes_from": item.classes_from, "value": value, "origin": item.origin}
