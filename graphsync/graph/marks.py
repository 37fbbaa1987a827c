"""Node attributes graphsync puts on the ops it makes, read by stages other than the one that set
them: a mark says what an op is, where a name could be mistaken for the user's.

    RECOMPUTED   a forward op copied to run late, in the backward (graphsync/splice/recompute.py and
                 segments.py): forward arithmetic, although only the backward reads it
                 (graphsync/graph/backward.py never counts it in the backward)
"""
from __future__ import annotations

import tensorflow as tf

RECOMPUTED = "_graphsync_recompute"


def is_recomputed(op: tf.Operation) -> bool:
    return RECOMPUTED in op.node_def.attr
