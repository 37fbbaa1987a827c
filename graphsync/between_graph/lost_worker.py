"""Stopping a between-graph worker whose peer is lost: what `graphsync run` and `rewrite_towers`
(a ProcessGroup with a heartbeat) share.

A `LostWorkerGuard` holds the heartbeat (graphsync.between_graph.heartbeat.PeerWatch) and the synchronized steps
(graphsync.between_graph.steps.Steps) of one process, and decides what a lost worker does to them:

    between steps, or training over   nothing yet: the next synchronized step is refused
    during a step (or the meeting)    the step is cancelled (its sessions closed); if the script has
                                      not stopped CANCEL_GRACE seconds later (closing a session whose
                                      step waits for a frozen peer takes TensorFlow about 10 s), the
                                      process ends with status 1 after the lost worker's line
    a step that failed on its own     it waits for the heartbeat's verdict on the peers (a peer that
                                      exited fails the collectives before the heartbeat notices)

`meet()` is the workers' first meeting (graphsync.between_graph.peers), the heartbeat starting once every server
is up. `stop_process()` ends the process with status 1 and, last on stderr, the lost worker's line
(said once, by whichever thread comes first). `graphsync run` calls it when the script has ended
(graphsync.autosync.worker: the script's own traceback comes first); `rewrite_towers`' guard calls
it at the failed or refused step itself (graphsync.between_graph.watched_steps, stop_at_step).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from graphsync.between_graph.steps import Steps

CANCEL_GRACE = 3.0    # seconds a cancelled step may take to reach the script before the process is ended


class LostWorkerGuard:
    """say(line): writes one line on stderr. stop_at_step: a failed or refused step ends the
    process at once (stop_process) instead of raising to the script."""

    def __init__(self, say, stop_at_step: bool = False):
        self.say, self.stop_at_step = say, stop_at_step
        self.steps = Steps()
        self.watch = None           # graphsync.between_graph.heartbeat.PeerWatch, once every server is up
        self.lost = None            # graphsync.between_graph.heartbeat.LostWorker that stopped a step
        self.meeting = False        # the workers' first meeting (graphsync.between_graph.peers) is under way
        self.ended = threading.Event()   # set when the script no longer runs steps
        self._said, self._said_lock = False, threading.Lock()

    def start_watch(self, task, interval: float) -> None:
        """Starts the heartbeat on every other training task of `task` (once per process)."""
        if self.watch is None:
            from graphsync.between_graph.heartbeat import PeerWatch
            self.watch = PeerWatch(task, interval, on_lost=self._on_lost).start()

    def meet(self, task, target: str, fingerprints: list[str], heartbeat: float, timeout: float,
             longer: str | None = None) -> None:
        """The workers' first meeting (graphsync.between_graph.peers) through the server at `target`: every
        server up, then the heartbeat on (0: none), then every worker's layers the same, within
        `timeout` seconds in all (0: as long as it takes; `longer`: how to wait longer). Raises
        GraphsyncError when the meeting fails; a worker lost meanwhile stops the process instead
        (stop_at_step; else SystemExit(1), the line left to stop_process)."""
        from graphsync.between_graph import peers
        from graphsync.errors import GraphsyncError
        longer = longer or peers.LONGER
        started = time.monotonic()
        try:
            peers.wait_for_servers(task, timeout, longer=longer)
            if heartbeat:
                self.start_watch(task, heartbeat)
            left = max(timeout - (time.monotonic() - started), 1.0) if timeout else 0.0
            self.meeting = True
            try:
                peers.compare_layers(task, target, fingerprints, left, said=timeout, opened=self.steps.sessions.add,
                                     longer=longer)
            finally:
                self.meeting = False
        except GraphsyncError:
            if self.lost is not None:
                self._refuse()
            raise

    def run(self, original_run, session, fetches, *args, **kwargs):
        """`original_run(session, fetches, …)`, guarded when it is a synchronized step."""
        if self.watch is None or not self.steps.is_step(session, fetches):
            return original_run(session, fetches, *args, **kwargs)
        return self.step(lambda: original_run(session, fetches, *args, **kwargs), self.steps.begin(session))

    def step(self, run, number: int):
        """Runs synchronized step `number`: refused once a worker is lost; a failure waits for the
        heartbeat's verdict on the peers before it reaches the script."""
        import tensorflow as tf
        try:
            if self.watch.lost is not None:
                self._stopped_by(self.watch.lost, f"before synchronized step {number}")
                self._refuse()
            try:
                return run()
            except tf.errors.OpError:
                lost = self.watch.settle(since=time.monotonic())
                if lost is None:
                    raise
                self._stopped_by(lost, f"during synchronized step {number}")
                if self.stop_at_step:
                    self.stop_process()
                raise
        finally:
            self.steps.end()

    def _refuse(self):
        if self.stop_at_step:
            self.stop_process()
        raise SystemExit(1) from None   # graphsync run: its __exit__ names the lost worker

    def _stopped_by(self, lost, during: str) -> None:
        if self.lost is None:
            lost.during, self.lost = during, lost

    def _on_lost(self, lost) -> None:
        """On the heartbeat's thread: cancels a running step (or the meeting), and ends the process
        if the script has not stopped CANCEL_GRACE seconds later."""
        if not (self.steps.running or self.meeting):
            return   # between steps, or training over: the next synchronized step is refused
        self._stopped_by(lost, "at the first meeting" if self.meeting else
                         f"during synchronized step {self.steps.started}")
        threading.Thread(target=self.steps.cancel, name="graphsync-cancel", daemon=True).start()
        if not self.ended.wait(CANCEL_GRACE) and self._say_lost():
            sys.stderr.flush()
            os._exit(1)

    def _say_lost(self) -> bool:
        """The lost worker's line, once (False: already said)."""
        with self._said_lock:
            said, self._said = self._said, True
        if not said:
            self.say(f"error: {self.lost.line()}")
        return not said

    def stop_process(self):
        """Once a worker is lost: status 1, the lost worker's line last on stderr. Raises
        SystemExit(1) and ends the process within CANCEL_GRACE seconds whatever TensorFlow's
        teardown waits for; or, when the heartbeat's thread said the line first, waits for it to
        end the process."""
        self.ended.set()
        sys.stdout.flush()
        if self._say_lost():
            _end_within(CANCEL_GRACE)
            atexit.register(_end_before_teardown)
            raise SystemExit(1)
        threading.Event().wait()   # the heartbeat's thread is ending the process


def _end_before_teardown() -> None:
    """Status 1 once the script has unwound (its `finally` blocks and the atexit handlers it
    registered later than this ran): the interpreter's own teardown would end the daemon threads
    still inside TensorFlow's C++ (the heartbeat's RPC, a session being cancelled), and one such
    thread aborted the process ('FATAL: exception not rethrown', status -6; 1 run in ~10)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _end_within(seconds: float) -> None:
    """Exit status 1 in `seconds` at the latest: TensorFlow's teardown can wait ~10 s for a frozen
    peer (faulthandler's watchdog is a C thread: it fires even during finalization)."""
    import faulthandler
    global _devnull
    _devnull = open(os.devnull, "w")   # noqa: SIM115 - must outlive this call
    faulthandler.dump_traceback_later(seconds, exit=True, file=_devnull)


_devnull = None
