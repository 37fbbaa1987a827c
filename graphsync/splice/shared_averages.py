"""Moving averages on a parameter server, which every worker's step would update: left to worker 0.

In a between-graph job whose batch norms' moving means and variances live on a ps task
(tf.train.replica_device_setter: tf_cnn_benchmarks' parameter_server mode), the variables are
shared by the workers and every worker's UPDATE_OPS assign them every step. Unsynchronized, each
worker moves them by its own shard's statistics; synchronized, every worker computes the same
global statistics, so W workers move the average W times per step by the same amount (as W steps
of one device would), and their read-modify-writes race on the ps. One device updates it once.

So worker 0 of the process group keeps its writes and the other workers' are taken out of their
steps. Not zeroed: an AssignSub of 0 that read the old value while worker 0's update ran would
write it back and lose that update. Taken out by rerouting, found by structure (the writes the
layer's statistics feed, graphsync/plan/moving_updates.py, whose variable lives on one of the
step's shared tasks, graphsync/plan/shared_tasks.py): whatever waited for a write (the train op's
control_dependencies(UPDATE_OPS), tf.group, tf.gradients' group_deps) waits for a NoOp with the
write's own control inputs instead, and whatever read a ref write's output (the updated variable:
`AssignMovingAvg` feeding an Identity or tf.group) reads the variable, so nothing runs the write.
A step that fetches the write itself (sess.run(update_ops) of ops collected before the rewrite)
still runs it.

Moving averages on the worker's own task (distributed_replicated's local copies,
collective_all_reduce) are each worker's own: left alone.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import reroute, tf_private
from graphsync.plan import moving_updates, shared_tasks


def shared_writes(plan) -> list:
    """[(layer name, task, write op, the layer's device here)] for each write of a planned layer's
    moving average whose variable lives on one of the step's shared tasks (plan.ps_tasks). Found
    before the splice: it moves the statistics' readers."""
    if not plan.across_processes or not plan.ps_tasks:
        return []
    found = []
    for layer in plan.layers:
        for variable, writes in moving_updates.writes_of(layer).items():
            task = shared_tasks.task_of(variable.device)
            if task in plan.ps_tasks:
                found += [(layer.name, task, write, layer.sites[0].device) for _, write in writes]
    return found


def leave_to_first_worker(graph: tf.Graph, found: list, process_group) -> str:
    """Takes the writes `found` (shared_writes) out of this worker's step unless it is worker 0;
    returns the report's line, '' when no moving average is shared."""
    if not found:
        return ""
    if process_group.index != 0:
        for _, _, write, device in found:
            _take_out(graph, write, device)
    layers, tasks = len({f[0] for f in found}), sorted({f[1] for f in found})
    return (f"moving statistics of {layers} layer{'s' * (layers != 1)} on {', '.join(tasks)} updated by worker 0 "
            f"only (they are shared by the {process_group.tasks} workers)")


def _take_out(graph: tf.Graph, write: tf.Operation, device: str) -> None:
    """Nothing runs `write` any more: its control successors wait for a NoOp (with the write's
    control inputs), its data readers read the variable it would have assigned."""
    with tf_private.pristine_scope(graph, device, f"{write.name}_by_worker_0"):
        stand_in = tf.no_op(name="not_here")
    if write.control_inputs:
        tf_private.add_control_inputs(stand_in, list(write.control_inputs))
    reroute.reroute_control_outputs(write, [stand_in])
    for output in write.outputs:   # a ref write's output is the variable's ref, as its input 0
        if output.consumers():
            reroute.reroute_consumers(output, write.inputs[0])
