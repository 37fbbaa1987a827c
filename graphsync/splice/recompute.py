"""Recompute (rewrite_towers(recompute=True)): the backward reads a recomputed normalized output,
and recomputed elementwise ops that follow it in the tower, instead of the forward's tensors.

A conv → batch norm → activation layer otherwise keeps two activation-sized tensors alive from its
forward to its backward: the batch norm's input x (its gradient needs it) and the activation's
output a (the activation's gradient, the next convolution's filter gradient). `a` is a cheap
function of x and of per-channel statistics the synchronized layer already holds, so the gradient
ops that read it (and the normalized output, and every elementwise op between them) read copies
instead, made from x and the *same* synchronized statistics: no statistic is recomputed, no
exchange repeated, no moving average updated twice. The copies are the same ops on the same
inputs, so a step with recompute is bit for bit the step without (a forward sum or product the
backward no longer reads is pinned, `_pin`, so that Grappler does not re-associate it).

What is recomputed, per tower, from the layer's normalization:
    fused layers    the normalization op graphsync made (FusedBatchNormV3, is_training=False)
    moments layers  the first scale or shift of x by a per-channel tensor made from the synchronized
                    statistics (tf.nn.batch_normalization's x·inv, a hand-written x − μ)
then, while the forward goes on in the same tower and device, `ACTIVATIONS` and `AFFINE` ops
whose other input is per channel (or a scalar), and the `Merge` of a tensor training flag (the
synchronized output merged with the original layer's, graphsync/splice/stand_in.py, or a v1
tf.cond's output). The Merge's copy reads the recomputed output and the original's tensor: when the
flag trains, that tensor is dead and the copy passes the recomputation on; when it does not, the
recomputation is dead (its input is a gate's training side) and the copy passes the original on.

Each copy waits, by a control edge, for the gradient tensors its readers take besides the forward's
(the incoming gradient), so it runs only once the backward has reached the layer; a copy whose
reader's gradient input would itself depend on a copy is not made to wait for it (no cycle).
Grappler keeps the copies apart from the forward: their control inputs and the `Mark.RECOMPUTED`
attribute make them different nodes to common-subexpression elimination (arithmetic optimizer and
the graph optimizer's CSE), and the control edge is the only path from the gradient to the copy,
so the dependency optimizer's transitive reduction keeps it.

A layer rewritten before its gradients has nothing to move yet: the rewrite names its roots on the
op whose gradient function graphsync registered and tf.gradients reaches last in the layer's
backward (a fused layer's normalization, a moments layer's statistics view), and that function
recomputes (`when_differentiated`): tf.gradients works in reverse topological order, so by then
every gradient op that reads the layer's forward outputs exists, and so does its incoming
gradient. The names live in an attribute, so a saved graph differentiated elsewhere recomputes too.
"""
from __future__ import annotations

import collections
import dataclasses

import tensorflow as tf

from graphsync.graph import marks, tf_private
from graphsync.graph.marks import Mark
from graphsync.graph.op_types import SHAPE_TYPES
from graphsync.graph.reroute import reroute_consumers
from graphsync.graph.tf_private import create_op, pristine_scope
from graphsync.graph.backward import is_backward
from graphsync.graph.walks import descendants

ACTIVATIONS = frozenset({"Relu", "Relu6", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "Identity"})
AFFINE = frozenset({"Mul", "AddV2", "Add", "BiasAdd", "Sub", "RealDiv"})   # with a per-channel operand
_NOT_COPIED = {mark.value for mark in marks.NOT_COPIED}
_SHAPE_TYPES = frozenset(SHAPE_TYPES)
_ASSOCIATIVE = frozenset({"Mul", "Add", "AddV2"})
# tf.gradients' scopes, and graphsync's synchronized backward (graphsync/splice/layer.py)
_STATISTICS_DEPTH = 12   # ops between a synchronized statistic and the per-channel operand it becomes


@dataclasses.dataclass
class Recomputed:
    """What recomputing one tower's layer did: tensors whose backward readers moved to copies, the
    copies made, and the edges moved."""

    tensors: int = 0
    ops: int = 0
    edges: int = 0

    def __add__(self, other: "Recomputed") -> "Recomputed":
        return Recomputed(self.tensors + other.tensors, self.ops + other.ops, self.edges + other.edges)


