"""Small tf.functions the exchanges call once per layer (or tower) instead of spelling their ops out.

A rewrite's cost is mostly the ops it creates, a tenth of a millisecond each in TensorFlow's Python;
a merge that is one call op in the graph costs one op, whatever its body holds. TensorFlow inlines
every call before a step runs, so the step runs the same kernels as if they were spelled out.
Each body is traced once per process and signature, in a graph of its own so that no device or
scope of the caller leaks into its definition; its definition joins a graph's library on first
call (fast_ops.FastOps.call).
"""
from __future__ import annotations

import tensorflow as tf

_traced = {}   # (body, options, input dtypes and shapes) → ConcreteFunction


def traced(body, options: tuple, specs: list):
    """`body(*options)` as a tf.function traced for `specs` (tf.TensorSpec)."""
    key = (body.__qualname__, options,
           tuple((s.dtype, None if s.shape.rank is None else tuple(s.shape.as_list())) for s in specs))
    if key not in _traced:
        with tf.Graph().as_default():
            _traced[key] = tf.function(body(*options), input_signature=specs, autograph=False).get_concrete_function()
    return _traced[key]


def static_specs(inputs) -> list:
    """Specs of these tensors' dtypes and static shapes (any shape where not fully known): the
    body's sizes become constants, at the price of one trace per shape."""
    return [tf.TensorSpec(t.shape if t.shape.is_fully_defined() else None, t.dtype) for t in inputs]


def rank_specs(inputs) -> list:
    """Specs of these tensors' dtypes and ranks, sizes unknown: one trace serves every layer."""
    return [tf.TensorSpec(None if t.shape.rank is None else [None] * t.shape.rank, t.dtype) for t in inputs]
