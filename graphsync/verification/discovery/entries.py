"""Where a source's examples enter each tower: walking down from the source to the first tensors
that only one tower reads.

    per-tower source     a placeholder, iterator or random tensor read by one tower only: itself
    one whole batch      split, sliced, strided or unstacked outside the towers (tf.split, tf.slice,
                         x[i::T], tf.unstack), or sliced by each tower from the whole tensor: the
                         pieces, one (or more) per tower
    per-replica inputs   MirroredStrategy's iterators outside replica_1/…, read by one replica each:
                         as a per-tower source
    read as a whole      by something outside the towers that is no splitting (a loss over the
                         whole batch, say): GLOBAL, fed whole in tower order

Feeding the pieces rather than the whole tensor lets towers hold different numbers of examples
and keeps strided slicing right; the splitting ops then do not run.

An op that only carries examples on (plumbing, arithmetic with a constant) belongs to the tower
whose layers read what it passes on, wherever its name sits: tensorpack makes every tower's
inputs inside the first tower's scope (tower0/TensorInput/random_uniform_2 read by
tower1/image_preprocess/…), and any framework that builds the inputs before entering the tower
scopes does the same. Its name decides only when its examples reach no tower's layer.
(Carriers outside every tower are shared plumbing, walked through as before.)
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph.backward import is_backward

GLOBAL = "global"
# Ops that carry a whole batch to the towers without mixing its examples.
PLUMBING = ("Identity", "IdentityN", "Snapshot", "StopGradient", "EnsureShape", "Cast", "Reshape", "Squeeze", "ExpandDims",
            "Split", "SplitV", "Slice", "StridedSlice", "Unpack", "GatherV2", "Gather", "Transpose",
            "Enter", "Switch", "Merge")
SLICING = ("Split", "SplitV", "Slice", "StridedSlice", "Unpack", "GatherV2", "Gather")
_DATA_INPUT = {"Split": 1}   # which input holds the data (tf.split's axis comes first)
_WALK_LIMIT = 10000          # tensors followed down from one op to the layers reading its examples
ELEMENTWISE = ("Mul", "Add", "AddV2", "Sub", "RealDiv", "Div", "Maximum", "Minimum", "FloorDiv")


def constant(tensor: tf.Tensor) -> bool:
    """A value the graph fixes (a constant, or computed from constants only)."""
    return tensor.op.type == "Const" or tf.get_static_value(tensor) is not None


def carries(op: tf.Operation, tensor: tf.Tensor) -> bool:
    """`op` passes `tensor`'s examples on unmixed: plumbing, or arithmetic with a constant."""
    if op.type in PLUMBING:
        return op.type == "IdentityN" or data_input(op) is tensor
    if op.type in ELEMENTWISE and len(op.inputs) == 2:
        other = op.inputs[1] if op.inputs[0] is tensor else op.inputs[0]
        return constant(other)
    return False


def data_input(op: tf.Operation) -> tf.Tensor:
    return op.inputs[_DATA_INPUT.get(op.type, 0)]


def find(tensor: tf.Tensor, needed: set, tower_of_op):
    """{tower: [tensors it reads]} for `tensor`'s examples, or GLOBAL when something shared reads
    the whole of it (or it reaches no tower)."""
    found: dict = {}
    stack, seen = [tensor], set()
    while stack:
        current = stack.pop()
        if current.ref() in seen:
            continue
        seen.add(current.ref())
        readers = [c for c in current.consumers() if c in needed]
        if not readers:
            continue
        # the backward pass reads what its forward op reads, from wherever tf.gradients was called
        readers = [c for c in readers if not is_backward(c)] or readers
        tower_of_reader = {c: owner(c, current, needed, tower_of_op) for c in readers}
        owners = set(tower_of_reader.values())
        if len(owners) == 1 and None not in owners:
            found.setdefault(owners.pop(), []).append(current)
            continue
        for reader in readers:
            in_tower = tower_of_reader[reader] is not None
            if (reader.type in SLICING and data_input(reader) is current) if in_tower else carries(reader, current):
                stack.extend(o for o in reader.outputs if o.dtype == current.dtype or reader.type == "Cast")
            else:
                return GLOBAL
    return found or GLOBAL


def owner(op: tf.Operation, tensor: tf.Tensor, needed: set, tower_of_op):
    """The tower `op` belongs to as a reader of `tensor`: the tower its name is in, except for an
    op in a tower's scope that carries the examples on: the one tower whose layers read them (None
    when several do). Carriers outside the towers stay shared: `find` walks through them. An op
    outside the towers that combines the examples, elementwise, with one tower's tensors reads
    them for that tower: a loss written outside the tower scopes (`y_k - target_k`, the towers
    being TensorFlow's unique names `model/`, `model_1/` of a model called once per device)."""
    scoped = tower_of_op(op)
    if scoped is None:
        return _combined_with(op, tensor, tower_of_op)
    if not carries(op, tensor):
        return scoped
    reached = {tower_of_op(layer) for layer, _ in first_layers(op.outputs, needed)}
    if len(reached) == 1 and None not in reached:
        return reached.pop()
    return None if len(reached - {None}) > 1 else scoped


def _combined_with(op: tf.Operation, tensor: tf.Tensor, tower_of_op):
    """The one tower whose tensors `op` combines `tensor` with, elementwise; else None."""
    if op.type not in ELEMENTWISE + ("SquaredDifference",):
        return None
    others = {tower_of_op(t.op) for t in op.inputs if t is not tensor}
    return others.pop() if len(others) == 1 and None not in others else None


def first_layers(tensors, needed: set) -> list[tuple[tf.Operation, int]]:
    """The first forward ops below `tensors` that do more than carry their examples on, each with
    the input it reads them through."""
    found, stack, seen = [], list(tensors), set()
    while stack and len(seen) < _WALK_LIMIT:
        current = stack.pop()
        if current.ref() in seen:
            continue
        seen.add(current.ref())
        for reader in current.consumers():
            if reader not in needed or is_backward(reader):
                continue
            if carries(reader, current):
                stack.extend(reader.outputs)
            else:
                found.append((reader, [t.ref() for t in reader.inputs].index(current.ref())))
    return found
