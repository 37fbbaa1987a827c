"""How synchronized statistics cross devices: gathered on one device, or packed and summed by a
transport.

Both strategies offer the same operations to the splice, per sync group of towers:

    moments(uploads)  every tower's (n, m, spread) → every tower's (N, μ, σ²)   one sync point forward
    sums(values)      every tower's [a, b, …]  → every tower's [Σa, Σb, …]     one sync point backward
    shared_sums, extrema   the same for a reduction the rule found (a view's gradient sums later)

    gather.py       Gather: merged on one chosen device (the default)
    allreduce.py    AllReduce: each tower's statistics packed into one vector, summed by a transport
    transports.py   what a transport offers (reduce, and a registered gradient sum for the views)
    collectives.py  Collectives, the transport of strategy "allreduce": collective all-reduces, their
                    keys and gradient
    through_ps.py   PsQueues, the transport of steps that use a parameter server: queues there (no
                    collective: see there)
    queues.py       the queues' cross-process sum, in worker order
    merges.py       Merge: how a transport combines the towers' values (a sum, or a Max or Min's extremum)
    views.py        statistics views, whose gradients sum the towers' at run time
    library.py      small tf.functions the exchanges call (the gathered merge, all-reduce packing)
    values.py       Synchronized (what a tower receives)
"""
from __future__ import annotations

from graphsync.exchange.allreduce import AllReduce
from graphsync.exchange.collectives import Collectives, differentiation
from graphsync.exchange.gather import Gather
from graphsync.exchange.through_ps import PsQueues
from graphsync.exchange.values import Synchronized
from graphsync.exchange.views import summed_gradient
from graphsync.plan.options import RewriteOptions, Strategy

__all__ = ["AllReduce", "Collectives", "Gather", "PsQueues", "Synchronized", "differentiation", "make_exchange",
           "summed_gradient"]


def make_exchange(graph, options: RewriteOptions, device: str, groups, fingerprint: int = 0, ps_tasks=()):
    """The exchange of a plan (its `device`, `groups`) for `options`' strategy; a between-graph
    step that uses parameter servers (`ps_tasks`, see graphsync/plan/shared_tasks.py) sums through
    them, whatever the strategy. The options are valid (plan/options.py): a process group comes
    with Strategy.ALLREDUCE."""
    if options.strategy is Strategy.GATHER:
        return Gather(graph, device, groups)
    process_group = options.process_group
    transport = PsQueues(graph, groups, process_group, ps_tasks, fingerprint) \
        if process_group is not None and ps_tasks else Collectives(graph, groups, process_group, fingerprint)
    return AllReduce(graph, groups, transport)
