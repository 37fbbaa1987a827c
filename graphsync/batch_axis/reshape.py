"""Reshapes: where the batch axes go when a tensor is regrouped. A reshape that splits the batch
into several axes carries it on all of them (a reduction over some of those is partial: ghost
batch norm's virtual batches); one that merges it with other axes carries it on the merged axis."""
from __future__ import annotations

import numpy as np

from graphsync.batch_axis.axes import only
from graphsync.batch_axis.registry import End, register
from graphsync.batch_axis.shape_factors import dim_factors, shape_value
from graphsync.graph import shapes

_BATCH_PROBE = 720720   # an unknown batch size divisible by 2…16: a split into k virtual batches divides it
_OTHER_PROBES = (17, 19, 23, 29, 31, 37, 41, 43)


@register("reshape", "Reshape")
def _reshape(op, ins, context):
    """Where the batch axes go through a reshape. Its static shapes first (a constant shape, at
    most one unknown dimension: the probe sizes below), unless it can be read by structure
    (`_by_factors`): a shape computed at run time (tf.tensordot's, on an unknown batch size, from
    `Shape` ops) is read as products of the dimensions it gathers, and an input made by a merging
    reshape as the axes it merged, so that [N, H, W, C] → [N·H·W, C] → [N, H, W, C] carries the
    batch on N alone again (the probes, on the merged axis alone, would keep it on N, H and W).
    The dimensions a computed shape reads are matched against the batch axes traced so far
    (`context.batch`)."""
    axes = only(ins, 0, op)
    found = _by_factors(op, axes, context.batch)   # by its factors first: they say more than sizes
    if found is not None:
        return [found], None
    return _by_probes(op, axes)


def _by_probes(op, axes):
    dims_in, dims_out = shapes.dims(op.inputs[0].shape), shapes.dims(op.outputs[0].shape)
    if dims_in is None or dims_out is None:
        raise End("a reshape of unknown rank")
    probe = [d if d is not None else (_BATCH_PROBE if i in axes else _OTHER_PROBES[i % 8])
             for i, d in enumerate(dims_in)]
    total = int(np.prod(probe, dtype=object))
    unknown = [i for i, d in enumerate(dims_out) if d is None]
    if len(unknown) > 1:
        raise End("a reshape to more than one unknown dimension")
    out = list(dims_out)
    if unknown:
        known = int(np.prod([d for d in dims_out if d is not None], dtype=object))
        if known == 0 or total % known:
            raise End("a reshape whose unknown dimension cannot be read")
        out[unknown[0]] = total // known
    lo, hi = min(axes), max(axes)
    before = int(np.prod(probe[:lo], dtype=object))
    through = int(np.prod(probe[:hi + 1], dtype=object))
    if total == 0:
        raise End("a reshape of an empty tensor")
    if through == before:
        return [_one_example(out, before)], None
    found, cum = set(), 1
    for b, d in enumerate(out):
        nxt = cum * d
        if nxt > before and cum < through:
            found.add(b)
        cum = nxt
    return [frozenset(found) or None], None


def _one_example(out: list, before: int) -> frozenset:
    """The output's batch axis when the batch axes have size 1 (a tower of one example, its shape
    static): sizes cannot place them, but the batch keeps its place among the other axes, so it is
    the one axis of size 1 where the output reaches the size of the axes before it (or, with none,
    the one axis that starts there: the example merged with the axes after it). Another axis of
    size 1 there makes it ambiguous: the trace ends, said, rather than guess."""
    starts, cum = [], 1
    for b, d in enumerate(out):
        if cum == before:
            starts.append(b)
        cum *= d
    ones = [b for b in starts if out[b] == 1]
    if len(ones) == 1 and len([b for b in starts if out[b] != 1]) <= 1:
        return frozenset(ones)
    if not ones and len(starts) == 1:
        return frozenset(starts)
    raise End("a reshape of a one-example batch whose batch axis cannot be told from another axis of size 1")


def _by_factors(op, axes, batch):
    """The output's batch axes when the reshape regroups the factors its input is made of (the
    shape read from the graph by `shape_value`), or None. A factor carries the batch when the axis
    it was read from does; an input axis carrying the batch without a factor that says so has all
    its factors count (merged examples: kept on every axis they reach)."""
    memo = {}
    dims_in, dims_out = dim_factors(op.inputs[0], memo), shapes.dims(op.outputs[0].shape)
    value = shape_value(op.inputs[1], memo)
    if dims_in is None or dims_out is None or value is None or value[0] or len(value[1]) != len(dims_out):
        return None
    flat, carrying = [], set()
    for i, factors in enumerate(dims_in):
        said = [k for k, (key, _) in enumerate(factors) if key is not None and key[1] in batch.get(key[0], ())]
        if i in axes:
            said = said or [k for k, (_, size) in enumerate(factors) if size != 1]
            if not said:
                return None
        elif said:
            return None   # the factors disagree with the trace: read nothing
        carrying |= {len(flat) + k for k in said}
        flat += factors
    probes, others = {}, iter(range(10 ** 6))
    for k, (key, size) in enumerate(flat):
        if size is None and key not in probes:
            probes[key] = _BATCH_PROBE if k in carrying else _OTHER_PROBES[next(others) % len(_OTHER_PROBES)]

    def size_of(factors):
        sizes = [s if s is not None else probes.get(key) for key, s in factors]
        return None if None in sizes else int(np.prod(sizes, dtype=object))

    sizes_in = [size_of([f]) for f in flat]
    total = int(np.prod(sizes_in, dtype=object))
    out = [d if d is not None else (size_of(v) if v is not None else None) for d, v in zip(dims_out, value[1])]
    unknown = [b for b, d in enumerate(out) if d is None]
    known = int(np.prod([d for d in out if d is not None], dtype=object))
    if len(unknown) > 1 or total == 0 or known == 0 or any(sizes_in[k] == 1 for k in carrying):
        return None
    if unknown:
        if total % known:
            return None
        out[unknown[0]] = total // known
    elif known != total:
        return None
    found, cum = set(), 1
    for b, d in enumerate(out):
        nxt = cum * d
        for k in carrying:
            before = int(np.prod(sizes_in[:k], dtype=object))
            if nxt > before and cum < before * sizes_in[k]:
                found.add(b)
        cum = nxt
    return frozenset(found) or None
