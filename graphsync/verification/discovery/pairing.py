"""Tower entries paired across towers into per-tower inputs: the tensors through which the same
layer of each tower reads its examples form one input.

Entries are paired by structure first: by dtype, example shape and the first layers they reach
through ops that only carry examples on (the layers' op types and the input they read them
through: `Conv2D` input 0), and, among a tower's entries alike in all that, by their place in the
data path (the order the forward pass runs those layers, graphsync/graph/order.py): the k-th such entry
of every tower forms one input. Whatever that leaves unpaired (towers with different numbers of
such entries) is paired by dtype, example shape and the source they come from (the pieces of one
split batch), then by dtype, example shape and output position (one iterator per replica), and
last by the names, inside their tower, of the forward ops that read them. The entries were found
by structure; names at most pair what structure left.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.graph import order
from graphsync.errors import GraphsyncError
from graphsync.towers.scopes import Tower
from graphsync.verification.discovery import entries as entries_module, names
from graphsync.graph.backward import is_backward


@dataclasses.dataclass
class Entry:
    tower: Tower
    tensor: tf.Tensor
    origin: str          # how it was found, for the report
    source: tf.Tensor    # the source it comes from


def pair(entries: list[Entry], towers: list[Tower], needed: set, tower_of_op) -> list[list[Entry]]:
    """Groups of one entry per tower (in tower order); raises when some cannot be paired."""
    groups, left = _by_position(entries, towers, needed)
    pieces, left = _group(left, towers, lambda e: (e.tensor.dtype, _example_shape(e.tensor), e.source.name))
    more, left = _group(left, towers, lambda e: (e.tensor.dtype, _example_shape(e.tensor), e.source.value_index,
                                                 e.source.op.type))
    named, left = _group(left, towers, lambda e: _readers_key(e, needed, tower_of_op))
    if left:
        where = sorted({e.tower.label for e in left})
        raise GraphsyncError(f"cannot pair input {left[0].tensor.name} with the other towers' inputs (found in "
                             f"{', '.join(where)} only): name the tensors to feed with --input NAME")
    return groups + pieces + more + named


def _by_position(entries, towers, needed):
    """Groups of the entries alike in dtype, example shape and first layers (their types and the
    input they read), the k-th of each tower's (in forward order of those layers) together; the
    rest is left."""
    layers = {id(e): set(entries_module.first_layers([e.tensor], needed)) for e in entries}
    placed = order.positions([op for found in layers.values() for op, _ in found] + [e.tensor.op for e in entries])
    by_key: dict = {}
    for entry in entries:
        signature = tuple(sorted((op.type, index) for op, index in layers[id(entry)]))
        by_key.setdefault((entry.tensor.dtype, _example_shape(entry.tensor), signature), []).append(entry)

    def position(entry):
        return min((placed[op] for op, _ in layers[id(entry)]), default=placed[entry.tensor.op])

    groups, left = [], []
    for members in by_key.values():
        per_tower = [sorted((e for e in members if e.tower == t), key=position) for t in towers]
        if len({len(found) for found in per_tower}) == 1:
            groups += [list(group) for group in zip(*per_tower)]
        else:
            left.extend(members)
    return groups, left


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
               if c in needed and tower_of_op(c) == entry.tower and not is_backward(c)]
    inside = frozenset(names.relative(c.name, [entry.tower])[1] for c in readers)
    return entry.tensor.dtype, _example_shape(entry.tensor), inside
