"""Random examples for every input, and the exchange of examples between towers.

Every example gets its own scale and offset (x = a·z + b, a ∈ [0.5, 2], b ~ N(0, 1), z ~ N(0, 1)),
so the towers' batch statistics differ clearly and per-tower statistics cannot hide. The examples
sit in tower order (tower 0's n_0 examples, then tower 1's, …); towers may hold different numbers.

An exchange is a permutation of the whole batch that keeps every tower's size and changes the set
of examples in *every* tower: no tower ends up with a set some tower held before. Merely swapping
whole towers (2 towers of 2, moving all 4) would change no tower's statistics, so it would prove
nothing; when no such exchange exists (one example per tower), verify refuses.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from graphsync.errors import GraphsyncError
from graphsync.verification.discovery import Input
from graphsync.verification.discovery.inputs import Feed

UNKNOWN_DIM = 16   # for dimensions other than the batch that the graph leaves open
DEFAULT_PER_TOWER = 4
_TRIES = 2000


@dataclasses.dataclass
class Batch:
    """Random values for every input, and the permutation that exchanges examples across towers."""

    inputs: list[Input]
    sizes: list[int]        # examples per tower
    group: int              # examples move within consecutive groups of this many towers
    values: dict            # input (its tensors) → the whole batch (Σ n_t examples), or a fixed value
    permutation: np.ndarray
    notes: list
    seed: int
    fixed: bool = False     # the graph fixes the examples per tower: --batch-size cannot change them

    @property
    def towers(self) -> int:
        return len(self.sizes)

    @property
    def examples(self) -> int:
        return int(sum(self.sizes))

    @property
    def per_tower(self):
        """Examples per tower: one number, or the list when the towers differ."""
        return self.sizes[0] if len(set(self.sizes)) == 1 else list(self.sizes)

    @property
    def home(self) -> np.ndarray:
        """The tower of every position."""
        return np.repeat(np.arange(self.towers), self.sizes)

    @property
    def moved(self) -> int:
        """Examples that change tower in the exchange."""
        return int(np.sum(self.home != self.home[self.permutation]))

    def feed(self, graph, order: np.ndarray | None = None) -> dict:
        """The feed dict of one run: the batch as drawn, or its examples in `order` (a permutation)."""
        feed = {}
        splits = np.cumsum(self.sizes)[:-1]
        for item in self.inputs:
            value = self.values[tuple(item.tensors)]
            if item.kind is Feed.FIXED:
                feed[graph.get_tensor_by_name(item.tensors[0])] = value
                continue
            if order is not None:
                value = value[order]
            parts = np.split(value, splits) if item.kind is Feed.PER_TOWER else [value]
            for name, part in zip(item.tensors, parts):
                feed[graph.get_tensor_by_name(name)] = part
        return feed

    def other_exchanges(self, count: int) -> list[np.ndarray]:
        """More exchanges like `permutation`, from their own seeds."""
        rng = np.random.RandomState(self.seed + 1)
        return [_group_exchange(self.sizes, self.group, rng) for _ in range(count)]

    def reorders(self, count: int) -> list[np.ndarray]:
        """Permutations that shuffle the examples inside each tower and move none to another: a
        symmetry of synchronized and per-tower statistics alike, so what they change is rounding."""
        rng = np.random.RandomState(self.seed + 2)
        starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        return [np.concatenate([start + _shuffle(n, rng) for start, n in zip(starts, self.sizes)])
                for _ in range(count)]


def _shuffle(n: int, rng) -> np.ndarray:
    """A permutation of n items that moves some (the identity only for n = 1)."""
    if n == 1:
        return np.arange(1)
    while True:
        order = rng.permutation(n)
        if np.any(order != np.arange(n)):
            return order


def draw(inputs: list[Input], towers: int, batch_size, seed: int, group_size: int | None = None) -> Batch:
    """Random values for `inputs`; `batch_size` examples per tower (a number, or one per tower),
    else what the graph fixes; examples are exchanged within consecutive groups of `group_size`
    towers (default: all)."""
    sizes = tower_sizes(inputs, towers, batch_size)
    group = group_size or towers
    if group < 2 or towers % group:
        raise GraphsyncError(f"group_size={group_size} does not split {towers} towers into groups of 2 or more")
    rng = np.random.RandomState(seed)
    total = sum(sizes)
    scale = rng.uniform(0.5, 2.0, total)
    offset = rng.normal(0.0, 1.0, total)
    values, notes = {}, []
    for item in inputs:
        if item.kind is Feed.FIXED:
            values[tuple(item.tensors)] = item.value
            continue
        shape = tuple(UNKNOWN_DIM if d is None else d for d in item.example_shape)
        if None in item.example_shape:
            notes.append(f"{item.label}: unknown dimensions set to {UNKNOWN_DIM}")
        dtype = item.dtype.as_numpy_dtype
        if item.draw != "examples":
            value = _as_drawn(item.draw, (total,) + shape, rng).astype(dtype)
        elif item.dtype.is_floating:
            z = rng.normal(0.0, 1.0, (total,) + shape)
            expand = (slice(None),) + (None,) * len(shape)
            value = (z * scale[expand] + offset[expand]).astype(dtype)
        elif item.dtype.is_integer:
            value = rng.randint(0, item.classes, (total,) + shape).astype(dtype)
        else:
            value = rng.uniform(size=(total,) + shape) < 0.5
        values[tuple(item.tensors)] = value
    fixed = any(size is not None for item in inputs if item.kind in (Feed.PER_TOWER, Feed.SHARED)
                for size in item.static_batches)
    permutation = _group_exchange(sizes, group, rng, fixed)
    return Batch(inputs, sizes, group, values, permutation, notes, seed, fixed)


def _as_drawn(distribution: str, shape: tuple, rng) -> np.ndarray:
    """Values as a random op draws them: uniform in [0, 1), standard normal, or truncated at ±2."""
    if distribution == "uniform":
        return rng.uniform(0.0, 1.0, shape)
    value = rng.normal(0.0, 1.0, shape)
    if distribution == "truncated":
        outside = np.abs(value) > 2
        while outside.any():
            value[outside] = rng.normal(0.0, 1.0, int(outside.sum()))
            outside = np.abs(value) > 2
    return value


def tower_sizes(inputs, towers: int, batch_size) -> list[int]:
    """Examples per tower: what the graph fixes (per tower, or a whole batch shared equally), else
    `batch_size` (one number or one per tower), else DEFAULT_PER_TOWER."""
    fixed: list[set] = [set() for _ in range(towers)]
    for item in inputs:
        if item.kind is Feed.PER_TOWER:
            for known, size in zip(fixed, item.static_batches):
                if size is not None:
                    known.add(int(size))
    for item in inputs:
        total = item.static_batches[0] if item.kind is Feed.SHARED else None
        if total is None:
            continue
        if all(known for known in fixed):
            if total != sum(min(k) for k in fixed):
                raise GraphsyncError(f"{item.label} holds {total} examples, but the towers hold "
                                     f"{[min(k) for k in fixed]}")
        elif total % towers:
            raise GraphsyncError(f"{item.label} holds {total} examples, which {towers} towers cannot share equally")
        else:
            for known in fixed:
                known.add(total // towers)
    for tower, known in enumerate(fixed):
        if len(known) > 1:
            raise GraphsyncError(f"the inputs fix different batch sizes for tower {tower} ({sorted(known)})")
    wanted = None
    if batch_size is not None:
        wanted = [int(batch_size)] * towers if np.isscalar(batch_size) else [int(b) for b in batch_size]
        if len(wanted) != towers:
            raise GraphsyncError(f"batch_size gives {len(wanted)} sizes for {towers} towers")
    sizes = []
    for tower, known in enumerate(fixed):
        if known:
            size = known.pop()
            if wanted is not None and wanted[tower] != size:
                raise GraphsyncError(f"the graph fixes {size} examples in tower {tower}, not {wanted[tower]}")
            sizes.append(size)
        else:
            sizes.append(wanted[tower] if wanted is not None else DEFAULT_PER_TOWER)
    return sizes


def _group_exchange(sizes: list[int], group: int, rng, fixed: bool = False) -> np.ndarray:
    """An exchange inside each consecutive group of `group` towers."""
    pieces, start = [], 0
    for first in range(0, len(sizes), group):
        members = sizes[first:first + group]
        pieces.append(exchange(members, rng, fixed) + start)
        start += sum(members)
    return np.concatenate(pieces)


def proves(sizes: list[int], permutation: np.ndarray) -> bool:
    """Every tower's new set of examples differs from every set a tower held before."""
    home = np.repeat(np.arange(len(sizes)), sizes)
    before = {frozenset(np.flatnonzero(home == t).tolist()) for t in range(len(sizes))}
    return all(frozenset(permutation[home == t].tolist()) not in before for t in range(len(sizes)))


