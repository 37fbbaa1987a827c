"""TensorBoard: the (rewritten) graph written to an event file, so that `tensorboard --logdir`
shows each synchronized layer's aggregation as one box in its `graphsync/<layer>/` scope.
"""
from __future__ import annotations

import os

import tensorflow as tf

from graphsync.io.errors import GraphFileError


def write_event_file(graph: tf.Graph, logdir: str) -> str:
    """Writes `graph` to a new TensorBoard event file in `logdir`; returns the file's path."""
    try:
        os.makedirs(logdir, exist_ok=True)
        before = set(os.listdir(logdir))
        with graph.as_default():
            writer = tf.compat.v1.summary.FileWriter(logdir, graph=graph)
            writer.flush()
            writer.close()
        written = sorted(set(os.listdir(logdir)) - before)
    except (OSError, tf.errors.OpError) as exc:
        raise GraphFileError(f"cannot write the TensorBoard log to {logdir}: "
                             f"{getattr(exc, 'strerror', None) or getattr(exc, 'message', exc)}") from None
    return os.path.join(logdir, written[-1]) if written else logdir
