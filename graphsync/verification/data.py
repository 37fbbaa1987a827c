"""Random examples for every input, and the exchange of examples between towers.

Every example gets its own scale and offset (x = a·z + b, a ∈ [0.5, 2], b ~ N(0, 1), z ~ N(0, 1)),
so the towers' batch statistics differ clearly and per-tower statistics cannot hide. The exchange is
a permutation of the whole multi-tower batch that keeps every tower's size: the same examples, in
other towers.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from graphsync.errors import GraphsyncError
from graphsync.verification.discover import Input

UNKNOWN_DIM = 16  # for dimensions other than the batch that the graph leaves open


@dataclasses.dataclass
class Batch:
    """Random values for every input, and the permutation that exchanges examples across towers."""

    inputs: list[Input]
    towers: int
    per_tower: int
    group: int              # examples move within consecutive groups of this many towers
    values: dict            # input label → the whole batch (T·n examples), or a fixed value
    permutation: np.ndarray
    notes: list
    seed: int

    @property
    def examples(self) -> int:
        return self.towers * self.per_tower

    @property
    def moved(self) -> int:
        """Examples that change tower in the exchange."""
        return int(np.sum(np.arange(self.examples) // self.per_tower != self.permutation // self.per_tower))

    def feed(self, graph, order: np.ndarray | None = None) -> dict:
        """The feed dict of one run: the batch as drawn, or its examples in `order` (a permutation)."""
        feed = {}
        for item in self.inputs:
            value = self.values[item.label]
            if item.kind == "fixed":
                feed[graph.get_tensor_by_name(item.tensors[0])] = value
                continue
            if order is not None:
                value = value[order]
            parts = np.split(value, self.towers) if item.kind == "per_tower" else [value]
            for name, part in zip(item.tensors, parts):
                feed[graph.get_tensor_by_name(name)] = part
        return feed

    def other_exchanges(self, count: int) -> list[np.ndarray]:
        """More exchanges like `permutation`, from their own seeds."""
        rng = np.random.RandomState(self.seed + 1)
        return [_group_exchange(self.examples, self.group, self.per_tower, rng) for _ in range(count)]

    def reorders(self, count: int) -> list[np.ndarray]:
        """Permutations that shuffle the examples inside each tower and move none to another: a
        symmetry of synchronized and per-tower statistics alike, so what they change is rounding."""
        rng = np.random.RandomState(self.seed + 2)
        orders = []
        for _ in range(count):
            pieces = [start + _shuffle(self.per_tower, rng) for start in range(0, self.examples, self.per_tower)]
            orders.append(np.concatenate(pieces))
        return orders

def _shuffle(n: int, rng) -> np.ndarray:
    """A permutation of n items that moves some (the identity only for n = 1)."""
    if n == 1:
        return np.arange(1)
    while True:
        order = rng.permutation(n)
        if np.any(order != np.arange(n)):
            return order


def draw(inputs: list[Input], towers: int, batch_size: int | None, seed: int, group_size: int | None = None) -> Batch:
    """Random values for `inputs`, `batch_size` examples per tower (or what the graph fixes);
    examples are exchanged within consecutive groups of `group_size` towers (default: all)."""
    per_tower = _per_tower_size(inputs, towers, batch_size)
    rng = np.random.RandomState(seed)
    total = towers * per_tower
    scale = rng.uniform(0.5, 2.0, total)
    offset = rng.normal(0.0, 1.0, total)
    values, notes = {}, []
    for item in inputs:
        if item.kind == "fixed":
            values[item.label] = item.value
            continue
        shape = tuple(UNKNOWN_DIM if d is None else d for d in item.example_shape)
        if None in item.example_shape:
            notes.append(f"{item.label}: unknown dimensions set to {UNKNOWN_DIM}")
        dtype = item.dtype.as_numpy_dtype
        if item.dtype.is_floating:
            z = rng.normal(0.0, 1.0, (total,) + shape)
            expand = (slice(None),) + (None,) * len(shape)
            value = (z * scale[expand] + offset[expand]).astype(dtype)
        elif item.dtype.is_integer:
            value = rng.randint(0, item.classes, (total,) + shape).astype(dtype)
        else:
            value = rng.uniform(size=(total,) + shape) < 0.5
        values[item.label] = value
    group = group_size or towers
    if group < 2 or towers % group:
        raise GraphsyncError(f"group_size={group_size} does not split {towers} towers into groups of 2 or more")
    permutation = _group_exchange(total, group, per_tower, rng)
    return Batch(inputs, towers, per_tower, group, values, permutation, notes, seed)


def _per_tower_size(inputs, towers, batch_size) -> int:
    fixed = set()
    for item in inputs:
        if item.static_batch is not None:
            if item.kind == "shared":
                if item.static_batch % towers:
                    raise GraphsyncError(f"{item.label} holds {item.static_batch} examples, which "
                                         f"{towers} towers cannot share equally")
                fixed.add(item.static_batch // towers)
            elif item.kind == "per_tower":
                fixed.add(item.static_batch)
    if len(fixed) > 1:
        raise GraphsyncError(f"the inputs fix different batch sizes per tower ({sorted(fixed)})")
    if fixed:
        size = fixed.pop()
        if batch_size and batch_size != size:
            raise GraphsyncError(f"the graph fixes {size} examples per tower, not {batch_size}")
        return size
    return batch_size or 4


def _group_exchange(total: int, group: int, per_tower: int, rng) -> np.ndarray:
    """An exchange inside each consecutive group of `group` towers."""
    return np.concatenate([_exchange(group, per_tower, rng) + start for start in range(0, total, group * per_tower)])


def _exchange(towers: int, per_tower: int, rng) -> np.ndarray:
    """A permutation of the T·n examples that sends at least half of each tower elsewhere (for one
    example per tower, a rotation)."""
    total = towers * per_tower
    if per_tower == 1:
        return np.roll(np.arange(total), 1)
    for _ in range(100):
        permutation = rng.permutation(total)
        home = np.arange(total) // per_tower
        leaving = home != permutation // per_tower
        if all(leaving[home == t].sum() * 2 >= per_tower for t in range(towers)):
            return permutation
    return np.roll(np.arange(total), per_tower // 2)
