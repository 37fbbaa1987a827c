"""Tensor names across towers: looking them up, and writing one name for a tensor in every tower."""
from __future__ import annotations

import re

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.graph import order
from graphsync.towers.scopes import Tower, tower_of


def tensor(graph: tf.Graph, name: str) -> tf.Tensor:
    name = name if ":" in name else name + ":0"
    try:
        return graph.get_tensor_by_name(name)
    except (KeyError, ValueError):
        raise GraphsyncError(f"the graph has no tensor {name}") from None


def has_tensor(graph: tf.Graph, name: str) -> bool:
    return order.exists(graph.get_tensor_by_name, name)


def relative(name: str, towers: list[Tower]) -> tuple[Tower | None, str]:
    """(tower, name inside it) for a name in a tower, else (None, name)."""
    tower = tower_of(name, towers)
    return (tower, name[len(tower.prefix):]) if tower is not None else (None, name)


def per_tower(graph: tf.Graph, towers: list[Tower], name: str) -> list[str] | None:
    """`name` (relative to a tower, or inside one) as a tensor name in every tower, if all exist."""
    name = name if ":" in name else name + ":0"
    _, inside = relative(name, towers)
    names = [t.prefix + inside for t in towers]
    return names if all(has_tensor(graph, n) for n in names) else None


def tower_pattern(names: list[str]) -> str:
    """'tower_0/images:0', 'tower_1/images:0' → 'tower_*/images:0' (the names' common shape, where
    they differ only in numbers counting up one per tower); else the names listed."""
    first = names[0]
    if len(names) < 2:
        return first
    pieces = re.split(r"(\d+)", first)
    others = [re.split(r"(\d+)", n) for n in names[1:]]
    listed = ", ".join(names) if len(names) <= 3 else f"{first}, …, {names[-1]}"
    if any(len(o) != len(pieces) for o in others):
        return listed
    for i in range(len(pieces)):
        if any(o[i] != pieces[i] for o in others):
            if i % 2 == 0 or not _counts_up([int(pieces[i])] + [int(o[i]) for o in others]):
                return listed
            pieces[i] = "*"
    return "".join(pieces)


def _counts_up(numbers: list[int]) -> bool:
    return numbers == list(range(numbers[0], numbers[0] + len(numbers)))
