"""The loss: --loss; else the `losses` collection; else a float scalar named total_loss, loss or
*_loss in every tower; else one outside the towers; else the float scalars tf.gradients
differentiated (its seed of ones feeds `<gradients scope>/<loss op>_grad/…`); else none (verify
then compares gradients and moving statistics, and says so)."""
from __future__ import annotations

import re

import tensorflow as tf

from graphsync.towers.scopes import Tower
from graphsync.verification.discovery import names

GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")
_SEEDED = re.compile(r"^(?:.*/)?gradients(?:_\d+)?/(?P<forward>.+)_grad/[^/]+$")
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
    differentiated = _differentiated(graph)
    if differentiated:
        in_towers = {names.relative(t.op.name, towers)[0]: t for t in differentiated}
        if len(differentiated) == len(towers) and len(in_towers) == len(towers) and None not in in_towers:
            return [in_towers[t].name for t in towers], "what tf.gradients differentiates, in every tower"
        return [t.name for t in differentiated], "what tf.gradients differentiates"
    return [], ""


def _differentiated(graph: tf.Graph) -> list[tf.Tensor]:
    """The float scalars whose gradients tf.gradients seeded with ones: the seed (a Fill of a
    constant shape) is read by the gradient function of the loss's op, `<scope>/<op name>_grad/…`."""
    found = {}
    for op in graph.get_operations():
        if op.type != "Fill" or not GRADIENT_SCOPE.search(op.name) or tf.get_static_value(op.inputs[1]) != 1:
            continue
        for reader in op.outputs[0].consumers():
            seeded = _SEEDED.match(reader.name)
            if seeded is None:
                continue
            try:
                forward = graph.get_operation_by_name(seeded.group("forward"))
            except (KeyError, ValueError):
                continue
            if forward.outputs and forward.outputs[0].dtype.is_floating and forward.outputs[0].shape.rank == 0:
                found[forward.outputs[0].name] = forward.outputs[0]
    return [found[n] for n in sorted(found)]
