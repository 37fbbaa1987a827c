"""Synchronizing one planned reduction (graphsync/plan/reductions.py): a `Sum` or `Mean` over a
tower's batch axes becomes what one device computes on the concatenated batch.

Forward, per tower t on its device: its own sum S_t = Σ x over the reduction's axes (kept), and
for a Mean its count n_t (elements per statistic, from the run-time shape); the exchange sums
them: S = Σ_t S_t, N = Σ_t n_t. Every reader of the tower's reduction (forward and gradient ops)
reads S, or S / N for a Mean, shaped as the reduction's output. Nested statistics (a variance
from a synchronized mean) are spliced in forward order, so the outer one sums what the inner
one's readers now compute.

Backward, gradients built before the rewrite: the gradients g_t arriving at every tower's
reduction are summed over the towers (one exchange per gradient call), and each tower's
reduction gradient receives Σ g for a Sum, n_t/N·Σ g for a Mean (which its gradient divides by
n_t): both hand Σ_s g_s (/ N) to every element, the gradient of one device's reduction.
Gradients built after: S reaches each tower through a sum view (graphsync/exchange/views.py),
whose gradient sums the towers' at run time.

A `Max` or `Min`: the extremum M over every tower's own (an all-reduce with that merge, or on the
aggregation device), then the number of elements equal to it in all towers, T (a sum). Its
gradient, as TensorFlow's on the concatenated batch: Σ_s g_s / T to every element equal to M, in
whichever tower. Built before the rewrite, each tower's Max gradient reads Σ g and divides by T
instead of its own count of ties; built after, through an extremum view.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync import stats
from graphsync.exchange.merges import Merge
from graphsync.exchange.views import extremum_view
from graphsync.graph.reroute import reroute_consumers, reroute_control_outputs
from graphsync.graph.tf_private import pristine_scope
from graphsync.plan.data import LayerPlan
from graphsync.splice import marks, segments
from graphsync.splice.layer import Spliced


@marks.made_for_layer
def splice_reduction(graph: tf.Graph, layer: LayerPlan, exchange) -> Spliced:
    """Synchronizes one planned reduction through `exchange` (see graphsync.exchange); returns
    what it made, as splice_layer does."""
    if layer.sites[0].op.type in ("Max", "Min"):
        return _splice_extremum(graph, layer, exchange)
    count = Spliced(layer=layer)
    axes = list(layer.layout.axes)
    mean = layer.sites[0].op.type == "Mean"
    uploads = []
    for site in layer.sites:
        op = site.op
        with pristine_scope(graph, site.device, op.name + "_sync"), graph.control_dependencies(op.control_inputs):
            x = op.inputs[0]
            local = tf.reduce_sum(x, axes, keepdims=True, name="local_sum")
            values = [local]
            if mean:   # elements per statistic, a constant to the gradients
                size = tf.cast(tf.size(x, out_type=tf.int64), x.dtype)
                values.append(tf.stop_gradient(size / tf.cast(tf.size(local), x.dtype), name="count"))
            uploads.append(values)
    if layer.has_gradients:
        totals = exchange.sums(graph, layer, layer.sites, uploads, "forward")
    else:
        totals = exchange.shared_sums(graph, layer, layer.sites, uploads, "forward")
    for site, tower_totals in zip(layer.sites, totals):
        op = site.op
        with pristine_scope(graph, site.device, op.name + "_sync"):
            value = tf.math.truediv(tower_totals[0], tower_totals[1], name="mean") if mean else \
                tf.identity(tower_totals[0], name="sum")
            if not op.get_attr("keep_dims"):
                value = tf.squeeze(value, axes, name="value")
        marks.mark(graph, layer, site, **{"mean" if mean else "sum": value})
        count.edges += reroute_consumers(op.outputs[0], value)
        count.control_edges += reroute_control_outputs(op, [value.op])
        if layer.has_gradients:   # recompute="segments" may begin a segment where the value is read
            count.segments.append((None, segments.readers_of(value), True))
    for k in range(len(layer.sites[0].grad_ops)):
        _backward(graph, layer, exchange, uploads, totals, k, mean, count)
    return count


@marks.made_for_backward
def _backward(graph, layer: LayerPlan, exchange, uploads, totals, k: int, mean: bool, count: Spliced):
    """The k-th gradient call: the gradients arriving at the towers' reductions summed over the
    towers, each tower's reduction gradient handed its share."""
    grads = [site.grad_ops[k] for site in layer.sites]
    summed = exchange.sums(graph, layer, layer.sites, [[g.entry] for g in grads], f"backward_{k}")
    for site, g, upload, tower_totals, (total,) in zip(layer.sites, grads, uploads, totals, summed):
        with pristine_scope(graph, site.device, f"{site.op.name}_sync_grad_{k}"):
            shared = stats.share(total, upload[1], tower_totals[1]) if mean else total
            shared = tf.identity(shared, name="grad")
        count.edges += reroute_consumers(g.entry, shared, only=g.readers)
        count.grads_replaced += 1


