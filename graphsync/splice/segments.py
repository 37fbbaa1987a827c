"""Recompute whole forward segments (rewrite_towers(recompute="segments")): the backward reads copies
of a tower's forward — convolutions, pooling, concatenations, elementwise ops and the synchronized
normalizations — made from a few checkpoints once it reaches them, never a statistic again.

Why segments: `recompute=True` (graphsync/splice/recompute.py) brings back what a layer computes
from its batch norm's input, but that input, a convolution's output, stays alive from the forward
to the backward in every layer. Only running the convolutions again removes it. Chen et al.'s
sublinear-memory rule: keep one checkpoint every √n layers, recompute the rest segment by segment,
for one extra forward.

Segments. Each synchronized layer of a tower owns a *region*: the forward ops reached from its
roots (graphsync's normalization op, a moments layer's first scale of x, where a synchronized
reduction's value meets the activations; and, for the tower's first layer, the stem convolution
that makes its input) through activation-sized tensors on the roots' device, and from no later
layer's roots. Consecutive layers are grouped into segments (`cut`, graphsync/splice/segment_cost.py:
the grouping whose estimated peak is least, among greedy cuts at a ladder of sizes and cuts every k
layers, Chen et al.'s √n among them). What a segment reads from another — a skip connection, a
residual's shortcut, the input of its first convolution — is its checkpoint: the forward keeps it.
Every activation-sized tensor the backward reads inside the segment is a copy instead.

Statistics are never recomputed. Walking only through activation-sized tensors stops at every
statistic (per channel: a reduction over the batch, the exchange, the moving averages), so a copied
normalization reads the same global statistics the forward exchanged: nothing is exchanged twice
and no moving average is updated twice. Stateful ops (random ops, variable reads, queues,
collectives), training-mode fused batch norms and reductions over the batch axis are never copied
either: their forward outputs are checkpoints, so a dropout mask is the one the forward drew.

Timing. A segment's copies wait, by control edges, for the gradients flowing into the backward ops
that read the segment (never one computed from them: no cycle), and for the backward ops reading
the next segment's activations, so two segments' activations are not held at once. A wait that a
v1 Switch may leave dead (behind a tensor training flag, the backward of the branch not taken) is
replaced by its nearest ancestors that always run: a dead control input would kill the copy. What
the segment computes from its checkpoints alone, and its batch norm's gradient reads last, gets a
second copy for that reader, made when the backward reaches it (`_first_of_chains`). The copies are
the same ops on the same inputs, so the step is bit for bit the step without recompute; their
control inputs and `Mark.RECOMPUTED` keep Grappler's common-subexpression elimination from merging
them back.

Gradients built after the rewrite: every layer of a segment carries the segment's roots, every
later segment's roots and its members' triggers (`Mark.SEGMENT_ROOTS`, `SEGMENT_LATER`, `SEGMENT_MEMBERS`); the
gradient function graphsync registered for each layer (the op tf.gradients reaches last in its
backward) marks it reached, and the last of them recomputes the segment (`when_differentiated`):
tf.gradients works in reverse topological order, so by then every gradient op reading the segment
exists.
"""
from __future__ import annotations

import collections

import tensorflow as tf

from graphsync.graph import marks, tf_private
from graphsync.graph.marks import Mark
from graphsync.graph.op_types import SHAPE_TYPES
from graphsync.graph.backward import is_backward, judge_again
from graphsync.graph.walks import descendants
from graphsync.splice.copyable import is_activation, is_copyable, is_read
from graphsync.splice.recompute import Recomputed, copy_ops, incoming_gradients
from graphsync.splice.segment_cost import cut

_SHAPE_TYPES = frozenset(SHAPE_TYPES)


def place(graph: tf.Graph, towers: list) -> Recomputed:
    """`towers`: per tower, its layers' (trigger, roots, whether its gradients exist) in forward
    order. A segment whose layers have their gradients is recomputed now; else each of its layers'
    triggers carries it to `when_differentiated`."""
    done = Recomputed()
    for layers in towers:
        layers = [(trigger, roots, grads) for trigger, roots, grads in layers
                  if roots and (grads or trigger is not None)]
        if layers and all(grads for _, _, grads in layers):
            layers = _with_first_input(layers)
        regions = _regions([roots for _, roots, _ in layers])
        firsts = cut(regions)
        after = set()   # the backward ops reading the copies of the segment after this one
        for first, end in reversed(list(zip(firsts, firsts[1:] + [len(layers)]))):
            members = layers[first:end]
            if all(grads for _, _, grads in members):
                made, after = recompute_region(graph, set().union(*regions[first:end]), after)
                done += made
                continue
            after = set()
            roots = [op for _, r, _ in members for op in r]
            later = [op for _, r, _ in layers[end:] for op in r]
            triggers = [trigger for trigger, _, _ in members]
            for trigger in triggers:
                _names(trigger, Mark.SEGMENT_ROOTS, roots)
                _names(trigger, Mark.SEGMENT_LATER, later)
                _names(trigger, Mark.SEGMENT_MEMBERS, triggers)
    return done


