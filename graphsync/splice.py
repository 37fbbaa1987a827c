"""Building the synchronized ops of one planned layer and moving every edge onto them.

Per layer and tower, new ops sit in the tower's scope on the tower's device (`<op>_sync/…`); the
aggregation sits in `graphsync/<layer>/` on the plan's device, one box per layer in TensorBoard.
Only the sufficient statistics cross devices: forward up n, m, M2 (2C+1 numbers) and down N, μ, σ²
(2C+1); backward 2C each way.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync import match, stats
from graphsync.exchange import Synchronized
from graphsync.plan import LayerPlan, Site
from graphsync.reroute import reroute_consumers, reroute_control_outputs
from graphsync.tf_private import pristine_scope

@dataclasses.dataclass
class SpliceCount:
    edges: int = 0
    control_edges: int = 0
    grads_replaced: int = 0


def splice_layer(graph: tf.Graph, layer: LayerPlan, exchange) -> SpliceCount:
    """Synchronizes one layer through `exchange` (see graphsync.exchange); returns what moved."""
    count = SpliceCount()
    uploads = []
    for site in layer.sites:
        with pristine_scope(graph, site.device, site.op.name + "_sync"), \
                graph.control_dependencies(site.op.control_inputs):
            uploads.append(stats.local_moments(stats.as_float32(site.op.inputs[0]), layer.layout))
    statistics = exchange.moments(graph, layer, layer.sites, uploads)
    if layer.kind == "fused":
        forwards = [_fused_forward(graph, layer, site, s, count) for site, s in zip(layer.sites, statistics)]
        for k in range(len(layer.sites[0].grad_ops)):
            _fused_backward(graph, layer, exchange, forwards, k, count)
    else:
        for site, s in zip(layer.sites, statistics):
            _moments_forward(graph, layer, site, s, count)
        for k in range(len(layer.sites[0].grad_ops)):
            _moments_backward(graph, layer, exchange, statistics, k, count)
    return count


@dataclasses.dataclass
class FusedForward:
    mean: tf.Tensor
    inv_std: tf.Tensor
    total: tf.Tensor


def _fused_forward(graph, layer: LayerPlan, site: Site, s: Synchronized, count: SpliceCount):
    """y, batch mean and Bessel-corrected batch variance (or, with exponential_avg_factor f ≠ 1,
    the new moving averages) exactly as the op would compute them on the concatenated batch."""
    op = site.op
    with pristine_scope(graph, site.device, op.name + "_sync"):
        x = stats.as_float32(op.inputs[0])
        y, inv_std = stats.normalize(x, s.mean, s.variance, op.inputs[1], op.inputs[2], layer.epsilon,
                                     layer.layout)
        y = tf.cast(y, op.inputs[0].dtype, name="y")
        batch_mean = tf.reshape(s.mean, [-1])
        batch_variance = tf.reshape(stats.bessel(s.variance, s.total), [-1])
        if layer.avg_factor != 1.0:
            f = layer.avg_factor
            batch_mean = (1.0 - f) * op.inputs[3] + f * batch_mean
            batch_variance = (1.0 - f) * op.inputs[4] + f * batch_variance
        batch_mean = tf.identity(batch_mean, name="batch_mean")
        batch_variance = tf.identity(batch_variance, name="batch_variance")
    count.edges += reroute_consumers(op.outputs[0], y)
    count.edges += reroute_consumers(op.outputs[1], batch_mean)
    count.edges += reroute_consumers(op.outputs[2], batch_variance)
    count.control_edges += reroute_control_outputs(op, [y.op])
    return FusedForward(s.mean, inv_std, s.total)


def _fused_backward(graph, layer: LayerPlan, exchange, forwards, k: int, count: SpliceCount):
    """Replaces the k-th FusedBatchNormGrad of every tower by the synchronized backward."""
    local = []
    for site, fwd in zip(layer.sites, forwards):
        grad_op = site.grad_ops[k]
        with pristine_scope(graph, grad_op.device or site.device, f"{site.op.name}_sync_grad_{k}"), \
                graph.control_dependencies(grad_op.control_inputs):
            dy = stats.as_float32(grad_op.inputs[0])
            x = stats.as_float32(grad_op.inputs[1])
            local.append((dy,) + stats.local_grad_sums(dy, x, fwd.mean, fwd.inv_std, layer.layout))

    sums = exchange.sums(graph, layer, layer.sites, [[a, b] for _, a, b, _ in local], f"backward_{k}")
    for site, fwd, (dy, grad_offset, grad_scale, centred), (sum_dy, sum_dy_xhat) in \
            zip(layer.sites, forwards, local, sums):
        grad_op = site.grad_ops[k]
        with pristine_scope(graph, grad_op.device or site.device, f"{site.op.name}_sync_grad_{k}"):
            dx = stats.input_grad(dy, centred, grad_op.inputs[2], fwd.inv_std, sum_dy, sum_dy_xhat,
                                  fwd.total, layer.layout)
            dx = tf.cast(dx, grad_op.inputs[1].dtype, name="dx")
            grad_scale = tf.reshape(grad_scale, [-1], name="grad_scale")
            grad_offset = tf.reshape(grad_offset, [-1], name="grad_offset")
        count.edges += reroute_consumers(grad_op.outputs[0], dx)
        count.edges += reroute_consumers(grad_op.outputs[1], grad_scale)
        count.edges += reroute_consumers(grad_op.outputs[2], grad_offset)
        count.control_edges += reroute_control_outputs(grad_op, [dx.op, grad_scale.op, grad_offset.op])
        count.grads_replaced += 1


def _moments_forward(graph, layer: LayerPlan, site: Site, s: Synchronized, count: SpliceCount):
    """The moments' mean and variance become the global ones for every reader: normalization,
    moving averages, summaries, and the subgraph's own StopGradient (which the variance gradient
    reads). Shape-only readers of the squared difference move to x, which has its shape."""
    mean_op, variance_op, sqdiff = site.op, site.parts["variance"], site.parts["sqdiff"]
    with pristine_scope(graph, site.device, site.op.name + "_sync"):
        mean, variance = tf.identity(s.mean, name="mean"), tf.identity(s.variance, name="variance")
        if not mean_op.get_attr("keep_dims"):
            mean, variance = (tf.squeeze(t, list(layer.layout.axes)) for t in (mean, variance))
    count.edges += reroute_consumers(mean_op.outputs[0], mean)
    count.edges += reroute_consumers(variance_op.outputs[0], variance)
    shape_readers = [c for c in sqdiff.outputs[0].consumers() if c.type in match.SHAPE_TYPES]
    count.edges += reroute_consumers(sqdiff.outputs[0], sqdiff.inputs[0], only=shape_readers)
    for op in (mean_op, variance_op):
        count.control_edges += reroute_control_outputs(op, [mean.op, variance.op])


def _moments_backward(graph, layer: LayerPlan, exchange, statistics, k: int, count: SpliceCount):
    """The gradients arriving at every tower's mean (and variance) are summed across towers; each
    tower's Mean gradient then receives n_t/N of the sum, so it hands Σ_s g_s / N to its x: the
    gradient of the global moments. Together with the forward's global StopGradient this is the
    exact gradient of the concatenated batch."""
    grads = [site.grad_ops[k] for site in layer.sites]
    for which in ("mean", "variance"):
        arriving = [getattr(g, which) for g in grads]
        if all(a is None for a in arriving):
            continue
        if any(a is None for a in arriving):
            raise AssertionError(f"plan: {layer.name} has a {which} gradient in some towers only")
        totals = exchange.sums(graph, layer, layer.sites, [[a] for a in arriving], f"backward_{k}_{which}")
        for site, g, a, s, (total,) in zip(layer.sites, grads, arriving, statistics, totals):
            with pristine_scope(graph, site.device, f"{site.op.name}_sync_grad_{k}"):
                shared = tf.identity(stats.share(total, s.count, s.total), name=f"grad_{which}")
            count.edges += reroute_consumers(a, shared, only=getattr(g, f"{which}_readers"))
        count.grads_replaced += len(grads)
