"""One input to feed, and how its description is checked and completed (shape, range)."""
from __future__ import annotations

import dataclasses
import enum

import numpy as np
import tensorflow as tf

from graphsync.graph import shapes
from graphsync.errors import GraphsyncError
from graphsync.verification.discovery import classes, names


class Feed(enum.StrEnum):
    """How an input is fed (`Input.kind`)."""

    PER_TOWER = "per_tower"
    SHARED = "shared"
    FIXED = "fixed"


@dataclasses.dataclass
class Input:
    """One input to feed.

    kind:  "per_tower"  one tensor in each tower (in tower order); examples move between towers
           "shared"     one tensor holding the whole multi-tower batch in tower order
           "fixed"      not batch-shaped (a flag, a learning rate): fed the same value in both runs
    """

    kind: Feed
    tensors: list[str]
    dtype: tf.DType
    example_shape: tuple          # shape of one example ("fixed": the whole value's shape)
    static_batches: list          # each tensor's first dimension when the graph fixes it, else None
    classes: int | None = None    # integer inputs: values drawn from [0, classes)
    classes_from: str = ""
    value: object = None          # "fixed": what is fed
    origin: str = ""              # how it was found (shown in the report)
    draw: str = "examples"        # examples (scaled per example), or a random op's own: uniform, normal, truncated

    @property
    def label(self) -> str:
        return self.tensors[0] if self.kind is not Feed.PER_TOWER else names.tower_pattern(self.tensors)


def batch(graph: tf.Graph, kind: Feed, tensor_names: list[str], num_classes, origin: str = "") -> Input:
    """A batch-shaped input (first axis = examples) fed random examples."""
    tensor = graph.get_tensor_by_name(tensor_names[0])
    shape = tensor.shape
    if shape.rank is None or shape.rank == 0:
        raise GraphsyncError(f"{tensor.name} has {'unknown rank' if shape.rank is None else 'no batch axis'}: "
                             "feed a batch-shaped tensor (first axis = examples)")
    dtype = tensor.dtype.base_dtype
    if not (dtype.is_floating or dtype.is_integer or dtype == tf.bool):
        raise GraphsyncError(f"cannot make random {dtype.name} data for {tensor.name}: name the numeric "
                             "tensors computed from it with --input")
    tensors = [graph.get_tensor_by_name(n) for n in tensor_names]
    example_shapes = {tuple(t.shape[1:].as_list()) if t.shape.rank else None for t in tensors}
    if len(example_shapes) != 1:
        raise GraphsyncError(f"{names.tower_pattern(tensor_names)} holds examples of different shapes in "
                             f"different towers ({sorted(map(str, example_shapes))})")
    found, source = None, ""
    if dtype.is_integer:
        if num_classes:
            found, source = int(num_classes), "--num-classes"
        else:
            found, source = classes.count(tensor)
        if not found:
            raise GraphsyncError(f"cannot tell the range of integer input {names.tower_pattern(tensor_names)}: "
                                 "pass --num-classes K")
    return Input(kind, list(tensor_names), dtype, tuple(shape[1:].as_list()), [shapes.dim(t.shape, 0) for t in tensors],
                 found, source, origin=origin)


def fixed(tensor: tf.Tensor) -> Input:
    """A value for a placeholder without a batch axis: True for flags, 1 for numbers."""
    if not tensor.shape.is_fully_defined():
        raise GraphsyncError(f"cannot tell what to feed {tensor.name} (shape {tensor.shape}, outside the "
                             "towers): pass its value with --feed NAME=VALUE or name it with --input")
    dtype = tensor.dtype.base_dtype
    if dtype == tf.bool:
        value = True
    elif dtype.is_floating or dtype.is_integer:
        value = 1
    else:
        raise GraphsyncError(f"cannot tell what to feed {tensor.name} ({dtype.name}): pass --feed NAME=VALUE")
    array = np.full(tensor.shape.as_list(), value, dtype.as_numpy_dtype)
    return Input(Feed.FIXED, [tensor.name], dtype, tuple(array.shape), [None], value=array, origin="a placeholder")


def given(tensor: tf.Tensor, value) -> Input:
    """--feed NAME=VALUE."""
    try:
        array = np.asarray(value, tensor.dtype.base_dtype.as_numpy_dtype)
    except (TypeError, ValueError):
        raise GraphsyncError(f"cannot feed {value!r} to {tensor.name} ({tensor.dtype.base_dtype.name})") from None
    return Input(Feed.FIXED, [tensor.name], tensor.dtype.base_dtype, array.shape, [None], value=array, origin="--feed")
