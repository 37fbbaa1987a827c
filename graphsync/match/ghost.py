"""Ghost batch norm (`virtual_batch_size=k` of tf.compat.v1.layers.batch_normalization and the
tf_keras layer): statistics of sub-batches of k examples, on purpose, never to be merged.

The layer reshapes the batch [B, d1, …] to [k, B/k, d1, …] and takes moments over axis 0 and the
others but axis 1, so each of the B/k sub-batches keeps its own statistics. Recognized by that
structure: a Reshape that adds one axis in front whose trailing dimensions are the input's
per-example ones, and statistics over axis 0 that keep axis 1.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import shapes
from graphsync.match.candidate import PerTower


def virtual_batch_size(x: tf.Tensor, axes: tuple) -> int | str | None:
    """k when statistics of `x` over `axes` are ghost batch norm ("?" if k is not static), else None."""
    op = x.op
    if op.type != "Reshape" or 0 not in axes or 1 in axes:
        return None
    source = op.inputs[0]
    rank = source.shape.rank
    if rank is None or x.shape.rank != rank + 1 or not x.shape[2:].is_compatible_with(source.shape[1:]):
        return None
    k = shapes.dim(x.shape, 0)
    return int(k) if k is not None else "?"


def reason(k) -> PerTower:
    return PerTower(f"ghost batch norm (virtual_batch_size={k}): normalizes sub-batches by design")
