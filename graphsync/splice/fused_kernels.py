"""The fused batch-norm layer rebuilt from TensorFlow's own fused kernels, a few ops per tower.

Python op creation costs ~0.3 ms per op, so a rewrite that spelled the arithmetic out op by op
would take longer than building the model. TensorFlow's fused kernels already compute what each
tower needs, for every layout and dtype the original op accepted:

    kernel moments    FusedBatchNormV3(x, 1, 0, is_training=True) → m̂_t, n_t/(n_t−1)·v_t, and
                        Σy = Σ(x − m̂_t)/s, the residual that makes the merge exact (float32)
    normalization     FusedBatchNormV3(x, γ, β, μ, σ², is_training=False) = (x − μ)·γ·r + β
    local grad sums   FusedBatchNormGradV3(g, x, γ, μ, σ², is_training=False)
                        → γ·r·g, Σ g·x̂ (b_t), Σ g (a_t)
    correction        FusedBatchNormV3(x, −γ·r·B/N, −γ·r·A/N, μ, σ², is_training=False)
                        = −γ·r·(x̂·B + A)/N,   so   ∂L/∂x_t = γ·r·g + correction

TensorFlow's gradient of an inference-mode fused op ignores the statistics, and of a training-mode
one ignores gradients arriving at its mean and variance; both are wrong once the statistics come
from every tower. The two ops therefore carry graphsync's own gradients, used when gradients are
built after the rewrite.
"""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync import stats
from graphsync.exchange import library
from graphsync.graph import ref_races
from graphsync.graph.fast_ops import FastOps
from graphsync.graph.tf_private import create_op, pristine_scope
from graphsync.match.fused import LOCAL_MOMENTS_GRADIENT   # also how the analysis knows graphsync's own kernel

NORMALIZE_GRADIENT = "GraphsyncFusedNormalize"
FORWARD_READ_GRADIENT = "GraphsyncForwardRead"


def _attrs(x, epsilon, data_format, is_training, gradient=None, forward=True):
    attrs = {"T": attr_value_pb2.AttrValue(type=x.dtype.as_datatype_enum),
             "U": attr_value_pb2.AttrValue(type=tf.float32.as_datatype_enum),
             "epsilon": attr_value_pb2.AttrValue(f=epsilon),
             "data_format": attr_value_pb2.AttrValue(s=data_format.encode()),
             "is_training": attr_value_pb2.AttrValue(b=is_training)}
    if forward:
        attrs["exponential_avg_factor"] = attr_value_pb2.AttrValue(f=1.0)
    if gradient:
        attrs["_gradient_op_type"] = attr_value_pb2.AttrValue(s=gradient.encode())
    return attrs


def kernel_moments(graph, op: tf.Operation, ops):
    """One tower's (size of x as int64, mean, Bessel-corrected variance, residual) from the kernel,
    by the original op's inputs (its mean/variance inputs are ignored in training mode, factor 1).

    The kernel's float32 mean m̂ is off by ~1e-7·|μ|; Chan's merge takes Σ(x − m̂) as 0, so that
    error enters the merged variance linearly (3e-4 at |μ|/σ = 1e4). The kernel runs with γ = 1,
    β = 0, so its otherwise unused output is y = (x − m̂)/s, s = √(v + ε): residual = Σy (one
    reduction, the only extra work) gives Σ(x − m̂) = s·Σy exactly enough, and the merge corrects
    m and M2 in float64 (stats.merge_moments). Other dtypes upload no residual (None).
    Σy is identically 0 as a function of x, so its gradient is 0 and the local-moments gradient
    rightly ignores what arrives at y.
    """
    x = op.inputs[0]
    channels = op.inputs[1].shape.num_elements()
    refine = stats.REFINE_LOCAL_MOMENTS and x.dtype == tf.float32 and channels is not None
    if x.shape.rank and x.shape[0] == 0 and channels is not None:
        # a tower traced with no examples (a replica's share of a partial last batch): it adds
        # nothing, and the kernel is not run (oneDNN's fails on an empty convolution's output)
        zeros = ops.constant(0.0, tf.float32, [channels])
        return ops.constant(0, tf.int64), zeros, zeros, zeros if refine else None
    scale, offset = (ops.constant(1.0, tf.float32, [channels]), ops.constant(0.0, tf.float32, [channels])) \
        if refine else (op.inputs[1], op.inputs[2])
    data_format = op.get_attr("data_format").decode()
    kernel = create_op(graph, "FusedBatchNormV3", [x, scale, offset, op.inputs[3], op.inputs[4]],
                      _attrs(x, op.get_attr("epsilon"), data_format, True, LOCAL_MOMENTS_GRADIENT),
                      "local_moments")
    size = create_op(graph, "Size", [x], {"T": attr_value_pb2.AttrValue(type=x.dtype.as_datatype_enum),
                                          "out_type": attr_value_pb2.AttrValue(type=tf.int64.as_datatype_enum)},
                     "size")
    residual = None
    if refine:
        rank = x.shape.rank
        channel_axis = 1 if data_format.startswith("NC") else rank - 1
        residual = ops.sum(kernel.outputs[0], [a for a in range(rank) if a != channel_axis], name="residual")
    return size.outputs[0], kernel.outputs[1], kernel.outputs[2], residual


