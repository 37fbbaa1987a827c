"""What the splice and the exchange strategies hand each other: a tower's view of the global
statistics, and the process group of between-graph replication.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.errors import GraphsyncError


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Between-graph replication: this graph is task `index` of `tasks` identical worker graphs,
    whose towers synchronize through cross-process collectives (needs strategy="allreduce").

    timeout:   seconds each cross-process collective waits for its peers (and, with a heartbeat,
               the first meeting of the workers); 0: forever.
    heartbeat: seconds a peer's server may stay silent before it is lost; 0: no watch. With one,
               rewrite_towers watches the other workers from the graph's first step on, and a lost
               worker ends this process with status 1 and one line naming it
               (graphsync.watched_steps).
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
        if self.cluster is not None or self.heartbeat:
            from graphsync import cluster   # graphsync.cluster imports this module
            object.__setattr__(self, "cluster", cluster.group_addresses(self))


@dataclasses.dataclass
class Synchronized:
    """One tower's view of the global statistics of its sync group, shaped like its uploads."""

    count: tf.Tensor      # n_t, float64
    total: tf.Tensor      # N, float64
    mean: tf.Tensor       # μ
    variance: tf.Tensor   # σ² (biased)
    bessel: tf.Tensor     # σ²·N/(N−1), what a fused op reports as its batch variance
