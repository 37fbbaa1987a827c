"""Which ops of a graph belong to a backward pass, known by the graph's structure alone.

Every stage that walks the forward must stop at the backward: the gradients of a batch norm, of
the loss and of every layer read forward tensors, and their sums over the batch (the loss's
gradient broadcast back to the examples, a weight gradient, a batch norm's own backward) are the
gradient of whole-batch statistics, not statistics the forward reads back. Names cannot say which
ops those are: tf.gradients puts them under `gradients/`, TF2's tape under `gradient_tape/`, a
`tf.function`'s own gradient in a body named after its forward, graphsync under its own scopes.

The backward is what flows from a gradient's two kinds of sources:

  kernels  op types only gradient functions create: `*Grad`, `*GradV2`, `*GradV3`, `*Backprop*`
           (ReluGrad, FusedBatchNormGradV3, BiasAddGrad, Conv2DBackpropFilter …) and
           BroadcastGradientArgs, which shapes the reductions of a broadcast's gradient, and
           the stacks a v1 while loop's gradient keeps the forward's values on;
  seeds    the tensor of ones a gradient starts from: tf.gradients' `Fill(Shape(loss), 1)`, or
           `OnesLike`, and the tape's constant `ones`. A tensor of ones is a seed only when it
           is no ancestor of the forward: of a batch norm, of a `Mean`, of a value a kernel
           reads as the forward's (a ReLU's output for ReluGrad, a convolution's input for
           Conv2DBackpropFilter; a mask or a weight of ones in the forward is one); a constant
           one only when it also reaches a kernel (a `1 - momentum` for a moving average does not).

An op is in the backward when it is a kernel or a seed, or when one of its data inputs is, or when
only the backward reads it beyond its shape (what a gradient function computes off the forward's
tensors: a shape, a max's indicators; never the loss, read by nothing but its gradient's Shape). Ops
added later (graphsync's own backward, spliced beside the gradients it replaces, reads them) are
judged by the same rule when first asked about.
"""
from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from graphsync.graph import tf_private

_KERNEL_SUFFIXES = ("Grad", "GradV2", "GradV3", "GradGrad")
# the gradient of a v1 while loop saves the forward's values on stacks: nothing else builds them
_KERNEL_TYPES = frozenset({"BroadcastGradientArgs", "SymbolicGradient", "StackV2", "StackPushV2", "StackPopV2"})
_FORWARD_MARKS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "Mean"})
# where common kernels read the incoming gradient; their other inputs are forward values (a
# ReLU's output, a convolution's input, a batch norm's x), which no gradient seed is an ancestor of
_GRADIENT_INPUTS = {
    **dict.fromkeys(("ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad",
                     "SoftsignGrad", "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3",
                     "BiasAddGrad", "LRNGrad", "ResizeBilinearGrad", "ResizeNearestNeighborGrad"), (0,)),
    **dict.fromkeys(("SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "InvGrad",
                     "AvgPoolGrad", "AvgPool3DGrad"), (1,)),
    **dict.fromkeys(("Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3DBackpropInputV2",
                     "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropInput",
                     "DepthwiseConv2dNativeBackpropFilter", "MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad"), (2,)),
}
_FILLS = frozenset({"Fill", "OnesLike"})
_SHAPES = frozenset({"Shape", "ShapeN", "Size", "Rank"})

_known = weakref.WeakKeyDictionary()   # graph → _Backward, as of the graph version it last saw


def is_kernel_type(op_type: str) -> bool:
    """Whether only a gradient function creates ops of this type."""
    return op_type in _KERNEL_TYPES or op_type.endswith(_KERNEL_SUFFIXES) or "Backprop" in op_type


def is_backward(op: tf.Operation) -> bool:
    """Whether `op` belongs to a backward pass of its graph (the module docstring)."""
    graph = op.graph
    state = _known.get(graph)
    if state is None:
        state = _known[graph] = _Backward(graph)
    elif state.version != graph.version:
        state.extend(graph)
    return op in state.ops


def judge_again(graph: tf.Graph) -> None:
    """Forget what was judged of `graph`: ops added since are otherwise judged by their inputs
    alone, and while tf.gradients is building a backward its seed and the ops it computes off the
    forward (a loss's 2·(y − t)) look like forward ops until judged with the whole graph."""
    _known.pop(graph, None)


def has_backward(graph: tf.Graph) -> bool:
    """Whether `graph` holds any backward op yet (tf.gradients or a tape has run)."""
    ops = graph.get_operations()
    return bool(ops) and (is_backward(ops[0]) or bool(_known[graph].ops))


class _Backward:
    """The backward ops of one graph, found once, then extended by the ops added since."""

    def __init__(self, graph: tf.Graph):
        ops = graph.get_operations()
        self.version = graph.version
        kernels = [op for op in ops if is_kernel_type(op.type)]
        candidates = [op for op in ops if op.type in _FILLS and _is_ones(op)]
        if kernels:   # a constant seed reaches a kernel: a graph without kernels has none
            reaching_kernels = _ancestors(kernels)
            candidates += [op for op in ops if op.type == "Const" and op in reaching_kernels and _is_ones(op)]
        seeds = []
        if candidates:
            forward_reads = [t.op for k in kernels if k.type in _GRADIENT_INPUTS
                             for i, t in enumerate(k.inputs) if i not in _GRADIENT_INPUTS[k.type]]
            forward = _ancestors([op for op in ops if op.type in _FORWARD_MARKS] + forward_reads)
            seeds = [op for op in candidates if op not in forward]
        self.ops = _descendants(kernels + seeds)
        if self.ops:
            for op in reversed(ops):   # what a gradient function computes off the forward
                if op not in self.ops and _read_only_by(op, self.ops):
                    self.ops.add(op)

    def extend(self, graph: tf.Graph) -> None:
        for op in tf_private.ops_added_since(graph, self.version):
            if is_kernel_type(op.type) or any(t.op in self.ops for t in op.inputs):
                self.ops.add(op)
        self.version = graph.version


def _read_only_by(op: tf.Operation, backward: set) -> bool:
    """Whether only the backward reads `op`, beyond its shape: what a gradient function computes
    off the forward's tensors (a shape, a max's indicators). Its shape alone does not count: the
    loss, which the script fetches, is read by nothing but its gradient's `Shape`."""
    consumers = [c for t in op.outputs for c in t.consumers()]
    return any(c.type not in _SHAPES for c in consumers) and all(c in backward for c in consumers)


def _is_ones(op: tf.Operation) -> bool:
    """A tensor of ones: a constant, `Fill(shape, 1)`, or `OnesLike`."""
    if op.type == "OnesLike":
        return True
    if op.type == "Fill":
        return _is_ones(op.inputs[1].op)
    return op.type == "Const" and op.outputs[0].dtype.is_floating and _all_ones(op)


def _all_ones(const: tf.Operation) -> bool:
    """Read from the attribute: tf.get_static_value would make the constant unfeedable."""
    value = tf.make_ndarray(const.get_attr("value"))
    return value.size > 0 and bool(np.all(value == 1))


def _ancestors(ops) -> set:
    """`ops` and every op they read data from."""
    found, stack = set(ops), list(ops)
    while stack:
        for t in stack.pop().inputs:
            if t.op not in found:
                found.add(t.op)
                stack.append(t.op)
    return found


def _descendants(ops) -> set:
    """`ops` and every op that reads data from them."""
    found, stack = set(ops), list(ops)
    while stack:
        for t in stack.pop().outputs:
            for consumer in t.consumers():
                if consumer not in found:
                    found.add(consumer)
                    stack.append(consumer)
    return found
