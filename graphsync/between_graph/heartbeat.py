"""Noticing that another worker of a between-graph job is gone, whatever the step time.

A cross-process collective waits for all its peers: when one worker exits, the others' collectives
fail within a second, but when one freezes (SIGSTOP, a hung machine, a network partition) they
wait as long as the collectives' timeout. Neither of TensorFlow's own mechanisms reaches a TF1
session here (probed on TF 2.21): the coordination service
(`ConfigProto.experimental.coordination_config`) starts on a `tf.distribute.Server`, but no agent
heartbeats into it, so nothing ever aborts; the collective runtime's peer health check
(`context.check_collective_ops_peer_health`) needs an eager context that owns the server. So a
`PeerWatch` thread makes that health check itself: every `poll` seconds it asks each peer's
server for its device incarnations (`WorkerService.GetStatus`, the RPC TensorFlow's own check
sends; graphsync.between_graph.health_probe.worker_incarnations). A peer is lost when

    now − (its last answer) ≥ interval         (exited, killed, frozen or unreachable), or
    its incarnations changed                   (restarted: a new server on the same address).

A server answers from its own gRPC threads, whatever its training script does: a worker that is
slow, or pauses between steps, keeps answering and is never lost. The first loss ends the watch
and calls `on_lost(LostWorker)` on the watch's thread.
"""
from __future__ import annotations

import dataclasses
import threading
import time

from graphsync.between_graph import health_probe
from graphsync.between_graph.cluster import ClusterTask, device_of, task_name


@dataclasses.dataclass
class LostWorker:
    """A peer found lost: `job`, `index`, its address, why; `during` what (set by the watcher's user)."""

    job: str
    index: int
    address: str
    reason: str
    during: str | None = None

    def line(self) -> str:
        """The one line a survivor ends with."""
        return (f"lost worker {task_name(self.job, self.index)} ({device_of(self.job, self.index)}, {self.address}) "
                f"{self.during or 'during training'}: {self.reason}: restart every worker to resume from its "
                "last checkpoint")


class PeerWatch:
    """Checks every other training task of `task`'s cluster on a daemon thread (see module doc)."""

    def __init__(self, task: ClusterTask, interval: float, on_lost=None, poll: float | None = None):
        self.task, self.interval, self.on_lost = task, interval, on_lost
        self.poll = poll if poll is not None else min(1.0, interval / 4)
        self.peers = [m for m in task.members if m != (task.job, task.index)]
        self.lost: LostWorker | None = None
        self._answered = {}      # peer → time.monotonic() of its last answer
        self._incarnations = {}  # peer → incarnations at its first answer
        self._channels = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graphsync-peer-watch", daemon=True)

    def start(self) -> "PeerWatch":
        started = time.monotonic()
        self._answered = {peer: started for peer in self.peers}
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def settle(self, since: float) -> LostWorker | None:
        """After a failed step: waits until every peer has answered a question asked after `since`,
        the moment the step failed (None: they are all there, the failure was something else), or
        one is lost (it), about `interval` at most. An answer from before the failure proves
        nothing: a worker that exits right after its last step answers into the next one."""
        deadline = time.monotonic() + self.interval + 2 * self.poll + 1.0
        while time.monotonic() < deadline and self._thread.is_alive():
            if self.lost is not None:
                return self.lost
            if all(self._answered[p] > since for p in self.peers):
                return None
            time.sleep(min(self.poll, 0.1))
        return self.lost

    def _run(self) -> None:
        while not self._stop.is_set() and self.lost is None:
            for peer in self.peers:
                self.lost = self._check(peer)
                if self.lost is not None:
                    break
            else:
                self._stop.wait(self.poll)
        for channel in self._channels.values():
            channel.close()
        if self.lost is not None and self.on_lost is not None:
            self.on_lost(self.lost)

    def _check(self, peer) -> LostWorker | None:
        address = self.task.address(*peer)
        asked = time.monotonic()
        left = self.interval - (asked - self._answered[peer])
        incarnations = health_probe.worker_incarnations(address, max(left, 0.05), self._channels)
        if incarnations is None:
            silent = time.monotonic() - self._answered[peer]
            if silent >= self.interval:
                return LostWorker(*peer, address, f"its server did not answer for {silent:.0f} s")
            time.sleep(min(self.poll, max(self.interval - silent, 0)))   # refused at once: try again soon
            return None
        if self._incarnations.setdefault(peer, incarnations) != incarnations:
            return LostWorker(*peer, address, "it was restarted (its server is a new one)")
        self._answered[peer] = asked   # alive when asked, at least: an answer may outlast its server
        return None
