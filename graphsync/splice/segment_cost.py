"""The memory cost model of recompute="segments" (graphsync/splice/segments.py): where to cut a
tower's layers into segments. A region's cost is the bytes its recomputed activations hold until the
backward reads them (`region_bytes`); a cut's, its estimated peak (`peak`): over segments, what one
segment recomputes plus every checkpoint it or an earlier segment reads from another, kept from the
forward until then. `cut` picks the least peak among a few candidate cuts. Apart from the edit so
that it can be read, and tested, on its own: it estimates, it changes nothing."""
from __future__ import annotations

import math

import tensorflow as tf

from graphsync.graph.backward import is_backward
from graphsync.graph.op_types import SHAPE_TYPES
from graphsync.splice.copyable import is_activation, is_copyable, is_read

_SHAPE_TYPES = frozenset(SHAPE_TYPES)


def cut(regions: list) -> list:
    """Where segments begin, as layers' indices: of greedy cuts at a ladder of segment sizes and
    of cuts every k layers (Chen et al.'s √n is one), the one whose estimated peak is least. A
    segment's backward holds its recomputed activations and every checkpoint not yet consumed:
    what it and the segments before it read from outside themselves (`peak`)."""
    if not regions:
        return []
    sizes = [region_bytes(r) for r in regions]
    total, largest = sum(sizes), max(sizes)
    candidates = [list(range(0, len(regions), k)) for k in range(1, len(regions) + 1)]
    for limit in {largest * (total / largest) ** (k / 24) for k in range(25)} if largest else ():
        firsts, segment = [0], 0
        for i, size in enumerate(sizes):
            if i and segment + size > limit:
                firsts.append(i)
                segment = 0
            segment += size
        candidates.append(firsts)
    return min(candidates, key=lambda firsts: (peak(regions, sizes, firsts), len(firsts)))


def peak(regions: list, sizes: list, firsts: list) -> int:
    """The estimated peak of a cut: over segments, its recomputed bytes plus every activation that
    it or an earlier segment reads from another segment (kept from the forward until then)."""
    kept, highest, forward = {}, 0, set().union(*regions)
    for first, end in zip(firsts, firsts[1:] + [len(regions)]):
        region = set().union(*regions[first:end])
        kept.update((t.ref(), tensor_bytes(t)) for op in region for t in op.inputs
                    if t.op not in region and t.op in forward and is_activation(t))   # not weights, not data
        highest = max(highest, sum(kept.values()) + sum(sizes[first:end]))
    return highest


def region_bytes(region: set) -> int:
    """What recomputing `region` holds until the backward reads it: the activations the backward
    reads (an op between them usually reuses its input's buffer), a batch of one where unknown.
    Before the gradients exist, every activation the region computes: what they will read."""
    differentiated = any(is_backward(c) for op in region for t in op.outputs for c in t.consumers())
    return sum(tensor_bytes(t) for op in region if is_copyable(op) for t in op.outputs
               if is_activation(t) and (not differentiated or any(
                   is_backward(c) and c.type not in _SHAPE_TYPES and is_read(c) for c in t.consumers())))


def tensor_bytes(t: tf.Tensor) -> int:
    """The bytes `t` holds, a dimension of unknown size counted as one (a batch of one)."""
    dims = t.shape.as_list() if t.shape.rank is not None else [None]
    return math.prod(1 if d is None else d for d in dims) * max(t.dtype.size, 1)
