"""Inputs made in the graph (pipelines, random tensors standing in for a reader): which tensor the
tower actually reads, and which random tensors are no input at all (dropout masks, noise).

From where a source's examples enter a tower, the examples are followed down while they pass
through preprocessing — ops that read no variable and mix in no other data (casts, scaling,
crops with random offsets) — to the tensor the first layer reads. That tensor is fed: the random
or decoding steps before it then do not run, so both runs see exactly the fed examples. Integer
tensors are followed through reshapes only (their range is inferred from what reads them).

A random tensor is noise, not an input, when its shape comes from other data (dropout on an
activation) or it ends up combined elementwise with data from another source (x * mask, x + noise).
Noise is fed too, as drawn by its op (`distribution`), and exchanged with the examples it belongs to.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import shapes
from graphsync.verification.discovery import example_sources as sources
from graphsync.verification.discovery.state import VARIABLE_TYPES

_INTEGER_STEPS = ("Identity", "Snapshot", "Reshape", "Squeeze", "ExpandDims")
_VARIABLE_READS = VARIABLE_TYPES + ("ReadVariableOp", "ResourceGather")
_COMBINING = ("Mul", "Add", "AddV2", "Sub", "RealDiv", "Div", "Maximum", "Minimum", "GreaterEqual", "Greater",
              "Less", "LessEqual", "Select", "SelectV2", "BiasAdd")
_SEARCH_LIMIT = 20000


def read_tensor(tensor: tf.Tensor, needed: set) -> tf.Tensor:
    """The tensor the model reads, following `tensor` through preprocessing."""
    current = tensor
    for _ in range(200):
        readers = [c for c in current.consumers() if c in needed]
        if len(readers) != 1:
            return current
        reader = readers[0]
        outputs = [o for o in reader.outputs if any(c in needed for c in o.consumers())]
        if len(outputs) != 1 or not _keeps_examples(current, outputs[0]):
            return current
        if current.dtype.is_integer and reader.type not in _INTEGER_STEPS and reader.type != "Cast":
            return current
        if current.dtype.is_integer and reader.type == "Cast" and not outputs[0].dtype.is_floating:
            return current
        others = [t for t in reader.inputs if t is not current]
        if any(_upstream_has(t, needed, _VARIABLE_READS) or _upstream_has(t, needed, sources.KINDS) for t in others):
            return current
        current = outputs[0]
    return current


def is_noise(source: tf.Tensor, read: tf.Tensor, needed: set) -> bool:
    """True for a random tensor that is no input: dropout masks, noise added to data."""
    shape = source.op.inputs[0] if source.op.inputs else None
    if shape is not None and tf.get_static_value(shape) is None:
        return True
    for reader in read.consumers():
        if reader not in needed or reader.type not in _COMBINING:
            continue
        others = [t for t in reader.inputs if t is not read]
        if any(_upstream_has(t, needed, sources.KINDS) for t in others):
            return True
    return False


_DISTRIBUTIONS = {"RandomUniform": "uniform", "StatelessRandomUniform": "uniform", "StatelessRandomUniformV2": "uniform",
                  "RandomStandardNormal": "normal", "StatelessRandomNormal": "normal",
                  "StatelessRandomNormalV2": "normal", "TruncatedNormal": "truncated",
                  "StatelessTruncatedNormal": "truncated", "StatelessTruncatedNormalV2": "truncated"}


def distribution(tensor: tf.Tensor) -> str | None:
    """How a float random op draws (uniform in [0, 1), standard normal, normal truncated at ±2),
    or None for integer draws."""
    return _DISTRIBUTIONS.get(tensor.op.type) if tensor.dtype.is_floating else None


def _keeps_examples(before: tf.Tensor, after: tf.Tensor) -> bool:
    """`after` still has one row per example of `before` (same rank, same known batch size)."""
    if before.shape.rank is None or after.shape.rank is None or after.shape.rank < 1:
        return False
    return shapes.dim(before.shape, 0) == shapes.dim(after.shape, 0)


def _upstream_has(tensor: tf.Tensor, needed: set, types) -> bool:
    stack, seen = [tensor.op], set()
    while stack and len(seen) < _SEARCH_LIMIT:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type in types:
            return True
        stack.extend(t.op for t in op.inputs)
    return False
