"""Static shapes as plain Python ints and None, whichever TensorFlow behaviour built the graph.

Under `tf.compat.v1.disable_v2_behavior()` (or `disable_v2_tensorshape()`) a TensorShape is made
of Dimension objects: indexing it gives Dimension(None), not None, so `d is None` is False, two
unknown dimensions compare equal to None rather than True, Dimension is unhashable (no cache or
set key), and str() spells unknown sizes '?'. What graphsync reads of a static shape for keys,
comparisons, fingerprints or arithmetic goes through here, so no code path depends on that switch.
"""
from __future__ import annotations

import tensorflow as tf


def dim(shape: tf.TensorShape, index: int) -> int | None:
    """The size of one axis (None where unknown)."""
    return tf.compat.dimension_value(shape[index])


def dims(shape: tf.TensorShape) -> tuple | None:
    """Every axis's size (None where unknown), or None for an unknown rank."""
    return None if shape.rank is None else tuple(shape.as_list())


def text(shape: tf.TensorShape) -> str:
    """'(None, 3)' as TensorFlow 2 prints it, '<unknown>' for an unknown rank."""
    sizes = dims(shape)
    if sizes is None:
        return "<unknown>"
    return "(" + ", ".join(map(str, sizes)) + ("," if len(sizes) == 1 else "") + ")"
