"""Statistics views: how a layer rewritten before its gradients gets exact, linear gradients.

Rewritten before its gradients, a layer hands each tower its statistics through a *view*: one
`IdentityN` per tower (μ, σ², N, and the tower's own size, m, spread as pass-through inputs)
whose gradient sums the towers' gradients at run time — gather: one `AddN` on the aggregation
device whose inputs each tower's tf.gradients call fills in; all-reduce: one collective — and
returns the gradient of the tower's own (m, spread). A fused layer's normalization carries its
tower's whole synchronized backward instead and exchanges its (a, b) the same way
(`summed_gradient`, graphsync/splice/layer.py). The merge itself is never differentiated, so each
tower's tf.gradients stays inside its tower plus one exchange per layer: with one call per tower
or one over the summed losses, the ops added per tower do not grow with the number of towers.
The gradient each tower receives is that of the sum of all towers' losses (as after a rewrite of
built gradients), so every tower's loss must be differentiated; a gathered sum that some tower
never joined fails at run time with a message that says so.
"""
from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.exchange import transports
from graphsync.exchange.collectives import differentiation
from graphsync.exchange.values import Synchronized
from graphsync.graph.tf_private import create_op, pristine_scope, update_input
from graphsync.stats import Spread

UPLOAD_GRADIENT = "GraphsyncStatisticsUpload"
VIEW_GRADIENT = "GraphsyncStatisticsView"
SUM_VIEW_GRADIENT = "GraphsyncSumView"              # these three in graphsync.batch_axis.GRAPHSYNC_VIEWS
EXTREMUM_VIEW_GRADIENT = "GraphsyncExtremumView"
MISSING_TOWER = ("graphsync: a synchronized layer's gradient was built for only some towers of its sync "
                 "group; differentiate every tower's loss (one tf.gradients per tower, or one over their sum)")

_gathered_gradients = weakref.WeakKeyDictionary()     # graph → {(merged μ, k): (places, sum) being filled}


def view(graph, site, s: Synchronized, upload, spread: Spread, factor=None, **keys) -> Synchronized:
    """Tower `site`'s statistics through an IdentityN whose gradient is `view_gradient`; `keys`
    (ints, strings) say how its gradient finds the other towers: members and member (gather),
    members, group_key, instance_key and timeout_ms (all-reduce), or members, member, queue, ps,
    worker and workers (through a ps, graphsync/exchange/through_ps.py). With `factor` (N/(N−1), a
    scalar) the tower's Bessel-corrected variance is σ²·factor, computed on the tower only when
    something reads it, its gradient reaching σ² through the Mul."""
    size, local_mean, local_spread, *_ = upload   # float32 uploads carry a residual too (stats.merge_moments)
    inputs = [s.mean, s.variance, s.total, size, local_mean, local_spread]   # only μ, σ², N cross devices
    attrs = {"T": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                 type=[t.dtype.as_datatype_enum for t in inputs])),
             "_gradient_op_type": attr_value_pb2.AttrValue(s=VIEW_GRADIENT.encode()),
             Mark.SPREAD.value: marks.value(spread.value)}
    attrs.update(_key_attrs(keys))
    with pristine_scope(graph, site.device, site.op.name + "_sync"):
        view = create_op(graph, "IdentityN", inputs, attrs, "statistics")
        bessel = None if factor is None else create_op(
            graph, "Mul", [view.outputs[1], factor], {"T": attr_value_pb2.AttrValue(
                type=factor.dtype.as_datatype_enum)}, "bessel_variance").outputs[0]
    return Synchronized(s.count, s.total, view.outputs[0], view.outputs[1], bessel)




def _key_attrs(keys: dict) -> dict:
    """A view's keys as the attributes its gradient reads back: strings and ints; `transport`, the
    name its gradient sum is registered under (graphsync/exchange/transports.py)."""
    return {Mark.key(name).value: marks.value(value if isinstance(value, str) else int(value))
            for name, value in keys.items()}


def sum_view(graph, site, total: tf.Tensor, local: tf.Tensor, **keys) -> tf.Tensor:
    """Tower `site`'s copy of a cross-tower sum `total` of the towers' `local` values, through an
    IdentityN whose gradient (`_sum_view_gradient`) hands `local` the towers' summed gradients at
    `total`, at run time; `keys` as for `view`."""
    attrs = {"T": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                 type=[t.dtype.as_datatype_enum for t in (total, local)])),
             "_gradient_op_type": attr_value_pb2.AttrValue(s=SUM_VIEW_GRADIENT.encode())}
    attrs.update(_key_attrs(keys))
    with pristine_scope(graph, site.device, site.op.name + "_sync"):
        return create_op(graph, "IdentityN", [total, local], attrs, "sum").outputs[0]


@tf.RegisterGradient(SUM_VIEW_GRADIENT)
def _sum_view_gradient(op, d_total, *_unused):
    """∂/∂local_t = Σ_s (gradient at tower s's copy of the total): the total is Σ_t local_t."""
    graph = op.graph
    with pristine_scope(graph, op.device, graph.get_name_scope()):
        d_total = tf.zeros_like(op.inputs[0]) if d_total is None else d_total
        return [None, summed_gradient(op, d_total, differentiation(op))]


def extremum_view(graph, site, extremum: tf.Tensor, x: tf.Tensor, ties: tf.Tensor, **keys) -> tf.Tensor:
    """Tower `site`'s copy of the extremum over every tower's `x` (kept dimensions), through an
    IdentityN whose gradient (`_extremum_view_gradient`) hands x the towers' summed gradients at
    the extremum, split among the `ties` elements of all towers equal to it; `keys` as for `view`."""
    inputs = [extremum, x, ties]
    attrs = {"T": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                 type=[t.dtype.as_datatype_enum for t in inputs])),
             "_gradient_op_type": attr_value_pb2.AttrValue(s=EXTREMUM_VIEW_GRADIENT.encode())}
    attrs.update(_key_attrs(keys))
    with pristine_scope(graph, site.device, site.op.name + "_sync"):
        return create_op(graph, "IdentityN", inputs, attrs, "extremum").outputs[0]


