"""Building the synchronized ops of one planned layer and moving every edge onto them.

Per layer and tower, new ops sit in the tower's scope on the tower's device (`<op>_sync/…`); the
aggregation sits in `graphsync/<layer>/` on the plan's device, one box per layer in TensorBoard.
Only the sufficient statistics cross devices: forward up n, m, M2 (2C+1 numbers; float32 towers add
C residuals, see graphsync/stats.py) and down N, μ, σ² (2C+1); backward 2C each way.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync import match, stats
from graphsync.exchange import Synchronized, differentiation, summed_gradient
from graphsync.exchange.views import VIEW_GRADIENT, view_gradient
from graphsync.graph.reroute import reroute_consumers, reroute_control_outputs
from graphsync.graph.fast_ops import FastOps
from graphsync.graph.tf_private import pristine_scope, set_attr, update_input
from graphsync.plan.data import LayerPlan, Site
from graphsync.plan.options import Recompute
from graphsync.splice import fused_kernels as fused
from graphsync.splice import marks
from graphsync.splice import recompute as recomputation
from graphsync.splice import segments
from graphsync.splice import stand_in

SYNCHRONIZED_NORMALIZE_GRADIENT = "GraphsyncSynchronizedNormalize"   # also in match.GRAPHSYNC_GRADIENTS
RECOMPUTING_VIEW_GRADIENT = "GraphsyncStatisticsViewRecomputing"


@dataclasses.dataclass
class Spliced:
    """What splicing one layer made: the edges it moved, the gradient ops it replaced, and the
    sites it synchronized (the plan's, or for a conditional layer the stand-ins it built)."""

    edges: int = 0
    control_edges: int = 0
    grads_replaced: int = 0
    layer: LayerPlan | None = None
    recomputed: int = 0   # tensors the backward now reads recomputed (graphsync/splice/recompute.py), all towers
    segments: list = dataclasses.field(default_factory=list)   # recompute="segments": per tower (trigger, roots, differentiated)


@marks.made_for_layer
def splice_layer(graph: tf.Graph, layer: LayerPlan, exchange, recompute: Recompute = Recompute.OFF) -> Spliced:
    """Synchronizes one layer through `exchange` (see graphsync.exchange); returns what it made.
    With Recompute.LAYERS, the backward that exists reads the normalized output and the
    elementwise ops after it recomputed (graphsync/splice/recompute.py); with SEGMENTS, what a
    segment starting at this layer would recompute from is returned (graphsync/splice/segments.py)."""
    count = Spliced()
    if layer.form.in_branches:
        layer, count.edges = stand_in.stand_in(graph, layer)
    count.layer = layer
    if layer.form.fused_kernel:
        uploads = []
        for site in layer.sites:
            op = site.op
            with pristine_scope(graph, site.device, op.name + "_sync"), graph.control_dependencies(op.control_inputs):
                uploads.append(fused.kernel_moments(graph, op, exchange.ops))
        statistics = exchange.moments(graph, layer, layer.sites, uploads, spread=stats.Spread.BESSEL)
        scales = [fused.forward_read(graph, site.op.inputs[1], site.device, site.op.name + "_sync")
                  for site in layer.sites]
        roots = [recomputation.fused_roots(_fused_forward(graph, layer, site, s, scale, count))
                 for site, s, scale in zip(layer.sites, statistics, scales)]
        for k in range(len(layer.sites[0].grad_ops)):
            _fused_backward(graph, layer, exchange, statistics, scales, k, count)
    else:
        uploads = []
        for site in layer.sites:
            with pristine_scope(graph, site.device, site.op.name + "_sync"), \
                    graph.control_dependencies(site.op.control_inputs):
                weights = site.parts.weights
                uploads.append(stats.local_moments(site.parts.x, layer.layout) if weights is None else
                               stats.weighted_local_moments(site.parts.x, weights, layer.layout))
        statistics = exchange.moments(graph, layer, layer.sites, uploads)
        roots = [recomputation.moments_roots(site.parts.x, _moments_forward(graph, layer, site, s, count))
                 for site, s in zip(layer.sites, statistics)]
        for k in range(len(layer.sites[0].grad_ops)):
            _moments_backward(graph, layer, exchange, statistics, k, count)
    if recompute is Recompute.SEGMENTS:
        count.segments = [(_trigger(tower_roots, s, layer.has_gradients), tower_roots, layer.has_gradients)
                          for tower_roots, s in zip(roots, statistics)]
    elif recompute and layer.has_gradients:
        for tower_roots in roots:
            count.recomputed += recomputation.recompute(graph, tower_roots).tensors
    elif recompute:
        for tower_roots, s in zip(roots, statistics):
            trigger = _trigger(tower_roots, s, False)
            if trigger is not None:
                recomputation.defer(trigger, tower_roots)
    return count


def _trigger(roots: list, s: Synchronized, differentiated: bool):
    """The op whose gradient function recomputes a layer rewritten before its gradients: the one
    its backward reaches last (graphsync/splice/recompute.py) — a fused layer's normalization (the
    root itself), a moments layer's statistics view, which then gets a gradient that recomputes
    first. None when there is nothing to recompute."""
    if not roots:
        return None
    if roots[0].type in match.FUSED_TYPES:
        return roots[0]
    view = s.mean.op
    if differentiated:
        return view
    if view.type == "IdentityN" and view.get_attr("_gradient_op_type") == VIEW_GRADIENT.encode():
        set_attr(view, "_gradient_op_type", attr_value_pb2.AttrValue(s=RECOMPUTING_VIEW_GRADIENT.encode()))
        return view
    return None


@tf.RegisterGradient(RECOMPUTING_VIEW_GRADIENT)
def _recomputing_view_gradient(op, *grads):
    """The statistics view's gradient, once the gradient ops reading the layer's forward outputs
    read recomputed copies."""
    recomputation.when_differentiated(op)
    segments.when_differentiated(op)
    return view_gradient(op, *grads)


def _data_format(op: tf.Operation) -> str:
    return op.get_attr("data_format").decode()


def _fused_forward(graph, layer: LayerPlan, site: Site, s: Synchronized, scale, count: Spliced):
    """y, batch mean and Bessel-corrected batch variance (or, with exponential_avg_factor f ≠ 1,
    the new moving averages) exactly as the op would compute them on the concatenated batch.
    `scale` is γ as fused.forward_read gives it."""
    op = site.op
    with pristine_scope(graph, site.device, op.name + "_sync"):
        y = fused.normalize(graph, op.inputs[0], scale, op.inputs[2], s.mean, s.variance,
                            layer.epsilon, _data_format(op),
                            fused.NORMALIZE_GRADIENT if layer.has_gradients else SYNCHRONIZED_NORMALIZE_GRADIENT,
                            marks=marks.attributes(layer, site, {"mean": 3, "variance": 4}))
        batch_mean, batch_variance = s.mean, s.bessel
        if layer.avg_factor != 1.0:
            f = layer.avg_factor
            batch_mean = (1.0 - f) * op.inputs[3] + f * batch_mean
            batch_variance = (1.0 - f) * op.inputs[4] + f * batch_variance
    count.edges += reroute_consumers(op.outputs[0], y)
    count.edges += reroute_consumers(op.outputs[1], batch_mean)
    count.edges += reroute_consumers(op.outputs[2], batch_variance)
    if layer.avg_factor != 1.0 and op.inputs[0].shape.rank and op.inputs[0].shape[0] == 0:
        count.edges += _update_kept_averages(op, batch_mean, batch_variance)
    count.control_edges += reroute_control_outputs(op, [y.op])
    return y


def _update_kept_averages(op: tf.Operation, new_mean: tf.Tensor, new_variance: tf.Tensor) -> int:
    """A tower traced with no examples: Keras keeps its replica's copy of the moving averages
    (it writes back what it read); that copy gets the new global averages as every other does."""
    moved = 0
    for read, new in ((op.inputs[3].op, new_mean), (op.inputs[4].op, new_variance)):
        if read.type != "ReadVariableOp":
            continue
        resource = read.inputs[0]
        for writer in resource.consumers():
            value = writer.inputs[1] if writer.type == "AssignVariableOp" and len(writer.inputs) > 1 else None
            if value is not None and value.op.type == "ReadVariableOp" and value.op.inputs[0] is resource:
                update_input(writer, 1, new)
                moved += 1
    return moved


@marks.made_for_backward
def _fused_backward(graph, layer: LayerPlan, exchange, statistics, scales, k: int, count: Spliced):
    """Replaces the k-th FusedBatchNormGrad of every tower by the synchronized backward; γ is read
    from `scales` (the forward's reads, see fused.forward_read), never again from its variable."""
    local = []
    for site, s, scale in zip(layer.sites, statistics, scales):
        grad_op = site.grad_ops[k]
        with pristine_scope(graph, grad_op.device or site.device, f"{site.op.name}_sync_grad_{k}"), \
                graph.control_dependencies(grad_op.control_inputs):
            local.append(fused.grad_sums(grad_op.inputs[0], grad_op.inputs[1], scale, s.mean,
                                         s.variance, layer.epsilon, _data_format(site.op)))
    shared = fused.shared_variable([site.grad_ops[k].inputs[2] for site in layer.sites])

    def finish(totals, i, ops):
        """Where the sums arrive (once per group when gathered) when γ is shared, with tower i's
        own read of it; else per tower below."""
        s = statistics[i]
        return list(fused.correction_coefficients(ops, scales[i], s.variance, layer.epsilon, *totals, s.total)) \
            if shared else totals

    sums = exchange.sums(graph, layer, layer.sites, [[a, b] for _, b, a in local], f"backward_{k}", finish=finish)
    for site, s, scale, (dx_local, grad_scale, grad_offset), totals in zip(layer.sites, statistics, scales, local,
                                                                             sums):
        grad_op = site.grad_ops[k]
        with pristine_scope(graph, grad_op.device or site.device, f"{site.op.name}_sync_grad_{k}"):
            coefficients = totals if shared else fused.correction_coefficients(
                exchange.ops, scale, s.variance, layer.epsilon, *totals, s.total)
            dx = fused.input_grad(dx_local, grad_op.inputs[1], s.mean, s.variance, layer.epsilon,
                                  _data_format(site.op), coefficients)
        count.edges += reroute_consumers(grad_op.outputs[0], dx)
        count.edges += reroute_consumers(grad_op.outputs[1], grad_scale)
        count.edges += reroute_consumers(grad_op.outputs[2], grad_offset)
        count.control_edges += reroute_control_outputs(grad_op, [dx.op, grad_scale.op])
        count.grads_replaced += 1


@tf.RegisterGradient(SYNCHRONIZED_NORMALIZE_GRADIENT)
def _synchronized_normalize_gradient(op, dy, *_unused):
    """A layer rewritten before its gradients: each tower's call builds that tower's synchronized
    backward, as `_fused_backward` does for gradients built first — (a_t, b_t) summed over the
    towers at run time through the statistics' view (graphsync.exchange), then
    dx = γ·r·g − γ·r·(x̂·B + A)/N. Nothing flows into μ and σ²: dx already holds their part."""
    recomputation.when_differentiated(op)
    segments.when_differentiated(op)
    x, scale, _, mean, variance = op.inputs
    view, graph = mean.op, op.graph
    epsilon, data_format = op.get_attr("epsilon"), _data_format(op)
    with pristine_scope(graph, op.device, graph.get_name_scope()):
        ops = FastOps(graph)
        dx_local, sum_dy_xhat, sum_dy = fused.grad_sums(dy, x, scale, mean, variance, epsilon, data_format)
        summed = summed_gradient(view, ops.stack([sum_dy, sum_dy_xhat]), ("y", differentiation(op)))
        coefficients = fused.correction_coefficients(ops, scale, variance, epsilon, *ops.unstack(summed, 2),
                                                     view.inputs[2])
        dx = fused.input_grad(dx_local, x, mean, variance, epsilon, data_format, coefficients)
    return [dx, sum_dy_xhat, sum_dy, None, None]


def _moments_forward(graph, layer: LayerPlan, site: Site, s: Synchronized, count: Spliced):
    """The moments' mean and variance become the global ones for every reader: normalization,
    moving averages, summaries, and the subgraph's own StopGradient (which the variance gradient
    reads). Shape-only readers of the squared difference move to x, which has its shape. The
    gradient ops of a shifted mean's square read μ − s (graphsync/match/sufficient.py)."""
    mean_op, variance_op, sqdiff = site.op, site.parts.variance, site.parts.sqdiff
    mean, variance = s.mean, s.variance
    if not site.parts.keep_dims:
        with pristine_scope(graph, site.device, site.op.name + "_sync"):
            mean, variance = (tf.squeeze(t, list(layer.layout.axes)) for t in (mean, variance))
    marks.mark(graph, layer, site, mean=mean, variance=variance)
    count.edges += reroute_consumers(mean_op.outputs[0], mean)
    count.edges += reroute_consumers(variance_op.outputs[0], variance)
    if sqdiff is not None:
        shape_readers = [c for c in sqdiff.outputs[0].consumers() if c.type in match.SHAPE_TYPES]
        count.edges += reroute_consumers(sqdiff.outputs[0], sqdiff.inputs[0], only=shape_readers)
    readers = [op for g in site.grad_ops for op in g.shifted_mean_readers]
    if readers:
        shifted = site.parts.shifted_mean
        with pristine_scope(graph, site.device, site.op.name + "_sync"):
            recentred = tf.math.subtract(mean, site.parts.shift, name="shifted_mean")
        count.edges += reroute_consumers(shifted, recentred, only=readers)
    for op in (mean_op, variance_op):
        count.control_edges += reroute_control_outputs(op, [mean.op, variance.op])
    return [mean, variance]


@marks.made_for_backward
def _moments_backward(graph, layer: LayerPlan, exchange, statistics, k: int, count: Spliced):
    """The gradients arriving at every tower's mean (and variance) are summed across towers, both
    in one exchange; each tower's Mean gradient then receives n_t/N of the sum, so it hands
    Σ_s g_s / N to its x: the gradient of the global moments. Together with the forward's global
    StopGradient this is the exact gradient of the concatenated batch."""
    grads = [site.grad_ops[k] for site in layer.sites]
    which = [w for w in ("mean", "variance") if any(getattr(g, w) is not None for g in grads)]
    if not which:
        return
    # A variance that reads m unstopped sends gradient into m: its sum must come first (two exchanges).
    phases = [["variance"], ["mean"]] if which == ["mean", "variance"] and \
        layer.sites[0].parts.variance_reads_mean else [which]
    for phase in phases:
        tag = f"backward_{k}" if len(phases) == 1 else f"backward_{k}_{phase[0]}"
        totals = exchange.sums(graph, layer, layer.sites, [[getattr(g, w) for w in phase] for g in grads], tag)
        for site, g, s, tower_totals in zip(layer.sites, grads, statistics, totals):
            for w, total in zip(phase, tower_totals):
                with pristine_scope(graph, site.device, f"{site.op.name}_sync_grad_{k}"):
                    shared = tf.identity(stats.share(total, s.count, s.total), name=f"grad_{w}")
                count.edges += reroute_consumers(getattr(g, w), shared, only=getattr(g, f"{w}_readers"))
    count.grads_replaced += len(grads) * len(which)
