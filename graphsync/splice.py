"""Building the synchronized ops of one planned layer and moving every edge onto them.

Per layer and tower, new ops sit in the tower's scope on the tower's device (`<op>_sync/…`); the
aggregation sits in `graphsync/<layer>/` on the plan's device, one box per layer in TensorBoard.
Only the sufficient statistics cross devices: up n, m, M2 (2C+1 numbers), down N, μ, σ² (2C+1);
backward up Σg, Σg·x̂ and down their sums (2C each way).
"""
from __future__ import annotations

import collections
import dataclasses
import warnings

import tensorflow as tf

from graphsync import stats
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
            f"graphsync: {op.name} (and likely every synchronized layer) is differentiated by more than one tf.gradients call; after a rewrite "
            "each per-tower tf.gradients runs through every tower (work grows with towers squared). "
            "Results stay exact. Remedy: call graphsync.rewrite_towers() after building the gradients, "
            "or differentiate the sum of the tower losses once.", GraphsyncWarning, stacklevel=2)
    return grad


@dataclasses.dataclass
class TowerForward:
    """What one tower's synchronized forward provides to its backward."""

    mean: tf.Tensor
    inv_std: tf.Tensor
    total: tf.Tensor
    ops: list


@dataclasses.dataclass
class SpliceCount:
    edges: int = 0
    control_edges: int = 0
    grad_ops_replaced: int = 0


def splice_fused_layer(graph: tf.Graph, layer: LayerPlan, device: str) -> SpliceCount:
    count = SpliceCount()
    forwards = _fused_forward(graph, layer, device, count)
    for k in range(len(layer.sites[0].grad_ops)):
        _fused_backward(graph, layer, device, forwards, k, count)
    return count


def _local_scope(site: Site, suffix: str = "_sync") -> str:
    return site.op.name + suffix


def _aggregation_scope(layer: LayerPlan, part: str) -> str:
    return f"{AGGREGATION_SCOPE}/{layer.name}/{part}"


def _fused_forward(graph, layer: LayerPlan, device, count: SpliceCount) -> list[TowerForward]:
    uploads = []
    for site in layer.sites:
        with pristine_scope(graph, site.device, _local_scope(site)), \
                graph.control_dependencies(site.op.control_inputs):
            x = stats.as_float32(site.op.inputs[0])
            n, mean, m2 = stats.local_moments(x, layer.layout)
            if not layer.has_gradients:
                with graph.gradient_override_map({"Identity": UPLOAD_GRADIENT}):
                    mean, m2 = tf.identity(mean, name="upload_mean"), tf.identity(m2, name="upload_m2")
            uploads.append((n, mean, m2))

    with pristine_scope(graph, device, _aggregation_scope(layer, "forward")):
        total, mean, variance = stats.merge_moments(*zip(*uploads))

    forwards = []
    for site in layer.sites:
        op = site.op
        with pristine_scope(graph, site.device, _local_scope(site)):
            x = stats.as_float32(op.inputs[0])
            y, inv_std = stats.normalize(x, mean, variance, op.inputs[1], op.inputs[2], layer.epsilon,
                                         layer.layout)
            y = tf.cast(y, op.inputs[0].dtype, name="y")
            batch_mean, batch_variance = mean, stats.bessel(variance, total)
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
        forwards.append(TowerForward(mean, inv_std, total, [y.op]))
    return forwards


def _fused_backward(graph, layer: LayerPlan, device, forwards, k: int, count: SpliceCount):
    """Replaces the k-th FusedBatchNormGrad of every tower by the synchronized backward."""
    locals_ = []
    for site, fwd in zip(layer.sites, forwards):
        grad_op = site.grad_ops[k]
        with pristine_scope(graph, grad_op.device or site.device, _local_scope(site, f"_sync_grad_{k}")), \
                graph.control_dependencies(grad_op.control_inputs):
            dy = stats.as_float32(grad_op.inputs[0])
            x = stats.as_float32(grad_op.inputs[1])
            locals_.append((dy,) + stats.local_grad_sums(dy, x, fwd.mean, fwd.inv_std, layer.layout))

    with pristine_scope(graph, device, _aggregation_scope(layer, f"backward_{k}")):
        sum_dy = tf.add_n([a for _, a, _, _ in locals_], name="sum_dy")
        sum_dy_xhat = tf.add_n([b for _, _, b, _ in locals_], name="sum_dy_xhat")

    for site, fwd, (dy, grad_offset, grad_scale, centred) in zip(layer.sites, forwards, locals_):
        grad_op = site.grad_ops[k]
        with pristine_scope(graph, grad_op.device or site.device, _local_scope(site, f"_sync_grad_{k}")):
            dx = stats.input_grad(dy, centred, grad_op.inputs[2], fwd.inv_std, sum_dy, sum_dy_xhat,
                                  fwd.total, layer.layout)
            dx = tf.cast(dx, grad_op.inputs[1].dtype, name="dx")
        count.edges += reroute_consumers(grad_op.outputs[0], dx)
        count.edges += reroute_consumers(grad_op.outputs[1], grad_scale)
        count.edges += reroute_consumers(grad_op.outputs[2], grad_offset)
        count.control_edges += reroute_control_outputs(grad_op, [dx.op, grad_scale.op, grad_offset.op])
        count.grad_ops_replaced += 1
