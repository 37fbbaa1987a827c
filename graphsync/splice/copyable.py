"""What a recompute may copy, and what it holds: activation-sized tensors (`is_activation`), ops
that run again to the forward's values without touching a statistic, a variable or another
device's step (`is_copyable`), and ops still read (`is_read`). Read alike by the segments' regions
and edit (graphsync/splice/segments.py) and by their memory cost model (segment_cost.py)."""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import tf_private
from graphsync.graph.op_types import FUSED_BATCH_NORM_TYPES

_LOOP_TYPES = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration",
                         "LoopCond"})
_BATCH_REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm"})
_FUSED = frozenset(FUSED_BATCH_NORM_TYPES)


def is_activation(t: tf.Tensor) -> bool:
    """Whether `t` is activation-sized: more elements than its largest dimension (a per-channel
    statistic, a scalar or a shape is not), or of a size not known when the graph was built."""
    n = t.shape.num_elements()
    if n is None:
        return True
    dims = [d for d in t.shape.as_list()] if t.shape.rank else []
    return n > max(dims + [1])


def is_copyable(op: tf.Operation) -> bool:
    """Whether running `op` again gives the forward's values without touching a statistic, a
    variable or another device's step."""
    if not op.inputs or op.op_def.is_stateful or op.type in _LOOP_TYPES:
        return False   # a source (a placeholder, a constant) is kept, not run again
    if any(t.dtype in (tf.resource, tf.variant) or t.dtype != t.dtype.base_dtype for t in op.inputs):
        return False   # a variable read again could see another value; a variant holds state
    if op.type in _FUSED:
        return not op.get_attr("is_training")
    if op.type in _BATCH_REDUCTIONS:
        axes = tf.get_static_value(op.inputs[1])
        rank = op.inputs[0].shape.rank
        return axes is not None and rank is not None and 0 not in {int(a) % rank for a in axes.ravel()}
    return True


def is_read(op: tf.Operation) -> bool:
    """Whether anything reads `op` (a gradient op the rewrite replaced is left unread, and never runs)."""
    return any(t.consumers() for t in op.outputs) or bool(tf_private.control_outputs(op))
