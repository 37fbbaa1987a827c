"""Moving edges from old tensors and ops to their replacements, with dtype and shape checked."""
from __future__ import annotations

import tensorflow as tf

from graphsync import tf_private


def reroute_consumers(old: tf.Tensor, new: tf.Tensor, only=None) -> int:
    """Makes every consumer of `old` (or those in `only`) read `new`; returns the edges moved."""
    if old.dtype != new.dtype:
        raise TypeError(f"cannot reroute {old.name} ({old.dtype.name}) to {new.name} ({new.dtype.name})")
    new.set_shape(old.shape)
    moved = 0
    for consumer in (old.consumers() if only is None else only):
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                tf_private.update_input(consumer, index, new)
                moved += 1
    return moved


def reroute_control_outputs(old: tf.Operation, new: list) -> int:
    """Makes every op that waited for `old` wait for the ops in `new` instead (the `group_deps`
    NoOps `tf.gradients` adds would otherwise keep the old op running)."""
    waiting = tf_private.control_outputs(old)
    for op in waiting:
        tf_private.replace_control_input(op, old, new)
    return len(waiting)
