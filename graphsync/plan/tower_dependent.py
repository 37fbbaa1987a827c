"""Values that depend on how the batch is split into towers, met by a reduction the rule would sum.

Summing a tower's `Sum` or `Mean` over every tower gives one device's value only when whatever
meets it is the same for one device: per-example values, and values that do not depend on the
examples at all. Some values depend on the tower's share of the batch without holding it:

    the tower's own batch size     Shape or Size of a tensor holding the batch, where the batch
                                   axis counts (`tf.cast(tf.shape(h)[0], …)`, a reduce_prod of it)
    its own count, a constant      a constant divisor equal to the number of elements the tower's
                                   reduction sums (static shapes)
    a value the trace lost         an op that takes the batch in and gives none out, not a
                                   reduction: one of its examples picked out (a shift `h[0]`), or
                                   an op past which the batch axis could not be followed

A sum of deviations from a tower's first example, or divided by the tower's own count, summed over
towers, is no one's statistic: with graphsync/match/'s hand-written forms switched off, the rule
alone gave errors of 1.0 to 41 (relative) on tf.nn.sufficient_statistics with and without a shift
and on a sum over a count read from the shape. `reason` finds such a value on either side of a
reduction (in what it reduces, and in what meets its value before it goes back into the examples);
the reduction is then refused, naming it, rather than synchronized wrong.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from graphsync import batch_axis
from graphsync.graph.backward import is_backward
from graphsync.graph.backward import forward_readers

_SIZES = frozenset({"Shape", "ShapeN", "Size"})
_INDEXING = frozenset({"StridedSlice", "GatherV2", "Gather"})
_RANDOM = ("Random", "StatelessRandom", "TruncatedNormal", "StatelessTruncatedNormal", "Multinomial",
           "StatelessMultinomial", "ParameterizedTruncatedNormal")
_LEAVES = frozenset({"Const", "VariableV2", "VarHandleOp", "ReadVariableOp", "Placeholder", "PlaceholderWithDefault"})


def reason(op: tf.Operation, analysis, budget: int = 400) -> str | None:
    """Why summing `op` over the towers would not give one device's value, or None."""
    ended = dict(analysis.ended)
    found = _upstream(op.inputs[0], analysis, ended, budget)
    if found:
        return f"reduces over the batch values made with {found}, which depends on how the batch is split into towers"
    count = _own_count(op) if op.type == "Sum" else None
    for other in _met(op, analysis, budget):
        found = _upstream(other, analysis, ended, budget) or _is_count(other, count)
        if found:
            return f"reduces over the batch, and its value meets {found}, which depends on how the batch is split " \
                "into towers"
    return None


def _upstream(tensor: tf.Tensor, analysis, ended: dict, budget: int) -> str | None:
    """The first value in `tensor`'s making that depends on the tower's share of the batch."""
    stack, seen = [(tensor, None)], set()
    while stack and budget > 0:
        t, via = stack.pop()
        op = t.op
        if (t.ref(), via) in seen or op.type in _LEAVES or op in analysis.cross or is_backward(op):
            continue
        seen.add((t.ref(), via))
        budget -= 1
        if op.type in _SIZES:
            x = op.inputs[t.value_index] if op.type == "ShapeN" else op.inputs[0]
            if analysis.carries(x) and _counts_batch(op, x, via, analysis):
                return f"{op.name} ({op.type}: the tower's own batch size)"
            continue
        if analysis.carries(t):   # per example: only what elementwise arithmetic mixed in (h − shift)
            if op.type in batch_axis.ELEMENTWISE:
                stack += [(i, op) for i in op.inputs if not analysis.carries(i)]
            continue
        if any(analysis.carries(i) for i in op.inputs):
            return f"{op.name} ({op.type}: {ended.get(op, 'it takes the batch in and gives none out')})"
        stack += [(i, op) for i in _values_read(op)]
    return None


def _values_read(op: tf.Operation) -> list:
    """The inputs whose values `op`'s output is made of: not the shape a random op or a fill is
    given (a dropout mask of the tower's shape is no count of it), nor a seed."""
    if op.type.startswith(_RANDOM):
        return []
    return list(op.inputs)[1:] if op.type == "Fill" else list(op.inputs)


