"""The arithmetic of synchronized batch norm (see shared/docs/syncbn-math.md), as graph ops.

Per tower t, on its own device:      n_t, m_t, M2_t = Σ (x − m_t)²          (two-pass)
On the aggregation device (float64): N = Σ n_t
                                     μ = Σ n_t·m_t / N
                                     σ² = (Σ M2_t + Σ n_t·(m_t − μ)²) / N   (Chan et al.)
Back on each tower:                  y = (x − μ)·γ·r + β,   r = 1/√(σ² + ε)

The synchronized backward, with a_t = Σ g_t and b_t = Σ g_t·x̂_t summed to A and B across towers:
                                     ∂L/∂x_t = γ·r·(g_t − A/N − x̂_t·B/N)

Statistics keep the reduced axes (shape [1, C, 1, 1] for NCHW), so one code path serves every
layout and `tf.nn.moments` over any axes. Counts come from run-time shapes: towers may hold
different batch sizes, even none. Each function only creates ops; the caller picks device and scope.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Layout:
    """The rank of an activation and the axes its statistics reduce over."""

    rank: int
    axes: tuple

    @classmethod
    def from_data_format(cls, rank: int, data_format: str) -> "Layout":
        channel_axis = 1 if data_format.startswith("NC") else rank - 1
        return cls(rank, tuple(a for a in range(rank) if a != channel_axis))

    def per_channel(self, vector: tf.Tensor) -> tf.Tensor:
        """A [C] vector (γ, β) shaped like the statistics: [C] → [1, C, 1, 1] for NCHW."""
        shape = [1] * self.rank
        shape[[a for a in range(self.rank) if a not in self.axes][0]] = -1
        return tf.reshape(vector, shape)


def as_float32(x: tf.Tensor) -> tf.Tensor:
    """Statistics are float32 for float16/bfloat16 activations, as in the fused kernel."""
    return x if x.dtype in (tf.float32, tf.float64) else tf.cast(x, tf.float32)


def local_moments(x: tf.Tensor, layout: Layout):
    """(n, m, M2) of one tower: elements per statistic (float64 scalar), mean, centred sum of
    squares. Empty batches give zeros, not NaN."""
    axes = list(layout.axes)
    shape = tf.shape(x, out_type=tf.int64)
    count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), tf.float64, name="count")
    mean = tf.math.divide_no_nan(tf.reduce_sum(x, axes, keepdims=True), tf.cast(count, x.dtype), name="mean")
    centred = tf.math.squared_difference(x, tf.stop_gradient(mean))
    m2 = tf.reduce_sum(centred, axes, keepdims=True, name="m2")
    return count, mean, m2


def merge_moments(counts, means, m2s):
    """Global (N, μ, σ² biased) from every tower's (n, m, M2), in float64; μ and σ² are returned in
    the towers' dtype."""
    dtype = means[0].dtype
    rank = means[0].shape.rank
    n = tf.reshape(tf.stack(counts), [-1] + [1] * rank)
    m = tf.cast(tf.stack(means), tf.float64)
    total = tf.reduce_sum(counts, name="count")
    mean = tf.math.divide_no_nan(tf.reduce_sum(n * m, 0), total)
    spread = tf.reduce_sum(tf.cast(tf.stack(m2s), tf.float64), 0) + \
        tf.reduce_sum(n * tf.math.squared_difference(m, mean), 0)
    variance = tf.math.divide_no_nan(spread, total)
    return total, tf.cast(mean, dtype, name="mean"), tf.cast(variance, dtype, name="variance")


def bessel(variance: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
    """σ²·N/(N−1), with the fused kernel's guard N−1 → max(N−1, 1)."""
    factor = total / tf.maximum(total - 1.0, 1.0)
    return tf.multiply(variance, tf.cast(factor, variance.dtype), name="bessel_variance")


def share(total_sum: tf.Tensor, count: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
    """n_t/N of a cross-tower sum: what a local mean's gradient must receive so that it hands
    Σ_s g_s / N to its tower."""
    return total_sum * tf.cast(tf.math.divide_no_nan(count, total), total_sum.dtype)


def normalize(x, mean, variance, scale, offset, epsilon, layout: Layout):
    """y = (x − μ)·γ·r + β in x's (float32/64) dtype; returns (y, r)."""
    inv_std = tf.math.rsqrt(variance + tf.cast(epsilon, variance.dtype), name="inv_std")
    gain = layout.per_channel(tf.cast(scale, x.dtype)) * inv_std
    y = (x - mean) * gain + layout.per_channel(tf.cast(offset, x.dtype))
    return y, inv_std


def local_grad_sums(dy, x, mean, inv_std, layout: Layout):
    """(a_t, b_t) = (Σ g, Σ g·x̂) of one tower, and its centred activation x − μ."""
    axes = list(layout.axes)
    centred = x - mean
    sum_dy = tf.reduce_sum(dy, axes, keepdims=True, name="sum_dy")
    sum_dy_xhat = tf.multiply(tf.reduce_sum(dy * centred, axes, keepdims=True), inv_std, name="sum_dy_xhat")
    return sum_dy, sum_dy_xhat, centred


def input_grad(dy, centred, scale, inv_std, sum_dy, sum_dy_xhat, total, layout: Layout):
    """∂L/∂x_t = γ·r·(g − A/N − (x−μ)·r·B/N) from the global sums A = Σ a, B = Σ b."""
    n = tf.cast(total, dy.dtype)
    gain = layout.per_channel(tf.cast(scale, dy.dtype)) * inv_std
    shift = gain * sum_dy / n
    slope = gain * inv_std * sum_dy_xhat / n
    return dy * gain - (centred * slope + shift)