def fused_roots(y: tf.Tensor) -> list:
    """A fused layer's recomputation starts from graphsync's own normalization op."""
    return [y.op]


def moments_roots(x: tf.Tensor, statistics: list) -> list:
    """A moments layer's: the forward ops that scale or shift x by a per-channel tensor computed
    from the synchronized statistics (`statistics`: the tensors every reader of the layer's mean and
    variance now reads)."""
    targets = {t.op for t in statistics}
    return [op for op in x.consumers() if op.type in AFFINE and not is_backward(op)
            and _per_channel_operand(op, x) is not None
            and _reaches(_per_channel_operand(op, x), targets)]


def defer(trigger: tf.Operation, roots: list) -> None:
    """For a layer rewritten before its gradients: `trigger`'s gradient function will recompute
    from `roots` (module docstring)."""
    tf_private.set_attr(trigger, Mark.RECOMPUTE_ROOTS.value, marks.value(op.name.encode() for op in roots))


def when_differentiated(trigger: tf.Operation) -> Recomputed:
    """Called by `trigger`'s gradient function: the gradient ops tf.gradients has built so far
    read copies (nothing when `trigger` carries no roots)."""
    if not marks.has(trigger, Mark.RECOMPUTE_ROOTS):
        return Recomputed()
    graph = trigger.graph
    return recompute(graph, [graph.get_operation_by_name(name.decode())
                             for name in marks.get(trigger, Mark.RECOMPUTE_ROOTS)])


def recompute(graph: tf.Graph, roots: list) -> Recomputed:
    """Makes the gradient ops that read the outputs of `roots`, or of the elementwise ops that
    follow them in the forward, read copies made once the backward reaches them."""
    chain = _chain(roots)
    chained = {op.outputs[0].ref() for op in chain}
    readers = {op: [c for c in op.outputs[0].consumers() if is_backward(c) and c.type not in _SHAPE_TYPES]
               for op in chain}
    read = [op for op in chain if readers[op]]
    if not read:
        return Recomputed()
    needed = _with_chain_ancestors(read, chain)
    wait = incoming_gradients({r for op in read for r in readers[op]}, chained)
    if not wait:
        return Recomputed()   # nothing to wait for: a copy would run with the forward and save nothing
    return copy_ops(graph, needed, wait, [(op.outputs[0], readers[op]) for op in read])


def incoming_gradients(readers: set, read: set, downstream: set | None = None) -> list:
    """The backward ops feeding `readers` besides the tensors `read` (refs) whose copies they will
    take, and not computed from `readers` themselves (`downstream`, when known): what copies wait
    for, without a cycle."""
    incoming = {t.op for r in readers for t in r.inputs
                if t.ref() not in read and is_backward(t.op) and t.op.type not in _SHAPE_TYPES}
    incoming -= downstream if downstream is not None else descendants(readers, control=True)
    return sorted(incoming, key=lambda op: op.name)


def copy_ops(graph: tf.Graph, needed: list, wait: list, reads: list, suffix: str = "_recompute") -> Recomputed:
    """Copies `needed` (every op after its inputs' ops) on their devices, each waiting for `wait`,
    and moves each (tensor, readers) of `reads` onto the tensor's copy (named `<op><suffix>/…`)."""
    done, copies = Recomputed(), {}
    for op in needed:
        inputs = [copies.get(t.ref(), t) for t in op.inputs]
        attrs = {k: v for k, v in op.node_def.attr.items() if k != "_class" and k not in _NOT_COPIED}
        attrs[Mark.RECOMPUTED.value] = marks.value(True)
        with pristine_scope(graph, op.device, op.name + suffix), graph.control_dependencies(wait):
            copy = create_op(graph, op.type, inputs, attrs, op.type)
        copies.update((t.ref(), c) for t, c in zip(op.outputs, copy.outputs))
        done.ops += 1
    for t, readers in reads:
        shared = len(_data_readers(t.op)) > 1
        done.edges += reroute_consumers(t, copies[t.ref()], only=readers)
        done.tensors += 1
        if shared and _absorbable(t.op):
            _pin(graph, t.op)
    return done


def _data_readers(op: tf.Operation) -> list:
    return [reader for t in op.outputs for reader in t.consumers() if reader.type not in _SHAPE_TYPES]