def readers_of(statistic: tf.Tensor, depth: int = 12) -> list:
    """A synchronized reduction's roots: the forward ops where what it becomes (per channel: a
    mean, a variance, a scale, within `depth` ops) meets the activations (x − μ, x · r)."""
    roots, frontier, seen = [], [statistic], {statistic.op}
    for _ in range(depth):
        following = []
        for t in frontier:
            for op in t.consumers():
                if op in seen or is_backward(op) or op.device != statistic.op.device:
                    continue
                seen.add(op)
                if any(is_activation(u) for u in op.inputs):
                    roots.append(op)
                else:
                    following += [u for u in op.outputs if not is_activation(u)]
        frontier = following
    return roots


def when_differentiated(trigger: tf.Operation) -> Recomputed:
    """Called by `trigger`'s gradient function: once every layer of its segment has been reached
    (tf.gradients works in reverse topological order, so then every gradient op reading the
    segment exists), the segment is recomputed."""
    if not marks.has(trigger, Mark.SEGMENT_ROOTS):
        return Recomputed()
    graph = trigger.graph
    tf_private.set_attr(trigger, Mark.SEGMENT_REACHED.value, marks.value(True))

    def ops(mark):
        return [graph.get_operation_by_name(n.decode()) for n in marks.get(trigger, mark)]
    if not all(marks.has(op, Mark.SEGMENT_REACHED) for op in ops(Mark.SEGMENT_MEMBERS)):
        return Recomputed()
    judge_again(graph)   # the gradient ops built so far, judged with the whole graph
    return recompute_region(graph, _reached(ops(Mark.SEGMENT_ROOTS)) - _reached(ops(Mark.SEGMENT_LATER)),
                            building=True)[0]


def recompute_region(graph: tf.Graph, region: set, after: set = frozenset(), building: bool = False) -> tuple:
    """Makes the backward ops reading activations computed in `region` read copies; returns what
    it did and every backward op reading an activation the region computes or reads. The copies
    also wait for `after`, that set for the next segment (where that makes no cycle), so that a
    segment's copies are made once the next segment's backward is done with its own: the executor
    would otherwise run them as soon as the incoming gradients allow, while the next segment's
    weight gradients still hold its activations. `building`: tf.gradients is building the
    backward, whose ops nothing reads yet."""
    readers = {}
    for op in region:
        if is_copyable(op):
            for t in op.outputs:
                if is_activation(t):
                    backward = [c for c in t.consumers() if is_backward(c) and c.type not in _SHAPE_TYPES
                                and (building or is_read(c))]
                    if backward:
                        readers[t.ref()] = (t, backward)
    if not readers:
        return Recomputed(), set()
    all_readers = {r for _, rs in readers.values() for r in rs}
    downstream = descendants(all_readers, control=True)
    wait = incoming_gradients(all_readers, set(readers), downstream)
    if not wait:
        return Recomputed(), set()   # nothing to wait for: copies would run with the forward, saving nothing
    wait = _live(wait + sorted(set(after) - downstream - set(wait), key=lambda op: op.name))
    needed = _needed([t.op for t, _ in readers.values()], region)
    done, reads = Recomputed(), list(readers.values())
    for t, backward in _first_of_chains(reads, needed):
        late = _live(incoming_gradients(set(backward), {t.ref()}))
        if late:
            done += copy_ops(graph, [t.op], late, [(t, backward)], "_recompute_late")
            reads.remove((t, backward))
    return done + copy_ops(graph, needed, wait, reads), _backward_readers(region, building)


