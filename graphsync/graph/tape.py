"""Which forward op each gradient function of a GradientTape differentiated, recorded as the tape
builds a traced step's backward.

tf.gradients names a gradient function's ops after the op it differentiates (`…/gradients/F_grad/…`),
which is how graphsync pairs a moments layer's forward with its backward (graphsync/match/gradients.py).
The tape does not: it puts them under the *name scope* the forward op was created in
(`gradient_tape/…/moments/`), where the gradients of the mean, the variance and their squeezes all
land together. The tape knows which op it differentiates, though: it calls the op's registered
gradient function with the op's outputs. While `graphsync run` is installed, each call made during
a tape's backward is recorded: the forward op, the tape call, and the ops the function created.
The record is installed once per process, when graphsync's rewrite is imported (`record_always`):
a script that calls rewrite_towers() on a step it traced itself is paired as under `graphsync run`.
Eager tapes are not recorded (nothing there is rewritten), so an eager loop pays nothing.

    recorded(graph)   forward op name → {tape call → ops of its gradient function}, as
                      match.gradient_scopes gives tf.gradients' scopes
"""
from __future__ import annotations

import itertools
import threading
import weakref

import tensorflow as tf

from graphsync.graph import tf_private

_recorded = weakref.WeakKeyDictionary()   # graph → {forward op name → {call → [ops]}}
_installed = []                           # the patches record_always made, once per process
_calls = itertools.count(1)
_state = threading.local()                # .call: the tape call running in this thread, if any


def recorded(graph) -> dict:
    """The gradient functions the tapes built in `graph`, by forward op (module docstring)."""
    return _recorded.get(graph, {})


def record_always() -> None:
    """Records every tape of this process from now on (module docstring); idempotent."""
    if not _installed:
        for owner, attribute, replacement in _patch_points():
            setattr(owner, attribute, replacement)
            _installed.append((owner, attribute))


def patch_points() -> list:
    """(owner, attribute, replacement) for AutoSync: none once `record_always` has recorded every
    tape (a second record would list each gradient op twice)."""
    return [] if _installed else _patch_points()


def _patch_points() -> list:
    """The tape's backward entry point, and the gradient registry's lookup, whose functions are
    wrapped to record what they differentiate."""
    module, name = tf_private.tape_gradient_entry_point()
    original_backward = getattr(module, name)
    registry = tf_private.gradient_registry()
    registry_class = type(registry)     # its instances have no __dict__: the class's method is patched
    original_lookup = registry_class.lookup

    def backward(*args, **kwargs):
        outer = getattr(_state, "call", None)
        _state.call = f"gradient_tape_call_{next(_calls)}"
        try:
            return original_backward(*args, **kwargs)
        finally:
            _state.call = outer

    def lookup(self, op_type):
        function = original_lookup(self, op_type)
        if self is not registry or function is None or getattr(_state, "call", None) is None \
                or tf.executing_eagerly():
            return function
        return _recording(function)

    return [(module, name, backward), (registry_class, "lookup", lookup)]


def _recording(function):
    def recorded_gradient(op, *grads):
        forward = _forward_op(op)
        if forward is None:
            return function(op, *grads)
        graph = forward.graph
        start = graph.version
        result = function(op, *grads)
        made = tf_private.ops_added_since(graph, start)
        _recorded.setdefault(graph, {}).setdefault(forward.name, {}).setdefault(_state.call, []).extend(made)
        return result
    return recorded_gradient


def _forward_op(mock):
    """The graph op a tape's stand-in op (type, and the inputs and outputs its gradient needs)
    stands for, or None: eager, or neither inputs nor outputs kept."""
    try:
        outputs = [t for t in (mock.outputs or ()) if t is not None]
        if outputs:
            found = outputs[0].op
        else:
            inputs = list(mock.inputs or ())
            if not inputs or inputs[0] is None:
                return None
            matches = [c for c in inputs[0].consumers() if c.type == mock.type and len(c.inputs) == len(inputs)
                       and all(r is None or r is t for r, t in zip(inputs, c.inputs))]
            if len(matches) != 1:
                return None
            found = matches[0]
    except (AttributeError, RuntimeError, TypeError):
        return None
    return found if hasattr(found.graph, "version") else None
