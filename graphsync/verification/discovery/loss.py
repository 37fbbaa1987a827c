"""The loss: --loss; else the `losses` collection; else the float scalars tf.gradients
differentiated; else a float scalar named total_loss, loss or *_loss in every tower; else one
outside the towers; else none (verify then compares gradients and moving statistics, and says so).

What tf.gradients differentiates comes before any name: it is what the optimizer's gradients come
from, so it depends on the examples. A name proves nothing: tensorpack's ImageNet example has a
`tower<i>/l2_regularize_loss` (weight decay, which no example changes) next to the `cost` its
trainer differentiates. The seed tf.gradients starts from is shaped after what it differentiates,
`Fill(Shape(loss), 1)` or `OnesLike(loss)` (graphsync/graph/backward.py finds the seeds): the loss
is read off the seed, whatever its name (a sum such as `cost = tf.add_n([loss, wd_loss])` is the
sum). A scalar loss's shape is often a constant, `Fill([], 1)`: the seed is then paired with the
loss by the scope tf.gradients names the loss's gradient after (`_differentiated_by_scope`). Subject then keeps the first choice whose tensors
all depend on the examples (`options`, in this order).
"""
from __future__ import annotations

import re

import tensorflow as tf

from graphsync.graph import backward, marks
from graphsync.match.gradients import gradient_call, gradient_scopes
from graphsync.towers.scopes import Tower
from graphsync.verification.discovery import names

_COPIES = ("Identity", "Snapshot")
_LOSS_NAMES = (("total_loss", re.compile(r"(^|/)total_loss$")),
               ("loss", re.compile(r"(^|/)loss$")),
               ("*_loss", re.compile(r"(^|/|_)loss(es)?$")))


def options(graph: tf.Graph, towers: list[Tower], loss, losses_collection) -> list[tuple[list[str], str]]:
    """Every way to the loss that finds one, (tensor names, how), in order of preference."""
    if loss:
        in_towers = names.per_tower(graph, towers, loss)
        if in_towers:
            return [(in_towers, "--loss, in every tower")]
        return [([names.tensor(graph, loss).name], "--loss")]
    found = []
    if losses_collection:
        found.append((list(losses_collection), "the `losses` collection"))
    differentiated = _differentiated(graph)
    if differentiated:
        in_towers = {names.relative(t.op.name, towers)[0]: t for t in differentiated}
        if len(differentiated) == len(towers) and len(in_towers) == len(towers) and None not in in_towers:
            found.append(([in_towers[t].name for t in towers],
                          "what tf.gradients differentiates, in every tower: the gradients applied come from it"))
        else:
            found.append(([t.name for t in differentiated],
                          "what tf.gradients differentiates: the gradients applied come from it"))
    found.extend(_named(graph, towers))
    return found


def _named(graph: tf.Graph, towers: list[Tower]) -> list[tuple[list[str], str]]:
    """Float scalars named total_loss, loss or *_loss: in every tower, else outside the towers."""
    candidates = [op.outputs[0] for op in graph.get_operations()
                  if op.outputs and op.outputs[0].dtype.is_floating and op.outputs[0].shape.rank == 0
                  and op.type not in ("Const", "Placeholder", "PlaceholderWithDefault", "ReadVariableOp")
                  and not backward.is_backward(op) and not marks.made_by_graphsync(op)]
    by_relative: dict[str, dict] = {}
    at_root = []
    for candidate in candidates:
        tower, inside = names.relative(candidate.op.name, towers)
        if tower is None:
            at_root.append(candidate)
        else:
            by_relative.setdefault(inside, {})[tower] = candidate
    found = []
    for label, pattern in _LOSS_NAMES:
        for relative in sorted((r for r, per in by_relative.items() if pattern.search(r) and len(per) == len(towers)),
                               key=lambda r: (len(r), r)):
            chosen = by_relative[relative]
            found.append(([chosen[t].name for t in towers], f"named {label} in every tower"))
    for label, pattern in _LOSS_NAMES:
        for rooted in sorted((t for t in at_root if pattern.search(t.op.name)), key=lambda t: (len(t.name), t.name)):
            found.append(([rooted.name], f"named {label}, outside the towers"))
    return found


def _differentiated(graph: tf.Graph) -> list[tf.Tensor]:
    """The float scalars the gradients' seeds are shaped after (see the module docstring)."""
    found = {}
    for seed in backward.seeds(graph):
        shaped_after = seed.inputs[0] if seed.type == "OnesLike" else seed.inputs[0].op.inputs[0] \
            if seed.type == "Fill" and seed.inputs[0].op.type == "Shape" else None
        if shaped_after is not None and _float_scalar(shaped_after.op) and not backward.is_backward(shaped_after.op):
            found[shaped_after.name] = shaped_after
    return [found[n] for n in sorted(found)] or _differentiated_by_scope(graph)


def _differentiated_by_scope(graph: tf.Graph) -> list[tf.Tensor]:
    """The float scalars tf.gradients differentiated when its seed's shape is a constant (a scalar
    loss): the seed is read by the gradient function of the loss's op, `<gradients call>/<loss
    op>_grad/…` (graphsync/match/gradients.py pairs them); when the loss is a sum whose gradient
    makes no op (AddN, Identity), by its terms' gradients instead, and the terms are followed down
    to the sum."""
    ops_by_name = {op.name: op for op in graph.get_operations()}
    seeded: dict[str, dict] = {}    # gradients call → {tensor name: forward scalar it seeds}
    for seed in backward.seeds(graph):
        if seed.type != "Fill":
            continue
        for reader in seed.outputs[0].consumers():
            found = gradient_call(reader.name, ops_by_name)
            if found is not None and _float_scalar(found[1]):
                call, forward = found
                seeded.setdefault(call, {})[forward.outputs[0].name] = forward.outputs[0]
    if not seeded:
        return []
    scopes = gradient_scopes(graph)
    found = {}
    for call, terms in seeded.items():
        found.update(_summed(terms, call, scopes))
    return [found[n] for n in sorted(found)]


def _float_scalar(op: tf.Operation) -> bool:
    return bool(op.outputs) and op.outputs[0].dtype.is_floating and op.outputs[0].shape.rank == 0


def _summed(terms: dict, call: str, scopes: dict) -> dict:
    """The scalar the seeded `terms` sum to, when one sums all of them through ops whose gradient
    made no op of its own in gradient call `call` (AddN, Identity: the seed passes through to the terms);
    else the terms themselves."""
    covers = {name: {name} for name in terms}
    tensors = dict(terms)
    pending = list(terms.values())
    while pending:
        for total in pending.pop().consumers():
            if not _float_scalar(total) or total.outputs[0].name in covers or backward.is_backward(total) \
                    or marks.made_by_graphsync(total) or call in scopes.get(total.name, {}):
                continue
            inputs = [t for t in total.inputs if t.dtype.is_floating]
            if all(t.name in covers or tf.get_static_value(t) is not None for t in inputs):
                out = total.outputs[0]
                covers[out.name] = set().union(*(covers[t.name] for t in inputs if t.name in covers))
                tensors[out.name] = out
                pending.append(out)
    whole = {name for name, covered in covers.items() if covered == set(terms)}
    # a copy of the sum (tf.identity for a summary) is not what was differentiated
    whole = {name for name in whole if not (tensors[name].op.type in _COPIES and tensors[name].op.inputs[0].name in whole)}
    read = {t.name for name in whole for t in tensors[name].op.inputs}
    tops = sorted(name for name in whole if name not in read)
    return {tops[0]: tensors[tops[0]]} if len(tops) == 1 else terms
