"""`graphsync run` on a between-graph worker: its graph synchronized with every other worker's.

`BetweenGraphSync` is an AutoSync (graphsync.autosync.patching) that also knows the process's cluster and
task — from the `tf.distribute.Server` the script creates, else from `TF_CONFIG` — and then:

    server created     the server's config gets the collective group leader when it names none
                       (graphsync.between_graph.cluster.server_def_with_leader), before the server starts
    options_for(graph) strategy="allreduce" and process_group=ProcessGroup(tasks, rank, timeout):
                       the worker's towers (its usual single unscoped tower, or several) are
                       synchronized with every tower of every training process
    rewritten(graph)   one line on stderr saying which process of how many this is; then the
                       bounded meeting of the workers (graphsync.between_graph.peers): every server up, and
                       every worker's layers the same, before the graph first runs; from the
                       moment every server is up, a heartbeat (graphsync.between_graph.heartbeat) watches them
    Session.run        counts the synchronized steps (graphsync.between_graph.steps)

A lost worker (its server silent for `heartbeat` seconds, or restarted) stops this one: a running
synchronized step is cancelled (its sessions closed), a later one is refused, a step that failed
on its own waits for the heartbeat's verdict; the script's own traceback, if any, comes first, and
the process ends with status 1 and, last on stderr, one line naming the lost task and the remedy
(restart every worker: each resumes from its last checkpoint). With a heartbeat the collectives
wait for slow peers forever: only the heartbeat decides a worker is gone (heartbeat 0: no watch,
and every collective fails after `peer_timeout` instead). A worker restarted alone into a running
group never joins their steps: the group leader refuses it at the first meeting (graphsync.between_graph.peers);
the others, whose heartbeat saw it go, stop at their next synchronized step.

A process that is not one of several training tasks (a ps, an evaluator, a cluster of one) is
synchronized within itself only, as plain AutoSync does.
"""
from __future__ import annotations

import os

from graphsync.autosync.patching import AutoSync
from graphsync.between_graph.lost_worker import LostWorkerGuard
from graphsync.between_graph.process_group import ProcessGroup

DEFAULT_PEER_TIMEOUT = 300.0
DEFAULT_HEARTBEAT = 10.0   # seconds without an answer: lost (TensorFlow's coordination service's default too)


class BetweenGraphSync(AutoSync):
    """AutoSync across the worker processes of a between-graph job.

    peer_timeout: seconds a worker waits for the others at its first synchronized step (and, with
                  no heartbeat, in every collective after) before failing with one line (0: forever).
    heartbeat:    seconds a peer's server may stay silent before it counts as lost (0: no watch).
    tf_config:    the TF_CONFIG text (default: the environment's).
    """

    def __init__(self, *, peer_timeout: float = DEFAULT_PEER_TIMEOUT, heartbeat: float = DEFAULT_HEARTBEAT,
                 tf_config: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.peer_timeout, self.heartbeat = peer_timeout, heartbeat
        self.guard = LostWorkerGuard(lambda line: self._say(line, error=True))   # the heartbeat and the steps
        self.tf_config = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
        self.server_task = None     # graphsync.between_graph.cluster.ClusterTask of the last server created
        self.server_target = None

    def task(self):
        """The cluster task of this process: its server's, else TF_CONFIG's (None: neither)."""
        from graphsync.between_graph import cluster
        return self.server_task or cluster.from_tf_config(self.tf_config)

    # -- the patches ---------------------------------------------------------------------------

    def patch_points(self) -> list:
        import tensorflow as tf

        from graphsync.between_graph import cluster
        from graphsync.graph import tf_private
        original = tf.distribute.Server.__init__
        original_run = tf_private.session_base_class().run
        watch, guard = self, self.guard

        def server_init(server, server_or_cluster_def, job_name=None, task_index=None, protocol=None,
                        config=None, start=True):
            server_def = tf_private.make_server_def(server_or_cluster_def, job_name, task_index, protocol, config)
            task = cluster.server_def_with_leader(server_def)
            original(server, server_def, start=start)
            watch.server_task, watch.server_target = task, server.target

        def run(session, fetches, *args, **kwargs):
            return guard.run(original_run, session, fetches, *args, **kwargs)

        return super().patch_points() + [(tf.distribute.Server, "__init__", server_init),
                                          (tf_private.session_base_class(), "run", run)]

    def __exit__(self, *exc_info):
        if self.guard.watch is not None:
            self.guard.watch.stop()
        try:
            super().__exit__(*exc_info)
        finally:
            self.guard.ended.set()
        if self.guard.lost is not None:
            self.guard.stop_process()   # the script's own traceback, if any, came first

    # -- the per-graph decision ------------------------------------------------------------------

    def first_use(self, graph) -> None:
        from graphsync.between_graph import peers
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
        timeout = 0.0 if self.heartbeat else self.peer_timeout   # with a heartbeat, it decides who is lost
        return dict(options, strategy="allreduce", process_group=ProcessGroup.of_task(task, timeout))   # watched here

    def rewritten(self, graph, report, label: str = "") -> None:
        if report.process_group is None:
            super().rewritten(graph, report, label)
            return
        from graphsync.errors import GraphsyncError
        task = self.server_task
        if task is None:   # a TF2 strategy's workers: the strategy set up their collectives, and watches them
            if (f"{label}: ", report.summary) in self._said_traces:
                return
            tasks, index = report.process_group[:2]
            others = f"the other {tasks - 1} workers" if tasks > 2 else "the other worker"
            self._say(f"process {index + 1} of {tasks}; its replicas synchronize with {others} through collectives")
            super().rewritten(graph, report, label)
            return
        others = f"the other {task.tasks - 1} workers" if task.tasks > 2 else "the other worker"
        if report.strategy == "ps":
            self._say(f"{task.description}; its towers synchronize with {others} through queues on "
                      f"{report.device}, which its step uses (peer timeout {self.peer_timeout:g} s)")
        else:
            self._say(f"{task.description}; its towers synchronize with {others} through collectives "
                      f"(group leader {task.leader}, peer timeout {self.peer_timeout:g} s)")
        super().rewritten(graph, report, label)
        self.guard.steps.graphs.add(graph)
        try:
            self.guard.meet(task, self.server_target, report.fingerprints, self.heartbeat, self.peer_timeout)
        except GraphsyncError as exc:
            self.failed(graph, " ".join(str(exc).split()), fatal=True)
