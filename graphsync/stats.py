"""The arithmetic of synchronized batch norm (see shared/docs/syncbn-math.md), as graph ops.

Per tower t, on its own device:      n_t, m_t, M2_t = Σ (x − m_t)²          (two-pass, float32)
On the aggregation device (float64): N = Σ n_t
                                     μ = Σ n_t·m_t / N
                                     σ² = (Σ M2_t + Σ n_t·(m_t − μ)²) / N   (Chan et al.)
Back on each tower:                  y = (x − μ)·γ·r + β,   r = 1/√(σ² + ε)

The synchronized backward, with a_t = Σ g_t and b_t = Σ g_t·x̂_t summed to A and B across towers:
                                     ∂L/∂x_t = γ·r·(g_t − A/N − x̂_t·B/N)

Counts come from run-time shapes, so towers may hold different batch sizes (even zero).
Each function only creates ops; the caller chooses their device and scope.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the channels of an activation are: rank and channel axis."""

    rank: int
    channel_axis: int

    @classmethod
    def from_data_format(cls, rank: int, data_format: str) -> "Layout":
        return cls(rank, 1 if data_format.startswith("NC") else rank - 1)

    @property
    def reduction_axes(self) -> list[int]:
        return [a for a in range(self.rank) if a != self.channel_axis]

    def per_channel(self, vector: tf.Tensor) -> tf.Tensor:
        """`vector` of shape [C], shaped to broadcast against the activation."""
        if self.channel_axis == self.rank - 1:
            return vector
        shape = [1] * self.rank
        shape[self.channel_axis] = -1
        return tf.reshape(vector, shape)


def as_float32(x: tf.Tensor) -> tf.Tensor:
    """Statistics are float32 for float16/bfloat16 activations, as in the fused kernel."""
    return x if x.dtype in (tf.float32, tf.float64) else tf.cast(x, tf.float32)


def local_moments(x: tf.Tensor, layout: Layout):
    """(n, m, M2) of one tower: element count per channel (float64 scalar), mean, centred sum of
    squares. x is float32 or float64; empty batches give zeros, not NaN."""
    axes = layout.reduction_axes
    shape = tf.shape(x, out_type=tf.int64)
    count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), tf.float64, name="count")
    mean = tf.math.divide_no_nan(tf.reduce_sum(x, axes), tf.cast(count, x.dtype), name="mean")
    centred = tf.math.squared_difference(x, tf.stop_gradient(layout.per_channel(mean)))
    m2 = tf.reduce_sum(centred, axes, name="m2")
    return count, mean, m2


def merge_moments(counts, means, m2s):
    """Global (N, μ, σ² biased) from every tower's (n, m, M2), in float64; μ and σ² are returned in
    the towers' dtype."""
    dtype = means[0].dtype
    n = tf.stack(counts)[:, None]
    m = tf.cast(tf.stack(means), tf.float64)
    total = tf.reduce_sum(n, name="count")
    mean = tf.math.divide_no_nan(tf.reduce_sum(n * m, 0), total)
    spread = tf.reduce_sum(tf.cast(tf.stack(m2s), tf.float64), 0) + \
        tf.reduce_sum(n * tf.math.squared_difference(m, mean), 0)
    variance = tf.math.divide_no_nan(spread, total)
    return total, tf.cast(mean, dtype, name="mean"), tf.cast(variance, dtype, name="variance")


def bessel(variance: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
    """σ²·N/(N−1), with the fused kernel's guard N−1 → max(N−1, 1)."""
    factor = total / tf.maximum(total - 1.0, 1.0)
    return tf.multiply(variance, tf.cast(factor, variance.dtype), name="bessel_variance")


def normalize(x, mean, variance, scale, offset, epsilon, layout: Layout):
    """y = (x − μ)·γ·r + β, computed in x's (float32/64) dtype; returns (y, r)."""
    inv_std = tf.math.rsqrt(variance + tf.cast(epsilon, variance.dtype), name="inv_std")
    gain = tf.cast(scale, x.dtype) * inv_std
    centred = x - layout.per_channel(mean)
    y = centred * layout.per_channel(gain) + layout.per_channel(tf.cast(offset, x.dtype))
    return y, inv_std


def local_grad_sums(dy, x, mean, inv_std, layout: Layout):
    """(a_t, b_t) = (Σ g, Σ g·x̂) of one tower, and its centred activation x − μ."""
    axes = layout.reduction_axes
    centred = x - layout.per_channel(mean)
    grad_offset = tf.reduce_sum(dy, axes, name="sum_dy")
    grad_scale = tf.multiply(tf.reduce_sum(dy * centred, axes), inv_std, name="sum_dy_xhat")
    return grad_offset, grad_scale, centred


def input_grad(dy, centred, scale, inv_std, sum_dy, sum_dy_xhat, total, layout: Layout):
    """∂L/∂x_t = γ·r·(g − A/N − (x−μ)·r·B/N) from the global sums A = Σ a, B = Σ b."""
    n = tf.cast(total, dy.dtype)
    gain = tf.cast(scale, dy.dtype) * inv_std
    shift = gain * sum_dy / n
    slope = gain * inv_std * sum_dy_xhat / n
    return dy * layout.per_channel(gain) - (centred * layout.per_channel(slope) + layout.per_channel(shift))
