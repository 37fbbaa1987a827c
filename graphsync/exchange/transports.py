"""How a value crosses between towers: the one small interface every transport offers, and the
registry through which a view's gradient (graphsync/exchange/views.py) finds its transport again.

A transport offers two operations, as XLA hands its partitioner one struct of collective-op
creators:

    reduce(graph, layer, sites, packed, tag, merge)  each tower's packed vector → per tower a
                                                     Reduced: the sum (or extremum) over its sync
                                                     group, what to wait for, and the keys a view
                                                     records so that its gradient finds the towers
    gradient_sum(op, contribution, k)                at tf.gradients time, for a view `op` built with
                                                     those keys: Σ over the towers of `contribution`
                                                     to gradient call k (registered by name below)

    collectives.py  Collectives: one CollectiveReduceV2 per layer and direction (in-graph or
                    between worker processes)
    through_ps.py   PsQueues: worker processes summed through queues on a ps task
    gather.py       gathering on one device is a strategy of its own (it merges moments there), but
                    its views' gradients are summed through this registry too

The packed-vector strategy (allreduce.py) and the views only call these two operations: a new
transport is one module that implements `reduce` and registers its `gradient_sum`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

import tensorflow as tf

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.exchange.merges import Merge


_GRADIENT_SUMS: dict[str, Callable] = {}


@dataclasses.dataclass
class Reduced:
    """One tower's result of a transport's `reduce`."""

    total: tf.Tensor
    peers: list          # what the tower's first reader waits for (a barrier, or nothing)
    group: int           # the tower's sync group
    keys: dict           # how a view's gradient finds the same towers (strings and ints), `member` apart


class Transport(Protocol):
    name: str            # the strategy reports call it ("allreduce", "ps")

    def reduce(self, graph, layer, sites, packed, tag: str, merge: Merge = Merge.ADD) -> list[Reduced]: ...


def registers_gradient_sum(name: str):
    """Registers a transport's gradient sum: fn(view op, contribution, k) → Σ over its towers."""
    def register(fn):
        if name in _GRADIENT_SUMS:
            raise ValueError(f"two transports named {name!r}")
        _GRADIENT_SUMS[name] = fn
        return fn
    return register


def gradient_sum(op, contribution, k) -> tf.Tensor:
    """Σ over the towers of view `op`'s sync group of their `contribution` to gradient call `k`,
    through the transport its keys name (a view saved without the name, by graphsync before it
    recorded one: told by its keys)."""
    if marks.has(op, Mark.TRANSPORT):
        name = marks.text(op, Mark.TRANSPORT)
    else:
        name = "collective" if marks.has(op, Mark.GROUP_KEY) else "queues" if marks.has(op, Mark.QUEUE) else "gather"
    return _GRADIENT_SUMS[name](op, contribution, k)
