"""Building the synchronized ops of one planned layer and moving every edge onto them.

Per layer and tower, new ops sit in the tower's scope on the tower's device (`<op>_sync/…`); the
aggregation sits in `graphsync/<layer>/` on the plan's device, one box per layer in TensorBoard.
Only the sufficient statistics cross devices: forward up n, m, M2 (2C+1 numbers) and down N, μ, σ²
(2C+1); backward 2C each way.
"""
from __future__ import annotations

import collections
import dataclasses
import warnings

import tensorflow as tf

from graphsync import match, stats
from graphsync.errors import GraphsyncWarning
from graphsync.plan import LayerPlan, Site
from graphsync.reroute import reroute_consumers, reroute_control_outputs
from graphsync.tf_private import pristine_scope

AGGREGATION_SCOPE = "graphsync"
UPLOAD_GRADIENT = "GraphsyncStatisticsUpload"
_differentiations = collections.Counter()
_warned_graphs = set()


@tf.RegisterGradient(UPLOAD_GRADIENT)
def _upload_gradient(op, grad):
    """Identity's gradient, counting how many tf.gradients calls pass through a tower's upload.

    One call over the sum of the tower losses passes once per layer. A second pass means one
    tf.gradients per tower after the forward was rewritten: still exact, but each tower's backward
    then runs through every tower (work grows with towers²).
    """
    key = (id(op.graph), op.name)
    _differentiations[key] += 1
    if _differentiations[key] == 2 and id(op.graph) not in _warned_graphs:
        _warned_graphs.add(id(op.graph))
        warnings.warn(
            f"graphsync: {op.name} (and likely every synchronized layer) is differentiated by more than "
            "one tf.gradients call; after a rewrite each per-tower tf.gradients runs through every tower "
            "(work grows with towers squared). Results stay exact. Remedy: call graphsync.rewrite_towers() "
            "after building the gradients, or differentiate the sum of the tower losses once.",
            GraphsyncWarning, stacklevel=2)
    return grad


@dataclasses.dataclass
class TowerStatistics:
    """One tower's view of the global statistics (on the tower's device)."""

    count: tf.Tensor      # n_t, float64
    total: tf.Tensor      # N, float64
    mean: tf.Tensor       # μ, keep-dims shape
    variance: tf.Tensor   # σ² (biased), keep-dims shape


@dataclasses.dataclass
class SpliceCount:
    edges: int = 0
    control_edges: int = 0
    grads_replaced: int = 0


def splice_layer(graph: tf.Graph, layer: LayerPlan, device: str) -> SpliceCount:
    count = SpliceCount()
    statistics = _synchronized_moments(graph, layer, device)
    if layer.kind == "fused":
        forwards = [_fused_forward(graph, layer, site, s, count) for site, s in zip(layer.sites, statistics)]
        for k in range(len(layer.sites[0].grad_ops)):
            _fused_backward(graph, layer, device, forwards, k, count)
    else:
        for site, s in zip(layer.sites, statistics):
            _moments_forward(graph, layer, site, s, count)
        for k in range(len(layer.sites[0].grad_ops)):
            _moments_backward(graph, layer, device, statistics, k, count)
    return count


def _input(site: Site) -> tf.Tensor:
    return site.op.inputs[0]


def _synchronized_moments(graph, layer: LayerPlan, device) -> list[TowerStatistics]:
    """Every tower's (n, m, M2) up to `device`, merged there, the global moments back down."""
    uploads = []
    for site in layer.sites:
        with pristine_scope(graph, site.device, site.op.name + "_sync"), \
                graph.control_dependencies(site.op.control_inputs):
            n, mean, m2 = stats.local_moments(stats.as_float32(_input(site)), layer.layout)
            if not layer.has_gradients:
                with graph.gradient_override_map({"Identity": UPLOAD_GRADIENT}):
                    mean, m2 = tf.identity(mean, name="upload_mean"), tf.identity(m2, name="upload_m2")
            uploads.append((n, mean, m2))
    with pristine_scope(graph, device, f"{AGGREGATION_SCOPE}/{layer.name}/forward"):
        total, mean, variance = stats.merge_moments(*zip(*uploads))
    return [TowerStatistics(n, total, mean, variance) for n, _, _ in uploads]


@dataclasses.dataclass
class FusedForward:
    mean: tf.Tensor
    inv_std: tf.Tensor
    total: tf.Tensor


def _fused_forward(graph, layer: LayerPlan, site: Site, s: TowerStatistics, count: SpliceCount):
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


def _fused_backward(graph, layer: LayerPlan, device, forwards, k: int, count: SpliceCount):
    """Replaces the k-th FusedBatchNormGrad of every tower by the synchronized backward."""
    local = []
    for site, fwd in zip(layer.sites, forwards):
        grad_op = site.grad_ops[k]
        with pristine_scope(graph, grad_op.device or site.device, f"{site.op.name}_sync_grad_{k}"), \
                graph.control_dependencies(grad_op.control_inputs):
            dy = stats.as_float32(grad_op.inputs[0])
            x = stats.as_float32(grad_op.inputs[1])
            local.append((dy,) + stats.local_grad_sums(dy, x, fwd.mean, fwd.inv_std, layer.layout))

    with pristine_scope(graph, device, f"{AGGREGATION_SCOPE}/{layer.name}/backward_{k}"):
        sum_dy = tf.add_n([a for _, a, _, _ in local], name="sum_dy")
        sum_dy_xhat = tf.add_n([b for _, _, b, _ in local], name="sum_dy_xhat")

    for site, fwd, (dy, grad_offset, grad_scale, centred) in zip(layer.sites, forwards, local):
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


def _moments_forward(graph, layer: LayerPlan, site: Site, s: TowerStatistics, count: SpliceCount):
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


def _moments_backward(graph, layer: LayerPlan, device, statistics, k: int, count: SpliceCount):
    """The gradients arriving at every tower's mean (and variance) are summed across towers; each
    tower's Mean gradient then receives n_t/N of the sum, so it hands Σ_s g_s / N to its x: the
    gradient of the global moments. Together with the forward's global StopGradient this is the
    exact gradient of the concatenated batch."""
    grads = [site.grad_ops[k] for site in layer.sites]
    for which in ("mean", "variance"):
        arriving = [getattr(g, which) for g in grads]
        present = [a for a in arriving if a is not None]
        if not present:
            continue
        with pristine_scope(graph, device, f"{AGGREGATION_SCOPE}/{layer.name}/backward_{k}"):
            total = tf.add_n(present, name=f"sum_grad_{which}")
        for site, g, a, s in zip(layer.sites, grads, arriving, statistics):
            if a is None:
                continue
            with pristine_scope(graph, site.device, f"{site.op.name}_sync_grad_{k}"):
                shared = tf.identity(stats.share(total, s.count, s.total), name=f"grad_{which}")
            count.edges += reroute_consumers(a, shared, only=getattr(g, f"{which}_readers"))
        count.grads_replaced += len(grads)