def normalize(graph, x, scale, offset, mean, variance, epsilon, data_format, gradient=NORMALIZE_GRADIENT,
              marks: dict | None = None):
    """(x − μ)·γ/√(σ² + ε) + β in x's dtype, differentiated by the gradient registered as `gradient`;
    `marks`: more attributes for the op (graphsync/splice/marks.py)."""
    return create_op(graph, "FusedBatchNormV3", [x, scale, offset, mean, variance],
                     {**_attrs(x, epsilon, data_format, False, gradient), **(marks or {})}, "y").outputs[0]


def grad_sums(dy, x, scale, mean, variance, epsilon, data_format):
    """(γ·r·g, b_t = Σ g·x̂, a_t = Σ g) of one tower.

    TensorFlow's CPU kernel of the inference-mode gradient takes channels-last tensors only, unless
    oneDNN replaces it ("… with is_training=False only support NHWC tensor format"): off a GPU, a
    channels-first layer's tensors are transposed to channels-last around it."""
    if data_format.startswith("NC") and "GPU" not in (x.device or dy.device or "").upper():
        rank = x.shape.rank
        to_last, to_first = [0] + list(range(2, rank)) + [1], [0, rank - 1] + list(range(1, rank - 1))
        last_format = "N" + data_format[2:] + "C"
        dx, sum_dy_xhat, sum_dy = grad_sums(tf.transpose(dy, to_last), tf.transpose(x, to_last), scale, mean,
                                            variance, epsilon, last_format)
        return tf.transpose(dx, to_first), sum_dy_xhat, sum_dy
    return create_op(dy.graph, "FusedBatchNormGradV3", [dy, x, scale, mean, variance, mean],
                     _attrs(x, epsilon, data_format, False, forward=False), "grad_sums").outputs[:3]


def correction_coefficients(ops, scale, variance, epsilon, sum_dy, sum_dy_xhat, total):
    """(−γ·r·B/N, −γ·r·A/N): the scale and offset under which the inference kernel computes the
    cross-tower part of ∂L/∂x. `ops` is a fast_ops.FastOps. One call op (graphsync/exchange/library.py)
    where spelled out they are eight, once per layer or tower; one trace serves every layer."""
    inputs = [scale, variance, ops.constant(float(epsilon), variance.dtype), sum_dy, sum_dy_xhat, total]
    body = library.traced(_coefficients, (), library.rank_specs(inputs))
    coefficients = ops.call(body, inputs, "coefficients")
    for t in coefficients:
        t.set_shape(scale.shape)
    return coefficients


def _coefficients():
    def coefficients(scale, variance, epsilon, sum_dy, sum_dy_xhat, total):
        ops = FastOps(tf.compat.v1.get_default_graph())
        inv_std = ops.unary("Rsqrt", ops.binary("AddV2", variance, epsilon))
        gain = ops.binary("RealDiv", ops.unary("Neg", ops.binary("Mul", scale, inv_std)), ops.cast(total, scale.dtype))
        return ops.binary("Mul", gain, sum_dy_xhat), ops.binary("Mul", gain, sum_dy)
    return coefficients


def input_grad(dx_local, x, mean, variance, epsilon, data_format, coefficients):
    """∂L/∂x_t = γ·r·g − γ·r·(x̂·B + A)/N from γ·r·g and the correction's coefficients."""
    correction = create_op(x.graph, "FusedBatchNormV3", [x, coefficients[0], coefficients[1], mean, variance],
                           _attrs(x, epsilon, data_format, False, NORMALIZE_GRADIENT), "correction").outputs[0]
    return create_op(x.graph, "AddV2", [dx_local, correction],
                     {"T": attr_value_pb2.AttrValue(type=x.dtype.as_datatype_enum)}, "dx").outputs[0]


