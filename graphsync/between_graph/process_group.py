"""ProcessGroup: this graph is one of several worker graphs of a between-graph job, and where
the workers are (which the heartbeat needs).

A plain record that graphsync/exchange/ reads (its collectives' group) and graphsync/between_graph/
watches; it imports nothing of either.
"""
from __future__ import annotations

import dataclasses
import os

from graphsync.between_graph.cluster import ClusterTask, from_server_def, from_tf_config
from graphsync.errors import GraphsyncError


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Between-graph replication: this graph is task `index` of `tasks` identical worker graphs,
    whose towers synchronize through cross-process collectives (needs strategy="allreduce"), or
    through queues on the ps tasks their step uses (graphsync/exchange/through_ps.py).

    timeout:   seconds each cross-process collective waits for its peers (and, with a heartbeat,
               the first meeting of the workers); 0: forever.
    heartbeat: seconds a peer's server may stay silent before it is lost; 0: no watch. With one,
               rewrite_towers watches the other workers from the graph's first step on, and a lost
               worker ends this process with status 1 and one line naming it
               (graphsync.between_graph.watched_steps).
    cluster:   the workers' addresses, which the heartbeat needs: the tf.distribute.Server this
               process started, a tf.train.ClusterSpec or {job: ["host:port", …]} (training tasks:
               chief, master, worker, in that order); None: TF_CONFIG's, when there is a heartbeat.
               Kept as ((job, (address, …)), …).
    """

    tasks: int
    index: int
    timeout: float = 0.0
    heartbeat: float = 0.0
    cluster: object = None

    def __post_init__(self):
        if not 0 <= self.index < self.tasks:
            raise GraphsyncError(f"process group index {self.index} is outside 0..{self.tasks - 1}")
        if self.timeout < 0:
            raise GraphsyncError(f"process group timeout {self.timeout} is negative (0 waits forever)")
        if self.heartbeat < 0:
            raise GraphsyncError(f"process group heartbeat {self.heartbeat} is negative (0: none)")
        if self.cluster is not None or self.heartbeat:   # kept normalized (frozen: set once, here)
            object.__setattr__(self, "cluster", group_addresses(self))

    @classmethod
    def of_task(cls, task: ClusterTask, timeout: float = 0.0) -> "ProcessGroup":
        """The group of a training task of a cluster: every training process, this one at its rank."""
        return cls(task.tasks, task.rank, timeout)


def group_addresses(group) -> tuple:
    """A ProcessGroup's `cluster` as ((job, (address, …)), …): from the group's own cluster (a
    tf.distribute.Server, tf.train.ClusterSpec, ClusterDef, dict, or this form), else TF_CONFIG's;
    its training tasks must be the group's and, for a server or TF_CONFIG, its task the group's
    index. Raises GraphsyncError (one line) when it is not, or when there is no cluster at all."""
    where = f"ProcessGroup({group.tasks}, {group.index}, heartbeat={group.heartbeat:g})"
    if group.cluster is None:
        task = from_tf_config(os.environ.get("TF_CONFIG"))
        if task is None:
            raise GraphsyncError(f"{where} needs the workers' addresses to watch them: pass cluster= (the "
                                 "tf.distribute.Server this worker started, its tf.train.ClusterSpec, or "
                                 "{job: ['host:port', ...]}), or set TF_CONFIG")
    else:
        task = _task_of(group.cluster, group)
    if task.tasks != group.tasks:
        raise GraphsyncError(f"{where}: the cluster from {task.source} has {task.tasks} training task"
                             f"{'s' if task.tasks != 1 else ''} (chief, master, worker), not {group.tasks}")
    if task.rank != group.index:
        this = f"{task.name} is not a training task" if task.rank is None else \
            f"{task.name} is process index {task.rank}"
        raise GraphsyncError(f"{where}: {this} in the cluster from {task.source}: give the process group this "
                             "task's index")
    return tuple((job, tuple(task.cluster[job])) for job in sorted(task.cluster))


def of_group(group) -> ClusterTask:
    """The task of this process in a ProcessGroup whose `cluster` group_addresses filled."""
    cluster = {job: list(addresses) for job, addresses in group.cluster}
    job, index = ClusterTask(cluster, "", 0).members[group.index]
    return ClusterTask(cluster, job, index, "the process group")


def _task_of(value, group) -> ClusterTask:
    import tensorflow as tf
    if isinstance(value, tf.distribute.Server):
        return from_server_def(value.server_def)
    if isinstance(value, tuple):
        value = dict(value)
    try:
        spec = tf.train.ClusterSpec(value).as_dict()
    except (TypeError, ValueError) as exc:
        raise GraphsyncError(f"ProcessGroup cluster= must be a tf.distribute.Server, a tf.train.ClusterSpec or "
                             f"{{job: ['host:port', ...]}}, not {type(value).__name__} ({exc})") from None
    cluster = {}
    for job, addresses in spec.items():
        if isinstance(addresses, dict):   # a sparse job: tasks 0…n−1 only
            if sorted(addresses) != list(range(len(addresses))):
                raise GraphsyncError(f"ProcessGroup cluster=: job {job!r} lacks some of tasks 0…{max(addresses)}")
            addresses = [addresses[i] for i in range(len(addresses))]
        cluster[str(job)] = [str(a) for a in addresses]
    members = ClusterTask(cluster, "", 0).members
    job, index = members[group.index] if group.index < len(members) else ("", -1)
    return ClusterTask(cluster, job, index, "cluster=")
