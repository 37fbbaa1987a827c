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
                       every worker's layers the same, before the graph first runs; from the
                       moment every server is up, a heartbeat (graphsync.heartbeat) watches them
    Session.run        counts the synchronized steps (graphsync.steps)

A lost worker (its server silent for `heartbeat` seconds, or restarted) stops this one: a running
synchronized step is cancelled (its sessions closed), a later one is refused, a step that failed
on its own waits for the heartbeat's verdict; the script's own traceback, if any, comes first, and
the process ends with status 1 and, last on stderr, one line naming the lost task and the remedy
(restart every worker: each resumes from its last checkpoint). With a heartbeat the collectives
wait for slow peers forever: only the heartbeat decides a worker is gone (heartbeat 0: no watch,
and every collective fails after `peer_timeout` instead). A worker restarted alone into a running
group never joins their steps: the group leader refuses it at the first meeting (graphsync.peers);
the others, whose heartbeat saw it go, stop at their next synchronized step.

A process that is not one of several training tasks (a ps, an evaluator, a cluster of one) is
synchronized within itself only, as plain AutoSync does.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from graphsync.autosync import AutoSync

DEFAULT_PEER_TIMEOUT = 300.0
DEFAULT_HEARTBEAT = 10.0   # seconds without an answer: lost (TensorFlow's coordination service's default too)
CANCEL_GRACE = 3.0    # seconds a cancelled step may take to reach the script before the process is ended


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
        self.watch = None           # graphsync.heartbeat.PeerWatch, once every server is up
        self.lost = None            # graphsync.heartbeat.LostWorker that stopped a step
        self.steps = None           # graphsync.steps.Steps, once TensorFlow is imported
        self._meeting = False
        self._ended = threading.Event()
        self._lost_said, self._lost_lock = False, threading.Lock()
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
        from graphsync.steps import Steps
        original = tf.distribute.Server.__init__
        original_run = tf_private.session_base_class().run
        watch = self
        self.steps = steps = Steps()

        def server_init(server, server_or_cluster_def, job_name=None, task_index=None, protocol=None,
                        config=None, start=True):
            server_def = tf_private.make_server_def(server_or_cluster_def, job_name, task_index, protocol, config)
            task = cluster.server_def_with_leader(server_def)
            original(server, server_def, start=start)
            watch.server_task, watch.server_target = task, server.target

        def run(session, fetches, *args, **kwargs):
            if watch.watch is None or not steps.is_step(session, fetches):
                return original_run(session, fetches, *args, **kwargs)
            return watch._step(lambda: original_run(session, fetches, *args, **kwargs), steps.begin(session))

        return super().patch_points() + [(tf.distribute.Server, "__init__", server_init),
                                          (tf_private.session_base_class(), "run", run)]

    # -- a lost worker ---------------------------------------------------------------------------

    def _step(self, run, number: int):
        """Runs synchronized step `number`: refused once a worker is lost; a failure waits for the
        heartbeat's verdict on the peers before it reaches the script."""
        import tensorflow as tf
        try:
            if self.watch.lost is not None:
                self._stopped_by(self.watch.lost, f"before synchronized step {number}")
                raise SystemExit(1)
            started = time.monotonic()
            try:
                return run()
            except tf.errors.OpError:
                lost = self.watch.settle(since=started)
                if lost is not None:
                    self._stopped_by(lost, f"during synchronized step {number}")
                raise
        finally:
            self.steps.end()

    def _stopped_by(self, lost, during: str) -> None:
        if self.lost is None:
            lost.during, self.lost = during, lost

    def _on_lost(self, lost) -> None:
        """On the heartbeat's thread: cancels a running step (or the meeting), and ends the process
        if the script has not ended CANCEL_GRACE seconds later (closing a session whose step waits
        for a frozen peer takes TensorFlow about 10 s)."""
        if not (self.steps.running or self._meeting):
            return   # between steps, or training over: the next synchronized step is refused
        self._stopped_by(lost, "at the first meeting" if self._meeting else
                         f"during synchronized step {self.steps.started}")
        threading.Thread(target=self.steps.cancel, name="graphsync-cancel", daemon=True).start()
        if not self._ended.wait(CANCEL_GRACE) and self._say_lost():
            sys.stderr.flush()
            os._exit(1)

    def _say_lost(self) -> bool:
        """The lost worker's line, once (False: already said)."""
        with self._lost_lock:
            said, self._lost_said = self._lost_said, True
        if not said:
            self._say(f"error: {self.lost.line()}", error=True)
        return not said

    def __exit__(self, *exc_info):
        if self.watch is not None:
            self.watch.stop()
        try:
            super().__exit__(*exc_info)
        finally:
            self._ended.set()
        if self.lost is not None:
            sys.stdout.flush()
            if self._say_lost():
                self._end_within(CANCEL_GRACE)
                raise SystemExit(1)
            threading.Event().wait()   # the heartbeat's thread is ending the process

    def _end_within(self, seconds: float) -> None:
        """Exit status 1 in `seconds` at the latest: TensorFlow's teardown can wait ~10 s for a
        frozen peer (faulthandler's watchdog is a C thread: it fires even during finalization)."""
        import faulthandler
        self._devnull = open(os.devnull, "w")   # noqa: SIM115 - must outlive this call
        faulthandler.dump_traceback_later(seconds, exit=True, file=self._devnull)

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
        timeout = 0.0 if self.heartbeat else self.peer_timeout   # with a heartbeat, it decides who is lost
        return dict(options, strategy="allreduce", process_group=task.process_group(timeout, self.heartbeat))

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
        self.steps.graphs.add(graph)
        try:
            started = time.monotonic()
            peers.wait_for_servers(task, self.peer_timeout)
            if self.heartbeat and self.watch is None:
                from graphsync.heartbeat import PeerWatch
                self.watch = PeerWatch(task, self.heartbeat, on_lost=self._on_lost).start()
            left = max(self.peer_timeout - (time.monotonic() - started), 1.0) if self.peer_timeout else 0.0
            self._meeting = True
            try:
                peers.compare_layers(task, self.server_target, report.fingerprints, left, said=self.peer_timeout,
                                     opened=self.steps.sessions.add)
            finally:
                self._meeting = False
        except GraphsyncError as exc:
            if self.lost is not None:
                raise SystemExit(1) from None   # __exit__ names the lost worker
            self.failed(graph, " ".join(str(exc).split()), fatal=True)
