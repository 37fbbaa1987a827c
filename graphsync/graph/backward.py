"""Which ops of a graph belong to a backward pass, known by what a gradient's seed reaches.

Every stage that walks the forward must stop at the backward: the gradients of a batch norm, of
the loss and of every layer read forward tensors, and their sums over the batch (the loss's
gradient broadcast back to the examples, a weight gradient, a batch norm's own backward) are the
gradient of whole-batch statistics, not statistics the forward reads back. Names cannot say which
ops those are: tf.gradients puts them under `gradients/`, TF2's tape under `gradient_tape/`, a
`tf.function`'s own gradient in a body named after its forward, graphsync under its own scopes.
Nor can op types: a transposed convolution *is* a `Conv2DBackpropInput` in the forward, a decoder
may upsample by an op whose type ends in `Grad`, and everything after them is forward.

The backward is what flows from a gradient's seed, the tensor of ones a gradient starts from:
tf.gradients' `Fill(Shape(loss), 1)` or `OnesLike`, and the tape's constant `ones` (a
`tf.function`'s gradient body is called with tensors the seed reached, so it is reached too). A
tensor of ones is a seed only when it is no ancestor of the forward: of a batch norm in training mode, of a `Mean`,
of a value a gradient kernel reads as the forward's (a ReLU's output for ReluGrad, a convolution's
input for Conv2DBackpropFilter; a mask or a weight of ones in the forward is one); a constant one
only when it also reaches an op of a gradient kernel's type (a `1 - momentum` for a moving average
does not). Types only narrow down which constants to look at: they never make an op backward.

An op is in the backward when a seed reaches it through data, or when only the backward reads it
beyond its shape (what a gradient function computes off the forward's tensors: a shape, a max's
indicators, a v1 while loop's stack of forward values, popped by the loop's gradient; never the
loss, read by nothing but its gradient's Shape). A graph whose gradients do not exist yet has no
backward at all. The set is found once per graph and extended as ops are added (graphsync's own
backward, spliced beside the gradients it replaces, reads them); a new seed (tf.gradients called
again) has it found anew.
"""
from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from graphsync.graph import by_type, marks, tf_private
from graphsync.graph.walks import DataEdges, ancestors as _ancestors, descendants as _descendants
from graphsync.graph.op_types import FUSED_BATCH_NORM_TYPES, SHAPE_TYPES

_KERNEL_SUFFIXES = ("Grad", "GradV2", "GradV3", "GradGrad")
# op types that, in a graph holding a tensor of ones, say the ones may be a tape's seed
_KERNEL_TYPES = frozenset({"BroadcastGradientArgs", "SymbolicGradient", "StackPopV2"})
_FUSED = frozenset(FUSED_BATCH_NORM_TYPES)
# where common kernels read the incoming gradient; their other inputs are forward values (a
# ReLU's output, a convolution's input, a batch norm's x), which no gradient seed is an ancestor of
_GRADIENT_INPUTS = {
    **dict.fromkeys(("ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad",
                     "SoftsignGrad", "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3",
                     "BiasAddGrad", "LRNGrad", "ResizeBilinearGrad", "ResizeNearestNeighborGrad"), (0,)),
    **dict.fromkeys(("SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "InvGrad",
                     "AvgPoolGrad", "AvgPool3DGrad"), (1,)),
    **dict.fromkeys(("Conv2DBackpropInput", "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropInput",
                     "MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad"), (2,)),
    # a filter's gradient reads the gradient at 2 for a convolution, at 0 for a transposed one
    **dict.fromkeys(("Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter"), (0, 2)),
}
_FILLS = frozenset({"Fill", "OnesLike"})
_SHAPES = frozenset(SHAPE_TYPES)

_known = weakref.WeakKeyDictionary()   # graph → _Backward, as of the graph version it last saw


def is_kernel_type(op_type: str) -> bool:
    """Whether gradient functions create ops of this type (which a forward may hold too: a
    transposed convolution is a `Conv2DBackpropInput`): a hint where to look, never a verdict."""
    return op_type in _KERNEL_TYPES or op_type.endswith(_KERNEL_SUFFIXES) or "Backprop" in op_type


def is_backward(op: tf.Operation) -> bool:
    """Whether `op` belongs to a backward pass of its graph (the module docstring)."""
    return op in _state(op.graph).ops


def _state(graph: tf.Graph) -> "_Backward":
    """The graph's backward as of now: found once, extended by the ops added since."""
    state = _known.get(graph)
    if state is None:
        state = _known[graph] = _Backward(graph)
    elif state.version != graph.version:
        state = _known[graph] = state.extend(graph)
    return state


def seeds(graph: tf.Graph) -> list:
    """The ops the backward of `graph` flows from: tf.gradients' `Fill(Shape(loss), 1)` and
    `OnesLike(loss)`, a tape's constant ones (the module docstring)."""
    return list(_state(graph).seeds)


def judge_again(graph: tf.Graph) -> None:
    """Forget what was judged of `graph`: ops added since are otherwise judged by their inputs
    alone, and while tf.gradients is building a backward its seed and the ops it computes off the
    forward (a loss's 2·(y − t)) look like forward ops until judged with the whole graph."""
    _known.pop(graph, None)


