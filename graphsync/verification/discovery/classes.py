"""The range of an integer input (labels, token ids), from what reads it: the logits' width of a
sparse softmax cross entropy, a one-hot depth, an in-top-k's predictions, a gather's table size;
else, for a tensor drawn in the graph by `random.uniform(…, maxval=K, dtype=int)`, its maxval."""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import shapes

PASS_THROUGH = ("Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
                "ToInt64", "ToInt32", "Split", "SplitV", "Slice", "StridedSlice", "Unpack")


def count(tensor: tf.Tensor) -> tuple[int | None, str]:
    """(number of classes, what told it), or (None, "")."""
    found = []
    stack, seen = [(tensor, 0)], set()
    while stack:
        t, depth = stack.pop()
        if t.ref() in seen or depth > 8:
            continue
        seen.add(t.ref())
        for op in t.consumers():
            index = next(i for i, x in enumerate(op.inputs) if x is t)
            if op.type in PASS_THROUGH and index == 0:
                stack.extend((out, depth + 1) for out in op.outputs)
            elif op.type == "SparseSoftmaxCrossEntropyWithLogits" and index == 1:
                found.append((shapes.dim(op.inputs[0].shape, -1), "the logits' width"))
            elif op.type == "OneHot" and index == 0:
                found.append((tf.get_static_value(op.inputs[1]), "a one-hot depth"))
            elif op.type in ("InTopK", "InTopKV2") and index == 1:
                found.append((shapes.dim(op.inputs[0].shape, -1), "the predictions' width"))
            elif op.type in ("GatherV2", "Gather") and index == 1:
                found.append((shapes.dim(op.inputs[0].shape, 0), "a gather's table size"))
            elif op.type == "ResourceGather" and index == 1:
                found.append((_variable_rows(op.inputs[0]), "a gather's table size"))
    sizes = [(int(n), why) for n, why in found if n is not None]
    if sizes:
        return min(sizes)
    return _drawn_range(tensor)


def _drawn_range(tensor: tf.Tensor) -> tuple[int | None, str]:
    """maxval of the RandomUniformInt that made `tensor` (through casts), when minval is 0."""
    op = tensor.op
    while op.type in ("Identity", "Cast") and op.inputs:
        op = op.inputs[0].op
    if op.type in ("RandomUniformInt", "StatelessRandomUniformIntV2", "StatelessRandomUniformInt"):
        low = tf.get_static_value(op.inputs[-2])
        high = tf.get_static_value(op.inputs[-1])
        if low is not None and high is not None and int(low) == 0 and int(high) > 0:
            return int(high), "the maxval it is drawn with"
    return None, ""


def _variable_rows(handle: tf.Tensor):
    op = handle.op
    if op.type == "VarHandleOp":
        shape = tf.TensorShape(op.get_attr("shape"))
        return shapes.dim(shape, 0) if shape.rank else None
    return None
