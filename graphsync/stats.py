"""The arithmetic of synchronized moments (see shared/docs/syncbn-math.md), as graph ops.

Per tower t, on its own device:      n_t, m_t, M2_t = Σ (x − m_t)²          (two-pass)
On the aggregation device (float64): N = Σ n_t
                                     μ = Σ n_t·m_t / N
                                     σ² = (Σ M2_t + Σ n_t·(m_t − μ)²) / N   (Chan et al.)

Fused layers get (m_t, n_t/(n_t−1)·v_t) from TensorFlow's kernel (graphsync/fused.py); moments
subgraphs get them from `local_moments`, whose statistics keep the reduced axes, so any
`tf.nn.moments` axes work. Counts come from run-time shapes: towers may hold different batch
sizes, even none. Each function only creates ops; the caller picks device and scope.
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


def local_moments(x: tf.Tensor, layout: Layout):
    """(size of x, m, M2) of one tower: mean and centred sum of squares per statistic. Empty
    batches give zeros, not NaN."""
    axes = list(layout.axes)
    size = tf.size(x, out_type=tf.int64)
    sum_x = tf.reduce_sum(x, axes, keepdims=True)
    count = tf.cast(size, x.dtype) / tf.cast(tf.size(sum_x), x.dtype)
    mean = tf.math.divide_no_nan(sum_x, count, name="mean")
    centred = tf.math.squared_difference(x, tf.stop_gradient(mean))
    m2 = tf.reduce_sum(centred, axes, keepdims=True, name="m2")
    return size, mean, m2


def merge_moments(sizes, means, spreads, spread: str = "m2"):
    """Global (n per tower, N, μ, σ² biased, σ²·N/(N−1)) from every tower's (size, m, spread), in
    float64, the spread being M2 or the Bessel-corrected variance (what the fused kernel reports).
    μ and the variances come back in the towers' dtype; n_t = size_t / (number of statistics)."""
    dtype = means[0].dtype
    rank = means[0].shape.rank
    per_statistic = tf.cast(tf.size(means[0]), tf.float64)
    counts = tf.cast(tf.stack(sizes), tf.float64) / per_statistic
    n = tf.reshape(counts, [-1] + [1] * rank)
    present = n > 0    # an empty tower's kernel statistics are NaN: it contributes nothing
    m = tf.where(present, tf.cast(tf.stack(means), tf.float64), 0.0)
    m2 = tf.where(present, tf.cast(tf.stack(spreads), tf.float64), 0.0)
    if spread == "bessel":
        m2 = m2 * tf.maximum(n - 1.0, 1.0)
    total = tf.reduce_sum(counts, name="count")
    mean = tf.math.divide_no_nan(tf.reduce_sum(n * m, 0), total)
    spread_sum = tf.reduce_sum(m2, 0) + tf.reduce_sum(n * tf.math.squared_difference(m, mean), 0)
    variance = tf.math.divide_no_nan(spread_sum, total)
    unbiased = spread_sum / tf.maximum(total - 1.0, 1.0)
    return (tf.unstack(counts), total, tf.cast(mean, dtype, name="mean"), tf.cast(variance, dtype, name="variance"),
            tf.cast(unbiased, dtype, name="bessel_variance"))


def share(total_sum: tf.Tensor, count: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
    """n_t/N of a cross-tower sum: what a local mean's gradient must receive so that it hands
    Σ_s g_s / N to its tower."""
    return total_sum * tf.cast(tf.math.divide_no_nan(count, total), total_sum.dtype)


