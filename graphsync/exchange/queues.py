"""A cross-process sum through FIFOQueues on a parameter server, in worker order.

Worker w of W puts its contribution into queue `NAME/w>r` for every other worker r and takes one
element out of `NAME/v>w` for every other worker v; every queue lives on one ps task under a
`shared_name`, so the W graphs (each built by its own process) meet in the same W·(W − 1)
queues. Each worker then adds the W contributions in worker order, c0 + c1 + … (its own where it
belongs), so every worker computes the same total, bit for bit, whatever order they arrive in.
One queue per ordered pair and one element per pair per call: the k-th element a reader takes
from a pair is always the writer's k-th, so two steps never mix, even when a worker runs a step
ahead (capacity is unbounded: a writer never waits for a reader).

No op here is a collective: a step keeps the random step id TensorFlow gives a step without
collectives, which the ps needs to tell the workers' steps apart (graphsync/plan/shared_tasks.py).
The dequeues wait for this worker's own enqueues (control edges): a reader sends before it waits,
and when the contribution is dead (a tensor training flag at inference, graphsync/splice/stand_in.py)
the dequeues are dead too and nothing crosses. Enqueues and dequeues carry EXCHANGE_ATTR, which
graphsync/between_graph/steps.py reads to know a synchronized step (one a lost worker stops).
"""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph.op_types import EXCHANGE_ATTR
from graphsync.graph.tf_private import pristine_scope, set_attr


def queue_name(base: str, writer: int, reader: int) -> str:
    return f"{base}/{writer}>{reader}"


def summed(graph, contribution: tf.Tensor, base: str, ps_device: str, worker: int, workers: int,
           device: str, scope: str, merge: str = "Add") -> tf.Tensor:
    """Σ over the `workers` processes of their `contribution` (this one is `worker`), on `device`
    under `scope`; the queues named after `base` on `ps_device` (identical in every worker).
    `merge` "Max" or "Min": their elementwise extremum instead."""
    dtype = contribution.dtype
    with pristine_scope(graph, ps_device, f"{scope}/queues"):
        sent = [_marked(tf.raw_ops.QueueEnqueueV2(handle=_queue(base, worker, r, dtype), components=[contribution]))
                for r in range(workers) if r != worker]
        with graph.control_dependencies(sent):
            taken = {w: _marked(tf.raw_ops.QueueDequeueV2(handle=_queue(base, w, worker, dtype),
                                                          component_types=[dtype])[0].op).outputs[0]
                     for w in range(workers) if w != worker}
    with pristine_scope(graph, device, f"{scope}/in_worker_order"):
        total = None
        for w in range(workers):
            value = contribution if w == worker else taken[w]
            value.set_shape(contribution.shape)
            total = value if total is None else _MERGES[merge](x=total, y=value)
        return total


_MERGES = {"Add": tf.raw_ops.AddV2, "Max": tf.raw_ops.Maximum, "Min": tf.raw_ops.Minimum}


def _queue(base, writer, reader, dtype):
    return tf.raw_ops.FIFOQueueV2(component_types=[dtype], shapes=[], capacity=-1,
                                  shared_name=queue_name(base, writer, reader), name="queue")


def _marked(op):
    set_attr(op, EXCHANGE_ATTR, attr_value_pb2.AttrValue(b=True))
    return op
