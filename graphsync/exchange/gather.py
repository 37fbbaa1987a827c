"""The default strategy: every sync group's statistics sent to one chosen device, merged there
(Chan et al., float64, graphsync.stats) and sent back. The seed's hand-written layout, minus the
activations.
"""
from __future__ import annotations

import contextlib

import tensorflow as tf

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync import stats
from graphsync.exchange import library, marking, transports
from graphsync.exchange.merges import Merge
from graphsync.exchange.values import Synchronized
from graphsync.exchange.views import gathered_sum, sum_view, view
from graphsync.graph.fast_ops import FastOps
from graphsync.graph.tf_private import pristine_scope
from graphsync.stats import Spread

AGGREGATION_SCOPE = "graphsync"


class Gather:
    """Statistics of each sync group merged on one device."""

    name = "gather"

    def __init__(self, graph: tf.Graph, device: str, groups):
        self.device, self.groups = device, groups
        self.ops = FastOps(graph)

    def _scope(self, layer, part, g):
        suffix = f"_group{g}" if len(self.groups) > 1 else ""
        return f"{AGGREGATION_SCOPE}/{layer.name}/{part}{suffix}"

    @contextlib.contextmanager
    def _aggregating(self, graph, layer, tag, g):
        """On the aggregation device, in group g's scope for exchange `tag`, every op marked."""
        with pristine_scope(graph, self.device, self._scope(layer, tag, g)), \
                marking.exchange(graph, layer.name, tag, aggregation=True):
            yield

    def _view_keys(self, layer, tag, g, members, member):
        """How a view's gradient finds group g's towers, and where its sum goes: beside the
        forward's merge (graphsync/<layer>/backward_statistics…)."""
        return dict(transport="gather", members=len(members), member=member, layer=layer.name,
                    gradient_scope=self._scope(layer, tag.replace("forward", "backward_statistics", 1), g))

    def moments(self, graph, layer, sites, uploads, spread=Spread.M2) -> list[Synchronized]:
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            with self._aggregating(graph, layer, "forward", g):
                counts, total, mean, variance, bessel = _merged(
                    self.ops, *zip(*[uploads[i] for i in members]), spread=spread, epsilon=layer.residual_epsilon)
                factor = None
                if spread is Spread.BESSEL and not layer.has_gradients:   # each tower's σ²·N/(N−1), see _view
                    ops = self.ops
                    factor = ops.cast(ops.binary("RealDiv", total, ops.binary(
                        "Maximum", ops.binary("Sub", total, 1.0), 1.0)), variance.dtype, name="bessel_factor")
            for member, (i, count) in enumerate(zip(members, counts)):
                out[i] = Synchronized(count, total, mean, variance, bessel)
                if not layer.has_gradients:
                    out[i] = view(graph, sites[i], out[i], uploads[i], spread, factor,
                                  **self._view_keys(layer, "forward", g, members, member))
        return out

    def sums(self, graph, layer, sites, values, tag, finish=None) -> list[list]:
        """Cross-tower sums of each tower's values, passed through `finish(sums, tower index, ops)`
        on the aggregation device (once per group, with its first tower) when given."""
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            with self._aggregating(graph, layer, tag, g):
                totals = [self.ops.sum_in_order([values[i][j] for i in members]) for j in range(len(values[members[0]]))]
                if finish is not None:
                    totals = finish(totals, members[0], self.ops)
            for i in members:
                out[i] = totals
        return out

    def shared_sums(self, graph, layer, sites, values, tag="forward") -> list[list]:
        """`sums` whose first total reaches each tower through a view (graphsync/exchange/views.py):
        its gradient, built later, sums the towers' at run time; the other totals are constants
        to the gradients (counts)."""
        out = self.sums(graph, layer, sites, values, tag)
        for g, members in enumerate(self.groups):
            for member, i in enumerate(members):
                shared = sum_view(graph, sites[i], out[i][0], values[i][0],
                                  **self._view_keys(layer, tag, g, members, member))
                with pristine_scope(graph, sites[i].device, sites[i].op.name + "_sync"):
                    out[i] = [shared] + [tf.stop_gradient(t) for t in out[i][1:]]
        return out

    def extrema(self, graph, layer, sites, values, merge: Merge, tag="forward_extremum") -> list[tuple]:
        """Per tower: (the elementwise `merge` (MAX or MIN) of every tower's value, the keys of
        a view of it, graphsync/exchange/views.py)."""
        out = [None] * len(sites)
        reduce = tf.reduce_max if merge is Merge.MAX else tf.reduce_min
        for g, members in enumerate(self.groups):
            with self._aggregating(graph, layer, tag, g):
                total = reduce(tf.stack([values[i] for i in members]), 0, name="extremum")
            for member, i in enumerate(members):
                out[i] = (total, self._view_keys(layer, tag, g, members, member))
        return out


@transports.registers_gradient_sum("gather")
def _gathered_gradient_sum(op, contribution, k):
    """One AddN on the aggregation device, beside the forward's merge (graphsync/<layer>/backward_statistics…)."""
    merged = op.inputs[0]
    with marking.gradient_sum(op, aggregation=True):
        return gathered_sum(op, contribution, k, merged.name, merged.device, marking.gradient_scope(op),
                            marks.get(op, Mark.MEMBERS))


def _merged(ops, sizes, means, spreads, residuals=(), spread=Spread.M2, epsilon=None):
    """stats.merge_moments as one call op (graphsync/exchange/library.py): the merge is 30-odd
    ops per layer, a sixth of a rewrite's cost when spelled out. Its signature is the towers'
    number, dtypes and ranks, so one trace serves every layer of a model; the number of
    statistics per size and ε come in as float64 constants."""
    f64 = tf.float64
    refine = bool(residuals) and all(r is not None for r in residuals)
    per_statistic = means[0].shape.num_elements()
    per_statistic = ops.constant(float(per_statistic), f64) if per_statistic is not None else \
        ops.cast(tf.size(means[0]), f64)
    inputs = list(sizes) + list(means) + list(spreads) + (list(residuals) if refine else []) + [per_statistic]
    with_epsilon = refine and epsilon is not None
    if with_epsilon:
        inputs.append(ops.constant(float(epsilon), f64))
    merge = library.traced(_merge, (spread, len(sizes), refine, with_epsilon), library.rank_specs(inputs))
    *counts, total, mean, variance, bessel = ops.call(merge, inputs, "merge")
    for t in counts + [total]:
        t.set_shape([])
    for t in (mean, variance, bessel):
        t.set_shape(means[0].shape)
    return counts, total, mean, variance, bessel


def _merge(spread, towers, refine, with_epsilon):
    def merge(*inputs):
        ops = FastOps(tf.compat.v1.get_default_graph())
        sizes, means, spreads = inputs[:towers], inputs[towers:2 * towers], inputs[2 * towers:3 * towers]
        residuals = inputs[3 * towers:4 * towers] if refine else None
        per_statistic = inputs[(4 if refine else 3) * towers]
        counts, *merged = stats.merge_moments(ops, sizes, means, spreads, residuals, spread,
                                              inputs[-1] if with_epsilon else None, per_statistic)
        return (*counts, *merged)
    return merge
