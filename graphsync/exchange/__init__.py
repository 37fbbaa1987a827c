"""How synchronized statistics cross devices: gathered on one device, or all-reduced.

Both strategies offer the same two operations to the splice, per sync group of towers:

    moments(uploads)  every tower's (n, m, spread) → every tower's (N, μ, σ²)   one sync point forward
    sums(values)      every tower's [a, b, …]  → every tower's [Σa, Σb, …]     one sync point backward

    gather.py       Gather: merged on one chosen device (the default)
    allreduce.py    AllReduce: one packed collective per layer and direction, no central device
    through_ps.py   ThroughPs: AllReduce's vectors summed across worker processes through queues
                    on a parameter server, for steps that use a ps (no collective: see there)
    queues.py       the queues' cross-process sum, in worker order
    views.py        statistics views, whose gradients sum the towers' at run time
    library.py      small tf.functions the exchanges call (the gathered merge, all-reduce packing)
    collectives.py  collective all-reduces, their keys and gradient
    values.py       Synchronized (what a tower receives)
"""
from __future__ import annotations

from graphsync.errors import GraphsyncError
from graphsync.exchange.allreduce import AllReduce
from graphsync.exchange.collectives import differentiation
from graphsync.exchange.gather import Gather
from graphsync.exchange.through_ps import ThroughPs
from graphsync.exchange.values import Synchronized
from graphsync.exchange.views import summed_gradient

__all__ = ["AllReduce", "Gather", "Synchronized", "ThroughPs", "differentiation", "make_exchange",
           "summed_gradient"]


def make_exchange(graph, strategy: str, device: str, groups, process_group=None, fingerprint: int = 0,
                  ps_tasks=()):
    """The exchange of a plan; a between-graph step that uses parameter servers (`ps_tasks`, see
    graphsync/plan/shared_tasks.py) sums through them, whatever the strategy."""
    if strategy == "gather":
        if process_group is not None:
            raise GraphsyncError("between-graph replication (process_group=) needs strategy='allreduce'")
        return Gather(graph, device, groups)
    if strategy == "allreduce":
        if process_group is not None and ps_tasks:
            return ThroughPs(graph, groups, process_group, ps_tasks, fingerprint)
        return AllReduce(graph, groups, process_group, fingerprint)
    raise GraphsyncError(f"unknown strategy {strategy!r}: use 'gather' or 'allreduce'")