@tf.RegisterGradient(EXTREMUM_VIEW_GRADIENT)
def _extremum_view_gradient(op, d_extremum, *_unused):
    """∂/∂x = [x = extremum]·Σ_s g_s / ties, TensorFlow's gradient of Max and Min on the
    concatenated batch (the gradient shared among every tower's elements equal to it)."""
    graph = op.graph
    extremum, x, ties = op.inputs
    with pristine_scope(graph, op.device, graph.get_name_scope()):
        d_extremum = tf.zeros_like(extremum) if d_extremum is None else d_extremum
        summed = summed_gradient(op, d_extremum, differentiation(op))
        chosen = tf.cast(tf.equal(x, extremum), x.dtype)
        return [None, chosen * tf.math.divide_no_nan(summed, ties), None]


@tf.RegisterGradient(VIEW_GRADIENT)
def view_gradient(op, d_mean, d_variance, *_unused):
    """With D_μ, D_σ² the towers' summed gradients at μ and σ²:
    ∂/∂m_t = n_t/N·(D_μ + 2·(m_t − μ)·D_σ²),  ∂/∂M2_t = D_σ²/N  (Chan's merge differentiated;
    Σ n_s·(m_s − μ) = 0 drops the path through μ), M2_t = v_t·(n_t − 1) for a Bessel spread."""
    graph = op.graph
    mean, _, total, size, local_mean, _ = op.inputs
    k = differentiation(op)
    with pristine_scope(graph, op.device, graph.get_name_scope()):
        dtype = mean.dtype
        count = tf.cast(size, tf.float64) / tf.cast(tf.size(local_mean), tf.float64)
        d_mean = tf.zeros_like(mean) if d_mean is None else d_mean
        d_variance = tf.zeros_like(mean) if d_variance is None else d_variance
        summed = summed_gradient(op, tf.stack([d_mean, d_variance]), k)
        sum_mean, sum_variance = tf.unstack(summed)
        share = tf.cast(tf.math.divide_no_nan(count, total), dtype)
        d_local_mean = tf.math.multiply_no_nan(sum_mean + 2.0 * (local_mean - mean) * sum_variance, share)
        bessel = Spread(marks.text(op, Mark.SPREAD)) is Spread.BESSEL
        weight = tf.nn.relu(count - 1.0) if bessel else tf.sign(count)
        d_local_spread = sum_variance * tf.cast(tf.math.divide_no_nan(weight, total), dtype)
    return [None] * 4 + [d_local_mean, d_local_spread]


def summed_gradient(op, contribution, k):
    """Σ over the towers of the sync group of view `op` of their `contribution` to the gradient
    call `k` (the k-th differentiation, or any key that pairs the towers' calls), at run time,
    through the transport the view names (graphsync/exchange/transports.py)."""
    return transports.gradient_sum(op, contribution, k)


def gathered_sum(op, contribution, k, key, device: str, scope: str, members: int) -> tf.Tensor:
    """The towers' contributions summed in tower order, ((c0 + c1) + c2) + …, on `device` under
    `scope`, once per (key, k): each tower's gradient call fills in its place (`Mark.MEMBER`). A
    tower whose call never builds it leaves an error in its place (`_missing_tower`). A sum of two
    is one AddN; of more, a chain of adds, since an AddN of three or more adds in whichever order
    its inputs' buffers free up (fast_ops.FastOps.sum_in_order)."""
    graph = op.graph
    table = _gathered_gradients.setdefault(graph, {})
    if (key, k) not in table:
        table[(key, k)] = _slots(graph, contribution, device, scope, members)
    places, total = table[(key, k)]
    adder, index = places[marks.get(op, Mark.MEMBER)]
    update_input(adder, index, contribution)
    return total


def _slots(graph, contribution, device: str, scope: str, members: int) -> tuple:
    """([(op, input index) of each tower's place], the sum), every place holding `_missing_tower`."""
    dtype = attr_value_pb2.AttrValue(type=contribution.dtype.as_datatype_enum)
    with pristine_scope(graph, device, scope):
        missing = _missing_tower(contribution)
        if members <= 2:
            adder = create_op(graph, "AddN", [missing] * members,
                              {"T": dtype, "N": attr_value_pb2.AttrValue(i=members)}, "sum")
            return [(adder, i) for i in range(members)], adder.outputs[0]
        adder = create_op(graph, "AddV2", [missing, missing], {"T": dtype}, "sum")
        places = [(adder, 0), (adder, 1)]
        for _ in range(2, members):
            adder = create_op(graph, "AddV2", [adder.outputs[0], missing], {"T": dtype}, "sum")
            places.append((adder, 1))
    return places, adder.outputs[0]


def _missing_tower(like: tf.Tensor) -> tf.Tensor:
    """What a tower that never built this gradient contributes: an error at run time."""
    if like.shape.is_fully_defined():
        nan = tf.constant(np.full(like.shape.as_list(), np.nan), like.dtype)
    else:
        nan = tf.fill(tf.shape(like), tf.constant(np.nan, like.dtype))
    return tf.debugging.check_numerics(nan, MISSING_TOWER, name="missing_tower")


@tf.RegisterGradient(UPLOAD_GRADIENT)
def _upload_gradient(op, grad):
    """Identity's gradient: graphs rewritten before their gradients by earlier graphsync versions
    marked each tower's upload with it."""
    return grad