def _counts_batch(size: tf.Operation, x: tf.Tensor, via, analysis) -> bool:
    """Whether the sizes read by `via` from `size` (a Shape of x) include a batch axis of x."""
    if size.type == "Size" or via is None or via.type not in _INDEXING:
        return True
    batch, rank = analysis.batch.get(x.ref(), frozenset()), x.shape.rank
    index = tf.get_static_value(via.inputs[1])
    if index is None or rank is None:
        return True
    if via.type == "StridedSlice":
        if via.get_attr("shrink_axis_mask") != 1 or np.size(index) != 1:
            end, stride = tf.get_static_value(via.inputs[2]), tf.get_static_value(via.inputs[3])
            if end is None or stride is None or np.size(index) != 1 or via.get_attr("begin_mask") \
                    or via.get_attr("end_mask") or via.get_attr("ellipsis_mask"):
                return True
            dims = range(*[int(np.ravel(v)[0]) % (rank + 1) for v in (index, end)], int(np.ravel(stride)[0]))
        else:
            dims = [int(np.ravel(index)[0])]
    else:
        dims = np.ravel(index).tolist()
    return any(int(d) % rank in batch for d in dims)


def _met(op: tf.Operation, analysis, budget: int):
    """The tensors that meet `op`'s value on its way back into the examples: the other inputs of
    the ops it flows through while it holds no example, and of the first ones that do."""
    def enter(reader):   # the statistic's own arithmetic, before it meets the examples
        return reader.type in batch_axis.ELEMENTWISE and not any(analysis.carries(o) for o in reader.outputs)

    readers = list(forward_readers(op, enter, budget))
    downstream = {op, *readers}
    return [t for reader in readers for t in reader.inputs if t.op not in downstream]


def _own_count(op: tf.Operation) -> float | None:
    """The number of elements `op` sums in its tower, when its input's shape is static."""
    x = op.inputs[0]
    axes = tf.get_static_value(op.inputs[1])
    if not x.shape.is_fully_defined() or axes is None:
        return None
    rank = x.shape.rank
    return float(np.prod([x.shape[int(a) % rank] for a in np.ravel(axes)]))


def _is_count(tensor: tf.Tensor, count) -> str | None:
    """`tensor`, when its value is known before the run and equals the tower's own count n or n − 1
    (Bessel's correction), or their reciprocals (a divisor read from static shapes): one device would
    divide by another."""
    if count is None or count <= 1:
        return None
    value = _value(tensor)
    if value is None or np.size(value) != 1:
        return None
    value = float(np.ravel(value)[0])
    for n, what in ((count, "the tower's own count of elements"), (count - 1, "the tower's own count less one")):
        if np.isclose(value, n) or np.isclose(value * n, 1.0):   # less one: Bessel's correction
            return f"{tensor.op.name} ({tensor.op.type}: {what}, {n:g})"
    return None


_BINARY = {"Mul": np.multiply, "MulNoNan": np.multiply, "RealDiv": np.divide, "Div": np.divide,
           "TrueDiv": np.divide, "DivNoNan": np.divide, "FloorDiv": np.floor_divide, "Add": np.add,
           "AddV2": np.add, "Sub": np.subtract, "Maximum": np.maximum, "Minimum": np.minimum}
_UNARY = {"Cast": lambda v: v, "Identity": lambda v: v, "StopGradient": lambda v: v,
          "Reciprocal": lambda v: 1.0 / v, "Inv": lambda v: 1.0 / v}


def _value(tensor: tf.Tensor, depth: int = 8):
    """The value of `tensor` if the graph fixes it (constants, static shapes, and the arithmetic,
    casts, products and single-element slices of them), as float64; else None."""
    value = tf.get_static_value(tensor)
    if value is not None:
        return np.asarray(value, np.float64)
    op = tensor.op
    if depth == 0:
        return None
    ins = [_value(t, depth - 1) for t in op.inputs[:2]] if op.type in _BINARY or op.type in ("Prod", "StridedSlice") \
        else [_value(op.inputs[0], depth - 1)] if op.type in _UNARY else None
    if not ins or any(v is None for v in ins):
        return None
    with np.errstate(all="ignore"):
        if op.type in _BINARY:
            return _BINARY[op.type](*ins)
        if op.type in _UNARY:
            return _UNARY[op.type](ins[0])
        if op.type == "Prod":
            return np.prod(ins[0], axis=tuple(int(a) for a in np.ravel(ins[1])) if ins[0].ndim else None)
    if op.get_attr("shrink_axis_mask") == 1 and ins[0].ndim == 1 and np.size(ins[1]) == 1:   # shape[k]
        return ins[0][int(np.ravel(ins[1])[0])]
    return None
