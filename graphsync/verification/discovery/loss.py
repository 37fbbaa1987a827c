"""The loss: --loss; else the `losses` collection; else a float scalar named total_loss, loss or
*_loss in every tower; else one outside the towers; else none (verify then compares gradients and
moving statistics, and says so)."""
from __future__ import annotations

import re

import tensorflow as tf

from graphsync.towers import Tower
from graphsync.verification.discovery import names

GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")
_LOSS_NAMES = (("total_loss", re.compile(r"(^|/)total_loss$")),
               ("loss", re.compile(r"(^|/)loss$")),
               ("*_loss", re.compile(r"(^|/|_)loss(es)?$")))


def find(graph: tf.Graph, towers: list[Tower], loss, losses_collection) -> tuple[list[str], str]:
    """(loss tensor names, how they were found); ([], "") when there is none."""
    if loss:
        in_towers = names.per_tower(graph, towers, loss)
        if in_towers:
            return in_towers, "--loss, in every tower"
        return [names.tensor(graph, loss).name], "--loss"
    if losses_collection:
        return list(losses_collection), "the `losses` collection"
    candidates = [op.outputs[0] for op in graph.get_operations()
                  if op.outputs and op.outputs[0].dtype.is_floating and op.outputs[0].shape.rank == 0
                  and op.type not in ("Const", "Placeholder", "PlaceholderWithDefault", "ReadVariableOp")
                  and not GRADIENT_SCOPE.search(op.name) and not op.name.startswith("graphsync/")]
    by_relative: dict[str, dict] = {}
    at_root = []
    for candidate in candidates:
        tower, inside = names.relative(candidate.op.name, towers)
        if tower is None:
            at_root.append(candidate)
        else:
            by_relative.setdefault(inside, {})[tower] = candidate
    for label, pattern in _LOSS_NAMES:
        found = sorted((r for r, per in by_relative.items() if pattern.search(r) and len(per) == len(towers)),
                       key=lambda r: (len(r), r))
        if found:
            chosen = by_relative[found[0]]
            return [chosen[t].name for t in towers], f"named {label} in every tower"
    for label, pattern in _LOSS_NAMES:
        rooted = sorted((t for t in at_root if pattern.search(t.op.name)), key=lambda t: (len(t.name), t.name))
        if rooted:
            return [rooted[0].name], f"named {label}, outside the towers"
    return [], ""
