"""Tower entries paired across towers into per-tower inputs: the tensors through which the same
layer of each tower reads its examples form one input.

Entries are keyed by their dtype, example shape and the names, inside their tower, of the forward
ops that read them (`conv1/Conv2D` in every tower); what that leaves unpaired is paired by dtype,
example shape and the source they come from (the pieces of one split batch), then by dtype,
example shape and output position (one iterator per replica). Names only pair; the entries were
found by structure.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.towers import Tower
from graphsync.verification.discovery import names
from graphsync.verification.discovery.loss import GRADIENT_SCOPE


@dataclasses.dataclass
class Entry:
    tower: Tower
    tensor: tf.Tensor
    origin: str          # how it was found, for the report
    source: tf.Tensor    # the source it comes from


def pair(entries: list[Entry], towers: list[Tower], needed: set, tower_of_op) -> list[list[Entry]]:
    """Groups of one entry per tower (in tower order); raises when some cannot be paired."""
    groups, left = _group(entries, towers, lambda e: _readers_key(e, needed, tower_of_op))
    pieces, left = _group(left, towers, lambda e: (e.tensor.dtype, _example_shape(e.tensor), e.source.name))
    more, left = _group(left, towers, lambda e: (e.tensor.dtype, _example_shape(e.tensor), e.source.value_index,
                                                 e.source.op.type))
    if left:
        where = sorted({e.tower.label for e in left})
        raise GraphsyncError(f"cannot pair input {left[0].tensor.name} with the other towers' inputs (found in "
                             f"{', '.join(where)} only): name the tensors to feed with --input NAME")
    return groups + pieces + more


def _group(entries, towers, key):
    by_key: dict = {}
    for entry in entries:
        by_key.setdefault(key(entry), []).append(entry)
    groups, left = [], []
    for members in by_key.values():
        per_tower = {e.tower: e for e in members}
        if len(per_tower) == len(members) == len(towers):
            groups.append([per_tower[t] for t in towers])
        else:
            left.extend(members)
    return groups, left


def _example_shape(tensor: tf.Tensor):
    return tuple(tensor.shape[1:].as_list()) if tensor.shape.rank else None


def _readers_key(entry: Entry, needed: set, tower_of_op):
    readers = [c for c in entry.tensor.consumers()
               if c in needed and tower_of_op(c) == entry.tower and not GRADIENT_SCOPE.search(c.name)]
    inside = frozenset(names.relative(c.name, [entry.tower])[1] for c in readers)
    return entry.tensor.dtype, _example_shape(entry.tensor), inside