def _first_of_chains(reads: list, needed: list) -> list:
    """The (tensor, backward readers) whose tensor a copy makes from checkpoints alone and other
    copies read: the segment computes it first, its backward readers come last (a stem
    convolution's output, read by its batch norm's gradient at the segment's end). Those readers
    get a copy of their own, made when the backward reaches them, so that the first one dies as
    soon as the segment's chain has read it: one more op, one activation less held throughout."""
    chain = set(needed)
    return [(t, backward) for t, backward in reads
            if not any(u.op in chain for u in t.op.inputs) and any(c in chain for c in t.consumers())]


def _with_first_input(layers: list) -> list:
    """The tower's first layer's input, when computed from the tower's data by ops that can run
    again (a stem convolution), begins a segment of its own: its producer is then recomputed."""
    inputs = [t.op for op in layers[0][1] for t in op.inputs if is_activation(t) and is_copyable(t.op)]
    return [(None, inputs[:1], True)] + layers if inputs else layers


def _regions(roots: list) -> list:
    """Per layer, the forward its segment would recompute were it to begin one: reached from its
    roots and from no later layer's. One sweep from the last layer: whatever a later layer's roots
    reach is claimed, and a walk stops there (what it reaches past a claimed op is claimed too)."""
    claimed, regions = set(), []
    for layer_roots in reversed(roots):
        region = _reached(layer_roots, claimed)
        claimed |= region
        regions.append(region)
    return regions[::-1]


def _reached(roots: list, claimed: frozenset = frozenset()) -> set:
    """The forward ops reached from `roots` through activation-sized tensors, on their device, not
    passing through `claimed`."""
    roots = [op for op in roots if op not in claimed]
    seen, queue = set(roots), collections.deque(roots)
    while queue:
        op = queue.popleft()
        for t in op.outputs:
            if not is_activation(t):
                continue
            for c in t.consumers():
                if c not in seen and c not in claimed and c.device == op.device and not is_backward(c) \
                        and not marks.is_recomputed(c):
                    seen.add(c)
                    queue.append(c)
    return seen


def _backward_readers(region: set, building: bool) -> set:
    """The backward ops reading an activation `region` computes or reads from outside."""
    tensors = {t.ref(): t for op in region for t in list(op.inputs) + list(op.outputs) if is_activation(t)}
    return {c for t in tensors.values() for c in t.consumers()
            if is_backward(c) and c.type not in _SHAPE_TYPES and (building or is_read(c))}


def _live(ops: list) -> list:
    """`ops`, each that a v1 Switch may leave dead (behind a tensor training flag: the backward of
    the branch not taken) replaced by its nearest ancestors that always run. A dead control input
    kills an op, and a dead copy would hand its readers nothing (module docstring)."""
    may_die, live = {}, []
    for op in ops:
        stack, seen = [op], set()
        while stack:
            o = stack.pop()
            if o in seen:
                continue
            seen.add(o)
            if not _may_die(o, may_die):
                live.append(o)
            else:
                stack += [t.op for t in o.inputs if o.type != "Switch" or t is o.inputs[0]]
    return sorted(set(live), key=lambda op: op.name)


def _may_die(op: tf.Operation, memo: dict) -> bool:
    """Whether `op` can be dead in a step: downstream of a Switch with no Merge between."""
    stack = [op]
    while stack:
        o = stack[-1]
        if o in memo:
            stack.pop()
            continue
        if o.type in ("Merge", "RefMerge"):
            memo[o] = False
        elif o.type in ("Switch", "RefSwitch"):
            memo[o] = True
        else:
            pending = [i for i in [t.op for t in o.inputs] + list(o.control_inputs) if i not in memo]
            if pending:
                stack += pending
                continue
            memo[o] = any(memo[t.op] for t in o.inputs) or any(memo[c] for c in o.control_inputs)
        stack.pop()
    return memo[op]


def _needed(ops: list, region: set) -> list:
    """`ops` and the region's copyable ancestors they are computed from, in an order where every
    op follows its inputs' ops."""
    order, state = [], {}
    for start in ops:
        stack = [(start, False)]
        while stack:
            op, expanded = stack.pop()
            if expanded:
                state[op] = 2
                order.append(op)
                continue
            if state.get(op):
                continue
            state[op] = 1
            stack.append((op, True))
            stack += [(t.op, False) for t in op.inputs
                      if t.op in region and not state.get(t.op) and is_activation(t) and is_copyable(t.op)]
    return order


def _names(op: tf.Operation, mark: Mark, ops: list) -> None:
    tf_private.set_attr(op, mark.value, marks.value(o.name.encode() for o in ops))
