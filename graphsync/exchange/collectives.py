"""Collective all-reduces and their keys: group and instance keys handed out in the same order in
every process that builds the same graph, the gradient of an all-reduce (another all-reduce whose
key every tower's k-th tf.gradients call agrees on), and the transport built on them
(`Collectives`, graphsync/exchange/transports.py).
"""
from __future__ import annotations

import collections
import itertools
import weakref

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.exchange import marking, transports
from graphsync.exchange.merges import Merge
from graphsync.exchange.transports import Reduced
from graphsync.graph.fast_ops import FastOps
from graphsync.graph.tf_private import create_op, pristine_scope
from graphsync.graph.op_types import COLLECTIVE_TYPES

ALLREDUCE_GRADIENT = "GraphsyncAllReduce"

_times_differentiated = weakref.WeakKeyDictionary()   # graph → Counter(op name → calls so far)


def differentiation(op) -> int:
    """How many earlier tf.gradients calls went through `op`: the k-th call of every tower pairs
    with the k-th call of the others."""
    seen = _times_differentiated.setdefault(op.graph, collections.Counter())
    k = seen[op.name]
    seen[op.name] += 1
    return k


class CollectiveKeys:
    """Group and instance keys no collective in the graph uses yet, handed out in a deterministic
    order, so identical graphs in several processes agree on them."""

    def __init__(self, graph: tf.Graph):
        used = [0]
        for op in graph.get_operations():
            if op.type in COLLECTIVE_TYPES:
                for name in ("group_key", "instance_key"):
                    value = _key_of(op, name)
                    used.append(value if value is not None else 0)
        self._next = itertools.count(max(max(used) + 1, 1 << 20))

    def new(self) -> int:
        return next(self._next)


def _key_of(op, name):
    """A collective's group or instance key: an attr (v1 ops) or a constant input (V2 ops)."""
    if name in op.node_def.attr:
        return int(op.get_attr(name))
    inputs = [arg.name for arg in op.op_def.input_arg]
    value = tf.get_static_value(op.inputs[inputs.index(name)]) if name in inputs else None
    return int(value) if value is not None else None


allreduce_keys = weakref.WeakKeyDictionary()   # graph → CollectiveKeys (for gradients built later)
_backward_keys = weakref.WeakKeyDictionary()    # graph → {(forward instance key, k): instance key}


def backward_key(graph, forward_key: int, k) -> int:
    """The instance key of the k-th differentiation of a forward collective, the same in every
    tower (and in every process that builds the same gradients in the same order)."""
    keys = _backward_keys.setdefault(graph, {})
    if (forward_key, k) not in keys:
        allocator = allreduce_keys.get(graph) or allreduce_keys.setdefault(graph, CollectiveKeys(graph))
        keys[(forward_key, k)] = allocator.new()
    return keys[(forward_key, k)]


def all_reduce(x: tf.Tensor, group_size: int, group_key: int, instance_key: int, name=None, ops=None,
               timeout: float = 0.0, merge: Merge = Merge.ADD) -> tf.Tensor:
    """Sum of x over the group (or with `merge` MAX or MIN the extremum, which nothing
    differentiates), with a gradient that all-reduces the incoming gradient; fails with
    DeadlineExceeded after `timeout` seconds without all peers (0: waits forever). `ops` (a
    FastOps) shares the key constants across layers."""
    constant = ops.constant if ops is not None else (lambda value, dtype: tf.constant(value, dtype))
    keys = [constant(value, tf.int32) for value in (group_size, group_key, instance_key)]
    attrs = {"T": attr_value_pb2.AttrValue(type=x.dtype.as_datatype_enum),
             "merge_op": attr_value_pb2.AttrValue(s=merge.value.encode()), "final_op": attr_value_pb2.AttrValue(s=b"Id"),
             "Nordering_token": attr_value_pb2.AttrValue(i=0),
             "timeout_seconds": attr_value_pb2.AttrValue(f=float(timeout))}
    if merge is Merge.ADD:   # an extremum's all-reduce has no gradient: graphsync/splice/reduction.py builds its own
        attrs["_gradient_op_type"] = attr_value_pb2.AttrValue(s=ALLREDUCE_GRADIENT.encode())
    return create_op(x.graph, "CollectiveReduceV2", [x] + keys, attrs, name or "CollectiveReduceV2").outputs[0]


