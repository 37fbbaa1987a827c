"""Which worker of a between-graph job this process is: from `TF_CONFIG`, or from the
`tf.distribute.Server` the script creates.

TF1 between-graph replication runs one process per task; each starts a server for its task and
builds its own graph. The processes that train together are the tasks of the `chief` (or `master`)
and `worker` jobs, in that order: process 0 is the chief when there is one, else worker 0. `ps` and
`evaluator` tasks take no part. `TF_CONFIG` is the standard variable:

    {"cluster": {"chief": ["host:port"], "worker": ["host:port", …], "ps": […]},
     "task": {"type": "worker", "index": 1}}

`rewrite_towers` finds its workers' addresses, for a ProcessGroup's heartbeat, in the group's own
`cluster` (a server, a ClusterSpec, a dict), else in TF_CONFIG (graphsync/between_graph/process_group.py).

Cross-process collectives need every server to name the same group leader in its config
(`experimental.collective_group_leader`): process 0's task, `/job:chief/replica:0/task:0` or
`/job:worker/replica:0/task:0`. `server_def_with_leader` adds it to a server definition that has
none, which `graphsync run` does to every server the script creates.
"""
from __future__ import annotations

import dataclasses
import json

from graphsync.errors import GraphsyncError

TRAINING_JOBS = ("chief", "master", "worker")


@dataclasses.dataclass(frozen=True)
class ClusterTask:
    """One task of a cluster: `cluster` maps each job to its tasks' addresses."""

    cluster: dict
    job: str
    index: int
    source: str = "TF_CONFIG"    # or "its tf.distribute.Server"

    @property
    def members(self) -> list[tuple[str, int]]:
        """The (job, index) of every training process, in process order."""
        return [(job, i) for job in TRAINING_JOBS for i in range(len(self.cluster.get(job, ())))]

    @property
    def rank(self) -> int | None:
        """This process's place among the training processes (None: a ps or evaluator task)."""
        members = self.members
        return members.index((self.job, self.index)) if (self.job, self.index) in members else None

    @property
    def tasks(self) -> int:
        return len(self.members)

    @property
    def between_graph(self) -> bool:
        """Whether this process trains together with others (a training task, and not alone)."""
        return self.rank is not None and self.tasks > 1

    @property
    def leader(self) -> str:
        job, index = self.members[0]
        return device_of(job, index)

    def address(self, job: str, index: int) -> str:
        return self.cluster[job][index]

    @property
    def name(self) -> str:
        return task_name(self.job, self.index)

    @property
    def description(self) -> str:
        """E.g. 'worker:1 is process 2 of 3 (cluster from TF_CONFIG)'."""
        if self.rank is None:
            return f"{self.name} is not a training task (cluster from {self.source})"
        return f"{self.name} is process {self.rank + 1} of {self.tasks} (cluster from {self.source})"


def task_name(job: str, index: int) -> str:
    return f"{job}:{index}"


def device_of(job: str, index: int) -> str:
    return f"/job:{job}/replica:0/task:{index}"


def from_tf_config(text: str | None) -> ClusterTask | None:
    """The task `TF_CONFIG` describes (None when unset or empty); a malformed one is an error."""
    if not text or not text.strip():
        return None
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise GraphsyncError(f"TF_CONFIG is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise GraphsyncError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster, task = config.get("cluster"), config.get("task")
    if not cluster:
        return None   # e.g. only an "environment" entry: nothing distributed
    if not isinstance(cluster, dict) or not all(isinstance(v, list) for v in cluster.values()):
        raise GraphsyncError("TF_CONFIG's 'cluster' must map each job to a list of 'host:port' addresses")
    if not isinstance(task, dict) or "type" not in task:
        raise GraphsyncError("TF_CONFIG has a 'cluster' but no 'task' with a 'type' and an 'index'")
    job, index = str(task["type"]), task.get("index", 0)
    if not isinstance(index, int) or job not in cluster or not 0 <= index < len(cluster[job]):
        raise GraphsyncError(f"TF_CONFIG's task {job}:{index} is not in its cluster "
                             f"({', '.join(f'{j}: {len(a)}' for j, a in cluster.items())} tasks)")
    return ClusterTask({j: [str(a) for a in addresses] for j, addresses in cluster.items()}, job, index)


def from_server_def(server_def) -> ClusterTask:
    """The task a `tf.train.ServerDef` starts a server for."""
    cluster = {}
    for job in server_def.cluster.job:
        tasks = dict(job.tasks)
        cluster[job.name] = [tasks[i] for i in sorted(tasks)]
    return ClusterTask(cluster, server_def.job_name, server_def.task_index, "its tf.distribute.Server")


def server_def_with_leader(server_def) -> ClusterTask:
    """Sets the collective group leader in `server_def`'s session config when it names none and
    its task is one of several training processes; returns the task."""
    task = from_server_def(server_def)
    experimental = server_def.default_session_config.experimental
    if task.between_graph and not experimental.collective_group_leader:
        experimental.collective_group_leader = task.leader
    return task