def has_backward(graph: tf.Graph) -> bool:
    """Whether `graph` holds any backward op yet (tf.gradients or a tape has run)."""
    return bool(_state(graph).ops)


class _Backward:
    """The backward ops of one graph, found once, then extended by the ops added since."""

    def __init__(self, graph: tf.Graph):
        self.version = graph.version
        self.seeds, edges = _seeds(graph)
        self.ops = _descendants(self.seeds, edges=edges) if self.seeds else set()
        if self.ops:
            self._add_read_only_by_backward(self.ops, edges)
            stacks = _popped_stacks(graph, edges) - self.ops
            if stacks:
                self.ops |= stacks
                self._add_read_only_by_backward(stacks, edges)

    def _add_read_only_by_backward(self, added, edges: DataEdges) -> None:
        """What a gradient function computes off the forward: ops only the backward reads, found
        from the inputs of the backward ops `added` (a fixpoint: such an op's inputs are next)."""
        stack = list(dict.fromkeys(i for op in added for i in edges.inputs_of(op) if i not in self.ops))
        while stack:
            op = stack.pop()
            if op not in self.ops and _read_only_by(op, self.ops, edges.readers[op]):
                self.ops.add(op)
                stack.extend(i for i in edges.inputs_of(op) if i not in self.ops)

    def extend(self, graph: tf.Graph) -> "_Backward":
        """The state with the ops added since: judged by their inputs, or all found anew when one of
        them is a new seed (tf.gradients called again)."""
        for op in tf_private.ops_added_since(graph, self.version):
            if any(t.op in self.ops for t in op.inputs):
                self.ops.add(op)
            elif op.type in _FILLS and _is_ones(op):   # ones of the forward's shape: maybe a new seed
                return _Backward(graph)
        self.version = graph.version
        return self


def _seeds(graph: tf.Graph) -> tuple[list, DataEdges | None]:
    """The tensors of ones gradients start from (module docstring), and the graph's edges when
    they had to be read (the walks from the seeds reach nearly every op; a graph without a tensor
    of ones or a gradient kernel's type, as most function bodies, needs none). The ops come grouped
    by type (graph/by_type.py: an op's type is a call into TensorFlow, and the matchers group them
    anyway)."""
    grouped = by_type.grouped(graph)
    candidates = [op for kind in _FILLS for op in grouped.get(kind, ()) if _is_ones(op)]
    marks = [op for kind in ("Mean",) + tuple(_FUSED) for op in grouped.get(kind, ())]
    kernels = [op for kind, ops in grouped.items() if is_kernel_type(kind) for op in ops]
    if not candidates and not kernels:   # a tape's constant seed reaches a gradient kernel's type
        return [], None
    edges = DataEdges(graph)
    forward_reads = [t.op for k in kernels if k.type in _GRADIENT_INPUTS
                     for i, t in enumerate(k.inputs) if i not in _GRADIENT_INPUTS[k.type]]
    forward = _ancestors([op for op in marks if _forward_mark(op)] + forward_reads, edges=edges)
    if kernels:   # what reaches the kernels other than through the forward (whose constants are no seed)
        reaching_kernels = _ancestors(kernels, beyond=forward, edges=edges)
        candidates += [op for op in grouped.get("Const", ()) if op in reaching_kernels and _is_ones(op)]
    return [op for op in candidates if op not in forward], edges


def _forward_mark(op: tf.Operation) -> bool:
    """A batch norm in training mode or a mean: forward ops (a fused batch norm in inference mode
    may be a backward's: graphsync's own gradient normalizes with statistics it is given)."""
    if op.type == "Mean":
        return True
    return op.type in _FUSED and bool(op.get_attr("is_training"))


def _popped_stacks(graph: tf.Graph, edges: DataEdges) -> set:
    """A v1 while loop's gradient keeps the forward's values on a stack, pushed in the forward loop
    and popped in the backward's (even a value it then leaves unused): a stack something pops is
    the backward's, pushes included (read by nothing). Nothing else TensorFlow builds pops one."""
    found = set()
    for op in by_type.grouped(graph).get("StackV2", ()):
        users = _descendants([op], edges=edges)
        if any(u.type == "StackPopV2" for u in users):
            found |= users
    return found


def _read_only_by(op: tf.Operation, backward: set, consumers: list) -> bool:
    """Whether only the backward reads `op`, beyond its shape: what a gradient function computes
    off the forward's tensors (a shape, a max's indicators). Its shape alone does not count: the
    loss, which the script fetches, is read by nothing but its gradient's `Shape`. Nor does a
    forward op graphsync copied to run late for the backward (graph/marks.py): it is forward
    arithmetic, and recompute must tell it from the gradients it waits for."""
    return all(c in backward for c in consumers) and any(c.type not in _SHAPES for c in consumers) \
        and not marks.is_recomputed(op)   # last: reading an op's attributes is the dearest


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


def forward_readers(op: tf.Operation, enter, budget: int = 400):
    """Each forward op downstream of `op`, once (gradient ops left out), walked on past those for
    which `enter(reader)` holds; at most `budget` of them."""
    seen, stack = {op}, [op]
    while stack and budget > 0:
        for t in stack.pop().outputs:
            for reader in t.consumers():
                if reader in seen or is_backward(reader):
                    continue
                seen.add(reader)
                budget -= 1
                yield reader
                if enter(reader):
                    stack.append(reader)