@tf.RegisterGradient(ALLREDUCE_GRADIENT)
def _all_reduce_gradient(op, grad):
    """The gradient of a sum over towers is the sum of the towers' gradients: another all-reduce.

    Each tower's k-th differentiation of the same collective gets the same new instance key, so
    the towers' gradient collectives pair up even when each tower calls tf.gradients itself.
    """
    forward_key = int(tf.get_static_value(op.inputs[3]))
    group_size, group_key = (int(tf.get_static_value(t)) for t in op.inputs[1:3])
    key = backward_key(op.graph, forward_key, differentiation(op))
    return [all_reduce(grad, group_size, group_key, key, timeout=op.get_attr("timeout_seconds"))] \
        + [None] * (len(op.inputs) - 1)


def cross_process_group_key(fingerprint: int, group: int) -> int:
    """The group key of sync group `group` between worker processes: derived from the fingerprint
    of the synchronized layers, so workers that built different layers (different scripts) wait
    for each other in vain (and time out) instead of averaging unrelated statistics. Keys lie in
    [2^29, 2^30): clear of CollectiveKeys' counter and of int32 overflow."""
    return (1 << 29) + (fingerprint + group) % (1 << 28)


class Collectives:
    """The transport of strategy "allreduce": one CollectiveReduceV2 per layer and direction on the
    towers' own devices, across worker processes too (`process_group`)."""

    name = "allreduce"

    def __init__(self, graph: tf.Graph, groups, process_group=None, fingerprint: int = 0):
        self.groups = groups
        self.keys = allreduce_keys.setdefault(graph, CollectiveKeys(graph))
        self.ops = FastOps(graph)
        self.group_keys = [self.keys.new() for _ in groups]
        if process_group is not None:   # workers whose layers differ never join the same groups
            self.group_keys = [cross_process_group_key(fingerprint, g) for g in range(len(groups))]
        self.scale = process_group.tasks if process_group else 1
        self.timeout = process_group.timeout if process_group else 0.0

    def reduce(self, graph, layer, sites, packed, tag, merge=Merge.ADD) -> list[Reduced]:
        """All-reduces each tower's packed vector. Each tower's first reader waits for one NoOp (on
        the group's first device) after every collective of the group, so fetching one tower's
        result never leaves another tower's collective unrun. A barrier costs 2·(towers − 1)
        cross-device control edges per layer and direction where every tower waiting on every peer
        cost towers·(towers − 1) (+8 % step time at 4 towers, measured)."""
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            instance = self.keys.new()
            reduced = {}
            for i in members:
                with pristine_scope(graph, sites[i].device, f"{sites[i].op.name}_sync/{tag}"), \
                        marking.exchange(graph, layer.name, tag):
                    reduced[i] = all_reduce(packed[i], len(members) * self.scale, self.group_keys[g], instance,
                                            ops=self.ops, timeout=self.timeout, merge=merge)
            first = sites[members[0]]
            with pristine_scope(graph, first.device, f"{first.op.name}_sync/{tag}"), \
                    marking.exchange(graph, layer.name, tag), graph.control_dependencies([reduced[i].op for i in members]):
                barrier = tf.no_op(name="all_reduced")
            keys = dict(transport="collective", members=len(members) * self.scale, group_key=self.group_keys[g],
                        instance_key=instance, timeout_ms=round(self.timeout * 1000))
            for i in members:
                out[i] = Reduced(reduced[i], [barrier], g, keys)
        return out


@transports.registers_gradient_sum("collective")
def _collective_gradient_sum(op, contribution, k):
    """Another all-reduce, keyed by the forward's instance key and k: every tower's k-th gradient
    call joins the same one."""
    members, group_key, forward_key, timeout_ms = (marks.get(op, mark) for mark in (
        Mark.MEMBERS, Mark.GROUP_KEY, Mark.INSTANCE_KEY, Mark.TIMEOUT_MS))
    with pristine_scope(op.graph, op.device, marking.gradient_scope(op)), marking.gradient_sum(op):
        return all_reduce(contribution, members, group_key, backward_key(op.graph, forward_key, k),
                          timeout=timeout_ms / 1000)