def _splice_extremum(graph: tf.Graph, layer: LayerPlan, exchange) -> Spliced:
    """A Max or Min: the extremum over the towers, the count of its ties in all towers, and the
    gradient split among them (the module docstring)."""
    count = Spliced(layer=layer)
    axes, merge = list(layer.layout.axes), Merge(layer.sites[0].op.type)
    reduce = tf.reduce_max if merge is Merge.MAX else tf.reduce_min
    local = []
    for site in layer.sites:
        with pristine_scope(graph, site.device, site.op.name + "_sync"), \
                graph.control_dependencies(site.op.control_inputs):
            local.append(reduce(site.op.inputs[0], axes, keepdims=True, name="local_extremum"))
    extrema = exchange.extrema(graph, layer, layer.sites, local, merge)
    ties = []
    for site, (extremum, _) in zip(layer.sites, extrema):
        x = site.op.inputs[0]
        with pristine_scope(graph, site.device, site.op.name + "_sync"):
            ties.append([tf.reduce_sum(tf.cast(tf.equal(x, extremum), x.dtype), axes, keepdims=True, name="ties")])
    ties = [t[0] for t in exchange.sums(graph, layer, layer.sites, ties, "forward_ties")]
    for site, (extremum, keys), tower_ties in zip(layer.sites, extrema, ties):
        op = site.op
        with pristine_scope(graph, site.device, op.name + "_sync"):
            value = tf.identity(extremum, name="value") if layer.has_gradients else \
                extremum_view(graph, site, extremum, op.inputs[0], tower_ties, **keys)
            if not op.get_attr("keep_dims"):
                value = tf.squeeze(value, axes, name="value")
        marks.mark(graph, layer, site, **{"maximum" if merge is Merge.MAX else "minimum": value})
        count.edges += reroute_consumers(op.outputs[0], value)
        count.control_edges += reroute_control_outputs(op, [value.op])
    for k in range(len(layer.sites[0].grad_ops)):
        _extremum_backward(graph, layer, exchange, ties, k, count)
    return count


@marks.made_for_backward
def _extremum_backward(graph, layer: LayerPlan, exchange, ties, k: int, count: Spliced):
    """The k-th gradient call of a Max or Min: the gradients arriving at the towers' extrema
    summed, each tower's gradient function handed the sum and the ties of every tower."""
    grads = [site.grad_ops[k] for site in layer.sites]
    summed = exchange.sums(graph, layer, layer.sites, [[g.entry] for g in grads], f"backward_{k}")
    for site, g, (total,), tower_ties in zip(layer.sites, grads, summed, ties):
        with pristine_scope(graph, site.device, f"{site.op.name}_sync_grad_{k}"):
            shared = tf.identity(total, name="grad")
            all_ties = tf.identity(tower_ties, name="ties")
        count.edges += reroute_consumers(g.entry, shared, only=g.readers)
        count.edges += reroute_consumers(g.ties, all_ties, only=g.ties_readers)
        count.grads_replaced += 1
