"""Finding the gradient calls through a forward op, and the gradient arriving at it: `tf.gradients`
builds the gradient function of op F under `<call>/F_grad/…`, where `<call>` is its own name scope
(`gradients`, `gradients_1`, or whatever `name=` the script gave it, inside the scope it was called
in); a GradientTape's are recorded as it builds them (graphsync/graph/tape.py). Which ops are in a
backward at all is decided by structure (graphsync/graph/backward.py); this only pairs a gradient
function's ops with the forward op they differentiate."""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import tape, tf_private
from graphsync.graph.op_types import SHAPE_TYPES

_GRAD = "_grad/"


def gradient_scopes(graph: tf.Graph) -> dict:
    """forward op name → {gradient call prefix → ops of its gradient function}, from the scopes
    `tf.gradients` names after the op it differentiates (`gradient_call`)."""
    ops = graph.get_operations()
    names = [op.name for op in ops]
    created = dict(zip(names, ops))
    split: dict = {}    # the name up to a "_grad/" → (call, forward op) or None
    scopes: dict = {}
    for op, name in zip(ops, names):
        if _GRAD in name:
            found = gradient_call(name, created, split)
            if found is not None and tf_private.creation_order(found[1]) < tf_private.creation_order(op):
                scopes.setdefault(found[1].name, {}).setdefault(found[0], []).append(op)
    for forward, calls in tape.recorded(graph).items():
        for call, ops_made in calls.items():
            scopes.setdefault(forward, {}).setdefault(call, []).extend(ops_made)
    return scopes


def gradient_call(name: str, ops_by_name: dict, cache: dict | None = None):
    """(call, forward op) when `name` is in the scope `<call>/<forward>_grad/` tf.gradients gives
    the gradient function of an op of the graph (`ops_by_name`); else None. The call's name is not
    assumed (`name=` renames it): the prefix up to the last `_grad/` (the innermost gradient
    function: an inlined tf.function's gradient body holds gradient calls of its own) ends in the
    longest name of an op, below a non-empty call scope."""
    path = name[:name.rfind(_GRAD)]
    if not path:
        return None
    if cache is None:
        return _split(path, ops_by_name)
    if path not in cache:
        cache[path] = _split(path, ops_by_name)
    return cache[path]


def _split(path: str, ops_by_name: dict):
    cut = path.find("/")
    while cut > 0:
        forward = ops_by_name.get(path[cut + 1:])
        if forward is not None:
            return path[:cut], forward
        cut = path.find("/", cut + 1)
    return None


def gradient_entry(grad_ops: list, forward_inputs) -> tf.Tensor | None:
    """The gradient arriving at a forward op's output: the one floating tensor its gradient
    function reads from outside itself for arithmetic (not for shapes), and that is not one of the
    forward op's own inputs."""
    members = set(grad_ops)
    entries = {t.ref() for op in grad_ops if op.type not in SHAPE_TYPES for t in op.inputs
               if t.op not in members and t.dtype.is_floating and
               all(t is not f for f in forward_inputs)}
    if len(entries) != 1:
        return None
    return next(iter(entries)).deref()


def entry_readers(entry: tf.Tensor, call: str, scopes: dict, forward_ops) -> tuple:
    """The ops of gradient call `call` that read `entry` to differentiate `forward_ops`: their
    gradient functions' ops, and the AddN ops that sum it into the gradient of one of their
    tensors — Sub and Add pass a gradient through unchanged when the shapes agree, so the ops that
    read it may belong to an op upstream."""
    own = {op for forward in forward_ops for op in scopes.get(forward.name, {}).get(call, [])}
    return tuple(op for op in entry.consumers()
                 if op in own or (op.type == "AddN" and any(c in own for c in op.outputs[0].consumers())))


def passed_through_entry(op: tf.Operation, call: str, scopes: dict, forward_ops) -> tf.Tensor | None:
    """The gradient arriving at `op` when its gradient function built no ops (Add or Sub of equal
    shapes hand it on unchanged): the one tensor that the gradient ops of its inputs (or the AddN
    summing into them) read and that neither the gradient ops of `forward_ops` nor a forward op made."""
    upstream = [t.op for t in op.inputs if t.op in forward_ops]
    own = {g for f in upstream for g in scopes.get(f.name, {}).get(call, [])}
    made = {g for f in forward_ops for g in scopes.get(f.name, {}).get(call, [])}
    readers = set(own)
    for g in own:
        readers |= {t.op for t in g.inputs if t.op.type == "AddN" and t.op.name.startswith(call + "/")}
    found = {t.ref() for r in readers for t in r.inputs
             if t.op not in made and t.op not in readers and t.dtype.is_floating and
             t.op.name.startswith(call + "/") and t.op.type not in SHAPE_TYPES}
    return next(iter(found)).deref() if len(found) == 1 else None
