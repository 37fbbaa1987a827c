"""Reads of TF1 ref variables ordered before the step's updates, as one device sees them.

A `VariableV2` is read through ops that alias its buffer: a reader sees what the buffer holds when
the reader executes. Batch renormalization reads `renorm_mean` and `renorm_stddev` in the forward to
form its corrections r and d, and its update ops write them in the same step; nothing orders the
two. In the original graph the reads are ready first and tend to win. After the rewrite they wait
for the global statistics, and so do the updates: whichever the scheduler picks first decides the
step (measured 3e-3 to 9e-3 off in the gradients in five runs of eight).

The cure is what a resource variable does: a copy. Each read that races an update
(graph/ref_races.py, without its common-fetch condition, since the updates of a graph rewritten
before its gradients are not yet under a train op), whose update waits for an op the rewrite added
(a synchronized step's update; an initializer, a checkpoint's restore or a copy from a ps waits
for none), reads a `Snapshot` of the variable instead, taken from the last alias of the
variable outside any control flow, and the update waits for that snapshot (a control edge). The
snapshot depends on nothing but the variable, so it runs first in the step and holds the value
from before the step's updates, as on one device: the step is the same bit for bit from run to run.

A race that cannot be ordered so is returned, for the caller to say in one line: an update inside
a while loop (a control edge cannot enter its frame), a snapshot that would wait for the update, or
a read whose chain passes the reference itself into control flow (a v1 cond over the variable).
"""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph import ref_races, tf_private
from graphsync.graph.tf_private import control_flow_context, create_op, pristine_scope
from graphsync.splice.fused_kernels import FORWARD_READ_GRADIENT   # a copy's gradient: passed on unchanged



def order_before_updates(graph: tf.Graph, version: int) -> list[ref_races.Race]:
    """Makes every read of a ref variable that races an update waiting for ops the rewrite added
    since `graph.version` was `version` (a synchronized step's update), read a snapshot taken
    before the update; returns the races it cannot order."""
    races = ref_races.find_races(graph, fetched_together=False)
    if not races:
        return []
    downstream = _downstream(tf_private.ops_added_since(graph, version))
    orders, left = [], []   # (cut, update) for each race to order: every cut found before any edit
    for race in races:
        reader, update = graph.get_operation_by_name(race.reader), graph.get_operation_by_name(race.update)
        if update not in downstream:
            continue   # not computed from the synchronized statistics: an initializer, a restore, a copy
        chain = ref_races.chain(reader, graph.get_operation_by_name(race.variable))
        if chain is not None and any(op.control_inputs for op, _ in chain[1:-1]):
            continue   # a read ordered after something else (a copy after an initializer): not a step's
        if reader.type == "Snapshot":   # a copy already (graphsync's own of γ): the update waits for it
            if not tf_private.in_while_loop(update) and not _waits_for(reader, update):
                orders.append((None, reader, update))
            continue
        cut = _cut(chain)
        if cut is None or tf_private.in_while_loop(update) or _waits_for(cut[0].op, update):
            left.append(race)
        else:
            orders.append((cut, None, update))
    snapshots = {}   # cut tensor → its snapshot
    for cut, copy, update in orders:
        if copy is not None:
            if copy not in update.control_inputs:
                tf_private.add_control_inputs(update, [copy])
            continue
        tensor, consumer, index = cut
        if tensor.ref() not in snapshots:
            snapshots[tensor.ref()] = _snapshot(graph, tensor)
        snapshot = snapshots[tensor.ref()]
        if consumer.inputs[index] is tensor:
            tf_private.update_input(consumer, index, snapshot)
        if snapshot.op not in update.control_inputs:
            tf_private.add_control_inputs(update, [snapshot.op])
    return left


def _cut(chain: list | None):
    """(tensor, consumer, input index): where the alias chain (ref_races.chain) leaves the last op
    outside any control flow, the edge a snapshot replaces; None if that edge must carry the
    reference itself (a v1 cond switching the variable: a copy cannot stand in for a reference)."""
    if chain is None:
        return None
    cut = None
    for (op, output), (next_op, _) in zip(chain, chain[1:]):
        if control_flow_context(op) is not None:
            break
        tensor = op.outputs[output]
        cut = (tensor, next_op, next(i for i, t in enumerate(next_op.inputs) if t is tensor))
    if cut is not None and tf_private.is_ref(cut[0]) and (
            cut[1].type in ref_races.ALIASING_TYPES or ref_races.input_arg(cut[1], cut[0]).is_ref):
        return None
    return cut


def _snapshot(graph: tf.Graph, tensor: tf.Tensor) -> tf.Tensor:
    """A copy of the variable's value, on the variable's device, beside it in the graph."""
    attrs = {"T": attr_value_pb2.AttrValue(type=tensor.dtype.base_dtype.as_datatype_enum),
             "_gradient_op_type": attr_value_pb2.AttrValue(s=FORWARD_READ_GRADIENT.encode())}
    with pristine_scope(graph, tensor.op.device, tensor.op.name.rsplit("/", 1)[0] + "/graphsync_snapshot"):
        return create_op(graph, "Snapshot", [tensor], attrs, "snapshot").outputs[0]


def _downstream(ops: list) -> set:
    """`ops` and every op computed from one of them (data edges: an op merely ordered after them,
    a ps copy after the step's barrier, computes nothing from the statistics)."""
    seen, frontier = set(ops), list(ops)
    while frontier:
        op = frontier.pop()
        for follower in [c for t in op.outputs for c in t.consumers()]:
            if follower not in seen:
                seen.add(follower)
                frontier.append(follower)
    return seen


def _waits_for(op: tf.Operation, source: tf.Operation) -> bool:
    """Whether `op` waits for `source` (a snapshot of `op`'s output would then wait for the update)."""
    seen, frontier = set(), [op]
    while frontier:
        current = frontier.pop()
        if current is source:
            return True
        if current not in seen:
            seen.add(current)
            frontier += [t.op for t in current.inputs] + list(current.control_inputs)
    return False
