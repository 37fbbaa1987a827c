"""TensorBoard: the (rewritten) graph written to an event file, so that `tensorboard --logdir`
shows each synchronized layer's aggregation as one box in its `graphsync/<layer>/` scope, and, for a
rewrite, the synchronized layers as a table in its Text dashboard (`graphsync/layers`): one row per
normalization, as the rewrite's report counts them, a batch norm written by hand with the
reductions it was synchronized as (graphsync/plan/normalizations.py).
"""
from __future__ import annotations

import os

import tensorflow as tf

from graphsync.io.errors import GraphFileError

LAYERS_TAG = "graphsync/layers"
COLUMNS = ("layer", "kind", "found as", "reductions", "towers")


def write_event_file(graph: tf.Graph, logdir: str, layers=()) -> str:
    """Writes `graph` to a new TensorBoard event file in `logdir`; returns the file's path. With
    `layers` (a RewriteReport's), also the `graphsync/layers` text summary listing them."""
    try:
        os.makedirs(logdir, exist_ok=True)
        before = set(os.listdir(logdir))
        with graph.as_default():
            writer = tf.compat.v1.summary.FileWriter(logdir, graph=graph)
            if layers:
                writer.add_summary(_layers_summary(layers), 0)
            writer.flush()
            writer.close()
        written = sorted(set(os.listdir(logdir)) - before)
    except (OSError, tf.errors.OpError) as exc:
        raise GraphFileError(f"cannot write the TensorBoard log to {logdir}: "
                             f"{getattr(exc, 'strerror', None) or getattr(exc, 'message', exc)}") from None
    return os.path.join(logdir, written[-1]) if written else logdir


def _layers_summary(layers) -> tf.compat.v1.Summary:
    """A 2-D string tensor for the Text dashboard (header row first), one row per layer."""
    rows = [list(COLUMNS)] + [[layer.name, layer.kind.value, layer.found_as, ", ".join(layer.reductions),
                               str(len(layer.tower_ops))] for layer in layers]
    metadata = tf.compat.v1.SummaryMetadata(plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="text"))
    value = tf.compat.v1.Summary.Value(tag=LAYERS_TAG, metadata=metadata,
                                       tensor=tf.make_tensor_proto(rows, dtype=tf.string))
    return tf.compat.v1.Summary(value=[value])


def listed_layers(event_file: str) -> list[dict]:
    """The rows of the `graphsync/layers` summary in `event_file` ({column: value}; reductions a
    tuple), none when it holds none."""
    for event in tf.compat.v1.train.summary_iterator(event_file):
        for value in event.summary.value:
            if value.tag == LAYERS_TAG:
                header, *rows = tf.make_ndarray(value.tensor).tolist()
                found = [dict(zip((h.decode() for h in header), (c.decode() for c in row))) for row in rows]
                return [{**row, "reductions": tuple(r for r in row["reductions"].split(", ") if r)} for row in found]
    return []
