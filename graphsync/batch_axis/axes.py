"""What the rules of several families read: the one input that carries the batch, a tensor's
rank, axes given by a constant input."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync.batch_axis.registry import End


def rank_of(tensor):
    return tensor.shape.rank


def only(ins, index, op):
    """The batch axes of input `index`; the trace ends if another input carries the batch."""
    if any(a for i, a in enumerate(ins) if i != index):
        raise End(f"{op.type} reads the batch on an input it does not carry it from")
    return ins[index]


def const_axes(tensor, rank):
    """The axes a constant `tensor` names, each in [0, rank) (negative ones counted from the end)."""
    value = tf.get_static_value(tensor)
    if value is None:
        raise End("its axes are not constant")
    axes = [int(a) for a in np.ravel(value)]
    if rank is None:
        if any(a < 0 for a in axes):
            raise End("negative axes of a tensor of unknown rank")
        return frozenset(axes)
    return frozenset(a % rank for a in axes) if rank else frozenset()