def exchange(sizes: list[int], rng, fixed: bool = False) -> np.ndarray:
    """A permutation of the Σ n_t examples that keeps each tower's size, sends about half of each
    tower elsewhere and changes every tower's set of examples (see `proves`)."""
    for _ in range(_TRIES):
        permutation = _halves_swapped(sizes, rng)
        if permutation is not None and proves(sizes, permutation):
            return permutation
    for _ in range(_TRIES):
        permutation = rng.permutation(sum(sizes))
        if proves(sizes, permutation):
            return permutation
    remedy = "the graph fixes them: build it with 2 or more per tower" if fixed else \
        "give the towers 2 or more examples each (--batch-size)"
    raise GraphsyncError(f"no exchange of examples changes which examples share a tower (towers of "
                         f"{'/'.join(map(str, sizes))} examples): {remedy}")


def _halves_swapped(sizes: list[int], rng) -> np.ndarray | None:
    """Half of each tower's examples (at least one; the same number from each of 2 towers), picked
    at random, each put into a place another tower's example left: the leavers, in tower order,
    move on by as many places as the most any tower sends (None when that would keep one home)."""
    leaving_counts = [max(1, n // 2) for n in sizes]
    if len(sizes) == 2:
        leaving_counts = [min(leaving_counts)] * 2
    if 2 * max(leaving_counts) > sum(leaving_counts):
        return None
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    leaving = np.concatenate([start + rng.choice(n, k, replace=False)
                              for start, n, k in zip(starts, sizes, leaving_counts)])
    places = np.roll(leaving, max(leaving_counts))
    permutation = np.arange(sum(sizes))
    permutation[places] = leaving
    return permutation
