"""Finding the gradient calls through a forward op, and the gradient arriving at it: `tf.gradients`
builds the gradient function of op F under `…/gradients[_N]/F_grad/…`; a GradientTape's are
recorded as it builds them (graphsync/graph/tape.py). Which ops are in a backward at all is decided
by structure (graphsync/graph/backward.py); this only pairs a gradient function's ops with the
forward op they differentiate."""
from __future__ import annotations

import re

import tensorflow as tf

from graphsync.graph import tape
from graphsync.graph.op_types import SHAPE_TYPES

_GRAD_SCOPE = re.compile(r"^(?P<call>(?:.*/)?gradients(?:_\d+)?)/(?P<forward>.+?)_grad/")


def gradient_scopes(graph: tf.Graph) -> dict:
    """forward op name → {gradient call prefix → ops of its gradient function}, from the scopes
    `tf.gradients` names after the op it differentiates."""
    scopes: dict = {}
    for op in graph.get_operations():
        found = _GRAD_SCOPE.match(op.name)
        if found:
            scopes.setdefault(found.group("forward"), {}).setdefault(found.group("call"), []).append(op)
    for forward, calls in tape.recorded(graph).items():
        for call, ops in calls.items():
            scopes.setdefault(forward, {}).setdefault(call, []).extend(ops)
    return scopes


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