def forward_read(graph, scale: tf.Tensor, device: str, name_scope: str) -> tf.Tensor:
    """γ as the forward pass read it, for every op of the layer that needs it, forward and backward.

    A TF1 variable (`VariableV2`, ref dtype) is read through an `Identity` that aliases its buffer,
    and the optimizer updates that buffer in place. TensorFlow's own fused gradient reads γ in the
    op that also yields ∂L/∂γ, so the update waits for it; graphsync's backward reads γ again after
    the cross-tower sums, which nothing orders before the update (between processes a step's
    ∂L/∂γ often arrives first, and ∂L/∂x then used the new γ). So a γ that aliases a variable is
    copied once per tower by a `Snapshot` that the forward normalization reads, hence before any
    gradient exists (on `device`, under `name_scope`). A resource variable's read is already a
    snapshot (its updates copy on write): nothing is added."""
    if not ref_races.aliases_a_variable(scale):
        return scale
    attrs = {"T": attr_value_pb2.AttrValue(type=scale.dtype.as_datatype_enum),
             "_gradient_op_type": attr_value_pb2.AttrValue(s=FORWARD_READ_GRADIENT.encode())}
    with pristine_scope(graph, device, name_scope):
        return create_op(graph, "Snapshot", [scale], attrs, "scale").outputs[0]


@tf.RegisterGradient(FORWARD_READ_GRADIENT)
def _forward_read_gradient(_op, grad):
    """A copy passes its gradient on unchanged (TensorFlow registers none for Snapshot)."""
    return grad


def shared_variable(tensors) -> bool:
    """Whether every tower reads the same variable here (the usual shared-variable towers), so
    per-channel arithmetic on it can run once per layer instead of once per tower."""
    def source(t):
        while t.op.type in ("Identity", "ReadVariableOp"):
            t = t.op.inputs[0]
        return t
    first = source(tensors[0])
    return first.op.type in ("VarHandleOp", "VariableV2", "Variable") and all(source(t) is first for t in tensors[1:])


def _channel_shape(op, vector):
    """[C] → broadcastable against x (NC… formats put channels at axis 1)."""
    rank = op.inputs[0].shape.rank
    if not op.get_attr("data_format").decode().startswith("NC"):
        return vector
    return tf.reshape(vector, [1, -1] + [1] * (rank - 2))


@tf.RegisterGradient(LOCAL_MOMENTS_GRADIENT)
def _local_moments_gradient(op, _dy, d_mean, d_variance, *_reserve):
    """Gradient of (m_t, v_t·n/(n−1)) with respect to x: d_m/n + d_v·2(x − m)/max(n − 1, 1)."""
    x = op.inputs[0]
    x32 = tf.cast(x, tf.float32)
    n = tf.cast(tf.size(x), tf.float32) / tf.cast(tf.size(op.outputs[1]), tf.float32)
    d_mean = tf.zeros_like(op.outputs[1]) if d_mean is None else d_mean
    d_variance = tf.zeros_like(op.outputs[2]) if d_variance is None else d_variance
    centred = x32 - _channel_shape(op, op.outputs[1])
    dx = _channel_shape(op, d_mean / n) + centred * _channel_shape(op, 2.0 * d_variance / tf.maximum(n - 1.0, 1.0))
    return [tf.cast(dx, x.dtype), None, None, None, None]


@tf.RegisterGradient(NORMALIZE_GRADIENT)
def _normalize_gradient(op, dy, *_unused):
    """Gradient of y = (x − μ)·γ·r + β with respect to x, γ, β and also μ, σ²:
    ∂/∂μ = −γ·r·Σg,  ∂/∂σ² = −½·γ·r²·Σ g·x̂."""
    x, scale, _, mean, variance = op.inputs
    epsilon, data_format = op.get_attr("epsilon"), op.get_attr("data_format").decode()
    dx, d_scale, d_offset = grad_sums(dy, x, scale, mean, variance, epsilon, data_format)
    inv_std = tf.math.rsqrt(variance + epsilon)
    d_mean = -scale * inv_std * d_offset
    d_variance = -0.5 * scale * tf.square(inv_std) * d_scale
    return [dx, d_scale, d_offset, d_mean, d_variance]
