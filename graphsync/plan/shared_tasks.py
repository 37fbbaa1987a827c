"""Between-graph steps that reach into a task other workers' steps use too: which are parameter
servers (the exchange then goes through them), and the one case refused before the first step.

A step with cross-process collectives takes its step id from the group's shared sequence (its
leader hands every worker the same one, so their collectives find each other), where a step
without collectives draws a random one. A task that runs part of several workers' steps — a
parameter server holding variables, the global step or sync queues (tf.train.replica_device_setter,
tf_cnn_benchmarks' parameter_server and distributed_replicated modes) — keys its rendezvous by step
id alone: with collectives, the first worker to finish cleans the id up and aborts the others' part
of their step on that task (`AbortedError: From /job:ps/replica:0/task:0: Cleanup <step id>`). So
such a step is synchronized through queues on those tasks instead, with no collective at all
(graphsync/exchange/through_ps.py): `shared_tasks` names them for the planner.

Refused: a step that runs ops on another *training* task (chief, master, worker). That task runs
synchronized steps of its own, which wait for this worker's; the exchange places its queues on ps
tasks only, and no TF1 setup we know of places a worker's ops on another worker, so this is left
untried and refused whole, naming the task and one op placed there.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import walks
from graphsync.errors import GraphsyncError


TRAINING_JOBS = ("chief", "master", "worker")   # graphsync/between_graph/cluster.py: they run steps of their own


def shared_tasks(ops: list) -> tuple:
    """The tasks other than theirs on which a training step through `ops` (the synchronized batch
    norms) runs an op — every op those ops read, or that reads them, through data or control
    edges, and the resources these use — as sorted "/job:ps/replica:0/task:0" names. Raises
    GraphsyncError when one of them is a training task."""
    own = {_task(op.device) for op in ops}
    foreign = {}
    for op in _with_resources(walks.connected(ops)):
        task = _task(op.device)
        if task[0] is not None and task not in own:
            foreign.setdefault(task, op)
    training = sorted((task for task in foreign if task[0] in TRAINING_JOBS), key=str)
    if training:
        op = foreign[training[0]]
        raise GraphsyncError(
            f"a between-graph step cannot run on another worker: the step of {_name(sorted(own, key=str)[0])} runs "
            f"{op.name} ({op.type}) on {_name(training[0])}, a training task with steps of its own; graphsync "
            "synchronizes steps that use parameter servers, not other workers: place the step's ops on its own "
            "worker and on ps tasks")
    return tuple(_name(task) for task in sorted(foreign, key=str))


def task_of(device: str) -> str | None:
    """The "/job:ps/replica:0/task:0" name `shared_tasks` gives the task of `device`; None where
    the device names no job (this process's own)."""
    task = _task(device)
    return None if task[0] is None else _name(task)


def _with_resources(ops: list) -> list:
    """`ops` and the ops making the resources they use: an op on a resource runs where the
    resource lives (a resource variable's AssignAdd by a worker runs on the ps)."""
    return ops + [t.op for op in ops for t in op.inputs if t.dtype == tf.resource]


def _task(device: str) -> tuple:
    """(job, replica, task) of a device name; None for what it leaves unnamed (replica and task
    default to 0 where a job is named)."""
    if not device:
        return (None, None, None)
    spec = tf.DeviceSpec.from_string(device)
    if spec.job is None:
        return (None, None, None)
    return (spec.job, spec.replica or 0, spec.task or 0)


def _name(task: tuple) -> str:
    job, replica, index = task
    return "this process's own devices" if job is None else f"/job:{job}/replica:{replica}/task:{index}"
