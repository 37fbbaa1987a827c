"""The transport of parameter-server jobs (graphsync/exchange/transports.py): statistics summed
across worker processes through queues on a ps task, not through collectives.

Why not collectives: a step with a collective gets its step id from the group leader, the same in
every worker, and a ps that runs part of several workers' steps (variables, the global step, sync
queues) keys its rendezvous by step id alone: one worker's step end aborts another's
(`AbortedError … Cleanup`; graphsync/plan/shared_tasks.py). Here the only cross-process traffic is
ops placed on a ps the step already uses (graphsync/exchange/queues.py: one FIFOQueue per layer,
direction and worker, summed in worker order on the ps), so each worker's step keeps its own
random step id and the ps tells them apart as it does without graphsync.

Everything else is the packed strategy's (graphsync/exchange/allreduce.py): the same packed vectors (float64 [n, n·m, M2 + n·m²] forward, the
stacked [a, b] backward), packed and unpacked by the same functions, so the statistics are the same
numbers; the towers of a worker in one sync group first add theirs on the group's first device, in
tower order. The reductions the rule finds take the same way (a `Max` or `Min` merged by its
extremum instead of a sum, its view's gradient summed through queues as a batch norm's is).
Layers go to the ps tasks by size, each to the least loaded so far in forward order (the same in
every worker), and each queue's name holds the digest of the synchronized layers: workers that built different layers
never share a queue. A view's gradient built after the rewrite (graphsync/exchange/views.py) sums
the same way through queues of its own.

A worker blocked on a dequeue because another is gone is stopped like one blocked on a collective:
the dequeues mark the step synchronized (graphsync/between_graph/steps.py), the heartbeat names the
lost worker and closing the step's session cancels the dequeue. A dequeue has no timeout of its own
(TensorFlow supports none): without a heartbeat, a lost worker leaves the others waiting. Elements
left in the queues by a crash stay on the ps while it runs: restart every task, ps included, and
the queues start empty (a ps kept running would hand the restarted workers stale statistics).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import weakref

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.between_graph.process_group import ProcessGroup
from graphsync.errors import GraphsyncError
from graphsync.exchange import marking, queues, transports
from graphsync.exchange.merges import Merge
from graphsync.exchange.transports import Reduced
from graphsync.exchange.views import gathered_sum
from graphsync.graph.fast_ops import FastOps
from graphsync.graph.tf_private import pristine_scope


_LOCAL_EXTREMA = {Merge.MAX: lambda values: tf.reduce_max(tf.stack(values), 0, name="extremum"),
                  Merge.MIN: lambda values: tf.reduce_min(tf.stack(values), 0, name="extremum")}


class PsQueues:
    """Statistics summed across worker processes by queues on the ps tasks `ps_tasks`
    ("/job:ps/replica:0/task:0", …)."""

    name = "ps"

    def __init__(self, graph: tf.Graph, groups, process_group: ProcessGroup, ps_tasks, fingerprint: int = 0):
        self.groups, self.process_group = groups, process_group
        self.ops = FastOps(graph)
        self.ps_devices = [f"{task}/device:CPU:0" for task in ps_tasks]
        self.prefix = f"graphsync/{fingerprint:016x}"
        self._placed = {}   # layer name → its ps device
        self._sizes = {}    # layer name → elements of its statistics
        self._bases = {}    # queue base name → its ps device

    def ps_of(self, layer) -> str:
        """The ps device of `layer`'s queues: the least loaded so far, by the statistics' size (as
        replica_device_setter's greedy strategy spreads variables by bytes), in the order layers are
        first seen (forward order, the same in every worker); ties go to the first ps."""
        if layer.name not in self._placed:
            load = {device: 0 for device in self.ps_devices}
            for name, device in self._placed.items():
                load[device] += self._sizes[name]
            self._sizes[layer.name] = _statistics_size(layer)
            self._placed[layer.name] = min(self.ps_devices, key=lambda device: load[device])
        return self._placed[layer.name]

    def reduce(self, graph, layer, sites, packed, name, merge=Merge.ADD) -> list[Reduced]:
        """Per tower: its group's total (no barrier), and the keys of its group's queues."""
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            base = f"{self.prefix}/{layer.name}/{name}" + (f"/group{g}" if len(self.groups) > 1 else "")
            if base in self._bases:
                raise GraphsyncError(f"internal: two exchanges named {base}")
            self._bases[base] = self.ps_of(layer)
            first = sites[members[0]]
            scope = f"{first.op.name}_sync/{name}"
            local = packed[members[0]]
            with marking.exchange(graph, layer.name, name):
                if len(members) > 1:
                    with pristine_scope(graph, first.device, scope):
                        local = self.ops.sum_in_order([packed[i] for i in members]) if merge is Merge.ADD else \
                            _LOCAL_EXTREMA[merge]([packed[i] for i in members])
                total = queues.summed(graph, local, base, self._bases[base], self.process_group.index,
                                      self.process_group.tasks, first.device, scope, merge)
            keys = dict(transport="queues", members=len(members), queue=base, ps=self._bases[base],
                        worker=self.process_group.index, workers=self.process_group.tasks)
            for i in members:
                out[i] = Reduced(total, [], g, keys)
        return out


def _statistics_size(layer) -> int:
    """Elements per statistic of `layer` (its channels): what its exchange carries scales with it."""
    site = layer.sites[0]
    x = site.parts.x if getattr(site.parts, "x", None) is not None else site.op.inputs[0]
    dims = x.shape.as_list() if x.shape.rank is not None else []
    return int(np.prod([d or 1 for a, d in enumerate(dims) if a not in layer.layout.axes]))


_gradient_totals = weakref.WeakKeyDictionary()   # graph → {(queue base, k): the workers' total}


@transports.registers_gradient_sum("queues")
def _queued_gradient_sum(op, contribution, k):
    """The towers of this worker summed by one AddN each tower's gradient call fills in (on the
    device of the first tower whose call builds it), then every worker's sum through queues on the
    forward's ps (graphsync/exchange/queues.py), named after the forward's and `k`."""
    base, ps = marks.text(op, Mark.QUEUE), marks.text(op, Mark.PS)
    members, worker, workers = (marks.get(op, mark) for mark in (Mark.MEMBERS, Mark.WORKER, Mark.WORKERS))
    key = "_".join(map(str, k)) if isinstance(k, tuple) else str(k)   # e.g. ("y", 0): the fused backward
    scope = f"{marking.gradient_scope(op)}_{key}"
    totals = _gradient_totals.setdefault(op.graph, {})
    with marking.gradient_sum(op):
        local = contribution if members == 1 else gathered_sum(op, contribution, k, base, op.device, scope, members)
        if (base, k) not in totals:
            totals[(base, k)] = queues.summed(op.graph, local, f"{base}/gradient_{key}", ps, worker, workers,
                                              op.device, scope)
    return totals[(base, k)]