def _absorbable(op: tf.Operation) -> bool:
    """Whether Grappler's arithmetic optimizer may fold `op` into its reader: a sum or product
    whose one reader is a sum or product of the same type (MinimizeBroadcasts re-associates such a
    chain, AddOpsRewrite sums it as one)."""
    readers = _data_readers(op)
    return op.type in _ASSOCIATIVE and len(readers) == 1 and readers[0].type == op.type


def _pin(graph: tf.Graph, op: tf.Operation) -> None:
    """`op`, a forward sum or product left with one reader of its own type once the backward's
    moved to copies (`_absorbable`), gets a control input from an op of its own that runs first and
    does nothing. Grappler's arithmetic optimizer absorbs no op with a control input into its reader,
    so it leaves `op` as it did while the backward read it, and the step stays bit for bit the step
    without recompute; unpinned, it computes ((x − μ)·r)·γ as (r·γ)·(x − μ) (1 ulp). The pin is a
    `ControlTrigger`: the dependency optimizer neither removes it nor makes it a NoOp it could
    bypass, and its one edge is no other path's shortcut. Its mark names `op`, so that
    common-subexpression elimination sees every pin as a different op: one trigger pinning two ops
    of a chain would keep only its edge to the first. Only such ops: pinning every op left with one
    reader changed MobileNetV2's step with segments, which is bit for bit without them.
    Not inside a while loop (a control input from outside its frame is an error)."""
    if tf_private.in_while_loop(op):
        return
    with pristine_scope(graph, op.device, op.name + "_pinned"):
        trigger = create_op(graph, "ControlTrigger", [], {Mark.PINNED.value: marks.value(op.name)}, "ControlTrigger")
    tf_private.add_control_inputs(op, [trigger])


def _chain(roots: list) -> list:
    """`roots` and the elementwise forward ops that follow them on the same device, in forward order."""
    chain, queue, seen = [], collections.deque(roots), set(roots)
    while queue:
        op = queue.popleft()
        chain.append(op)
        t = op.outputs[0]
        for consumer in t.consumers():
            if consumer in seen or is_backward(consumer) or consumer.device != op.device:
                continue
            if consumer.type in ACTIVATIONS and len(consumer.inputs) == 1 or \
                    consumer.type in AFFINE and _per_channel_operand(consumer, t) is not None or \
                    _is_flag_merge(consumer, t):
                if consumer.outputs[0].shape.is_compatible_with(t.shape) and consumer.outputs[0].dtype == t.dtype:
                    seen.add(consumer)
                    queue.append(consumer)
    return chain


def _is_flag_merge(op: tf.Operation, t: tf.Tensor) -> bool:
    """A two-way Merge taking `t` once: the output of a layer behind a training flag."""
    return op.type == "Merge" and len(op.inputs) == 2 and sum(u.ref() == t.ref() for u in op.inputs) == 1


def _per_channel_operand(op: tf.Operation, t: tf.Tensor):
    """The other operand of binary `op` reading `t` when it is per channel or a scalar (no more
    elements than one dimension of t), else None."""
    if len(op.inputs) != 2 or sum(u.ref() == t.ref() for u in op.inputs) != 1:
        return None
    if op.type in ("Sub", "RealDiv") and op.inputs[0].ref() != t.ref():
        return None   # c − x, c / x: not a scale or shift of x
    other = op.inputs[1] if op.inputs[0].ref() == t.ref() else op.inputs[0]
    size = other.shape.num_elements()
    dims = [d for d in t.shape.as_list()[1:] if d is not None] if t.shape.rank else []
    return other if size is not None and size <= max(dims + [1]) else None


def _reaches(t: tf.Tensor, targets: set) -> bool:
    """Whether per-channel tensor `t` is computed from one of `targets` within a few ops."""
    frontier, seen = [t.op], set()
    for _ in range(_STATISTICS_DEPTH):
        if any(op in targets for op in frontier):
            return True
        seen.update(frontier)
        frontier = [u.op for op in frontier for u in op.inputs if u.op not in seen]
        if not frontier:
            return False
    return False


def _with_chain_ancestors(read: list, chain: list) -> list:
    """The chain ops the copies of `read` need, in forward order."""
    members, needed, stack = set(chain), set(), list(read)
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        needed.add(op)
        stack += [t.op for t in op.inputs if t.op in members]
    return [op for op in chain if op in needed]
