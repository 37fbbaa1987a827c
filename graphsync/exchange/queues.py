"""A cross-process sum through FIFOQueues on a parameter server, in worker order: one contribution
up and one total down per worker, whatever the number of workers.

Worker w > 0 of W puts its contribution into queue `NAME/up/w` and takes the total from
`NAME/down/w`. Worker 0's step holds the sum itself, on the ps: it takes one element from each
`NAME/up/w`, adds the W contributions in worker order, c0 + c1 + … (its own read straight from
its device), and puts the total into every `NAME/down/w`; worker 0 reads it straight from the ps.
Every queue lives on one ps task under a `shared_name`, so the W graphs (each built by its own
process) meet in the same 2·(W − 1) queues. Per worker and call: one tensor up, one down (a
constant number whatever W); on the ps: 4·(W − 1) queue operations, linear in W (the all-to-all
exchange this replaces enqueued every contribution for every other worker: W·(W − 1) of each).
Every worker receives the same total, bit for bit, whatever order the workers arrive in. One
element per queue per call: the k-th element worker 0 takes from `up/w` is always worker w's k-th,
and worker w's k-th from `down/w` worker 0's k-th, so two steps never mix, even when a worker
runs a step ahead (capacity is unbounded: a writer never waits for a reader). TensorFlow's
accumulators (SyncReplicasOptimizer's) would do with fewer ops, but they average in arrival order:
the total would differ in its last bits from run to run.

No op here is a collective: a step keeps the random step id TensorFlow gives a step without
collectives, which the ps needs to tell the workers' steps apart (graphsync/plan/shared_tasks.py).
Worker w's dequeue waits for its own enqueue, worker 0's dequeues for its own contribution copied
to the ps (control edges on the ps: deadness crosses devices with data, not with a control edge):
when the contribution is dead (a tensor training flag at inference, graphsync/splice/stand_in.py)
everything after it is dead too and nothing crosses. Enqueues and
dequeues carry the mark Mark.EXCHANGE (graphsync/graph/marks.py), which graphsync/between_graph/steps.py reads to know a synchronized
step (one a lost worker stops).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.exchange.merges import Merge
from graphsync.graph.tf_private import pristine_scope, set_attr


def queue_name(base: str, direction: str, worker: int) -> str:
    return f"{base}/{direction}/{worker}"


def summed(graph, contribution: tf.Tensor, base: str, ps_device: str, worker: int, workers: int,
           device: str, scope: str, merge: Merge = Merge.ADD) -> tf.Tensor:
    """Σ over the `workers` processes of their `contribution` (this one is `worker`), as a tensor
    this worker reads on `device`; the queues named after `base` on `ps_device` (identical in
    every worker), the ops under `scope`. `merge` MAX or MIN: their elementwise extremum."""
    dtype = contribution.dtype
    if worker:
        with pristine_scope(graph, ps_device, f"{scope}/queues"):
            sent = _marked(tf.raw_ops.QueueEnqueueV2(handle=_queue(base, "up", worker, dtype),
                                                     components=[contribution]))
            with graph.control_dependencies([sent]):
                total = _marked(tf.raw_ops.QueueDequeueV2(handle=_queue(base, "down", worker, dtype),
                                                          component_types=[dtype])[0].op).outputs[0]
        total.set_shape(contribution.shape)
        return total
    with pristine_scope(graph, ps_device, f"{scope}/in_worker_order"):
        own = tf.identity(contribution, name="own")   # on the ps: dead with the contribution, as data
    with pristine_scope(graph, ps_device, f"{scope}/queues"), graph.control_dependencies([own.op]):
        taken = [_marked(tf.raw_ops.QueueDequeueV2(handle=_queue(base, "up", w, dtype),
                                                   component_types=[dtype])[0].op).outputs[0]
                 for w in range(1, workers)]
    with pristine_scope(graph, ps_device, f"{scope}/in_worker_order"):
        total = own
        for value in taken:
            value.set_shape(contribution.shape)
            total = _MERGES[merge](x=total, y=value)
    with pristine_scope(graph, ps_device, f"{scope}/queues"):
        handed = [_marked(tf.raw_ops.QueueEnqueueV2(handle=_queue(base, "down", r, dtype), components=[total]))
                  for r in range(1, workers)]
    with pristine_scope(graph, ps_device, f"{scope}/in_worker_order"), graph.control_dependencies(handed):
        return tf.identity(total, name="total")   # read once every worker has been handed it


_MERGES = {Merge.ADD: tf.raw_ops.AddV2, Merge.MAX: tf.raw_ops.Maximum, Merge.MIN: tf.raw_ops.Minimum}


def _queue(base, direction, worker, dtype):
    return tf.raw_ops.FIFOQueueV2(component_types=[dtype], shapes=[], capacity=-1,
                                  shared_name=queue_name(base, direction, worker), name="queue")


def _marked(op):
    set_attr(op, Mark.EXCHANGE.value, marks.value(True))
    return op
