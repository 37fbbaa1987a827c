"""`graphsync run` on a between-graph worker: its graph synchronized with every other worker's.

`BetweenGraphSync` is an AutoSync (graphsync.autosync) that also knows the process's cluster and
task — from the `tf.distribute.Server` the script creates, else from `TF_CONFIG` — and then:

    server created     the server's config gets the collective group leader when it names none
                       (graphsync.cluster.server_def_with_leader), before the server starts
    options_for(graph) strategy="allreduce" and process_group=ProcessGroup(tasks, rank, timeout):
                       the worker's towers (its usual single unscoped tower, or several) are
                       synchronized with every tower of every training process
    rewritten(graph)   one line on stderr saying which process of how many this is; then the
                       bounded meeting of the workers (graphsync.peers): every server up, and
                       every worker's layers the same, before the graph first runs

A process that is not one of several training tasks (a ps, an evaluator, a cluster of one) is
synchronized within itself only, as plain AutoSync does.
"""
from __future__ import annotations

import os

from graphsync.autosync import AutoSync

DEFAULT_PEER_TIMEOUT = 300.0


class BetweenGraphSync(AutoSync):
    """AutoSync across the worker processes of a between-graph job.

    peer_timeout: seconds a worker waits for the others — at its first synchronized step, and in
                  every collective after — before failing with one line (0: wait forever).
    tf_config:    the TF_CONFIG text (default: the environment's).
    """

    def __init__(self, *, peer_timeout: float = DEFAULT_PEER_TIMEOUT, tf_config: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.peer_timeout = peer_timeout
        self.tf_config = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
        self.server_task = None     # graphsync.cluster.ClusterTask of the last server created
        self.server_target = None

    def task(self):
        """The cluster task of this process: its server's, else TF_CONFIG's (None: neither)."""
        from graphsync import cluster
        return self.server_task or cluster.from_tf_config(self.tf_config)

    # -- the patches ---------------------------------------------------------------------------

    def patch_points(self) -> list:
        import tensorflow as tf

        from graphsync import cluster, tf_private
        original = tf.distribute.Server.__init__
        watch = self

        def server_init(server, server_or_cluster_def, job_name=None, task_index=None, protocol=None,
                        config=None, start=True):
            server_def = tf_private.make_server_def(server_or_cluster_def, job_name, task_index, protocol, config)
            task = cluster.server_def_with_leader(server_def)
            original(server, server_def, start=start)
            watch.server_task, watch.server_target = task, server.target

        return super().patch_points() + [(tf.distribute.Server, "__init__", server_init)]

    # -- the per-graph decision ------------------------------------------------------------------

    def first_use(self, graph) -> None:
        from graphsync import peers
        if graph not in peers.HANDSHAKE_GRAPHS:
            super().first_use(graph)

    def options_for(self, graph) -> dict | None:
        options = super().options_for(graph)
        if options is None:
            return None
        from graphsync.errors import GraphsyncError
        try:
            task = self.task()
        except GraphsyncError as exc:
            self.failed(graph, " ".join(str(exc).split()), fatal=True)
            return None
        if task is None or not task.between_graph:
            return options
        if self.server_target is None:
            self._say(f"warning: {task.description}, but the script started no tf.distribute.Server: "
                      "its graphs are synchronized within this process only")
            return options
        return dict(options, strategy="allreduce", process_group=task.process_group(self.peer_timeout))

    def rewritten(self, graph, report) -> None:
        if report.process_group is None:
            super().rewritten(graph, report)
            return
        from graphsync import peers
        from graphsync.errors import GraphsyncError
        task = self.server_task
        others = f"the other {task.tasks - 1} workers" if task.tasks > 2 else "the other worker"
        self._say(f"{task.description}; its towers synchronize with {others} through collectives "
                  f"(group leader {task.leader}, peer timeout {self.peer_timeout:g} s)")
        super().rewritten(graph, report)
        try:
            peers.meet(task, self.server_target, report.fingerprints, self.peer_timeout)
        except GraphsyncError as exc:
            self.failed(graph, " ".join(str(exc).split()), fatal=True)
