"""The arithmetic of synchronized moments (the math: docs/how-it-works.md), as graph ops.

Per tower t, on its own device:      n_t, m_t, M2_t = Σ (x − m_t)²          (two-pass)
On the aggregation device (float64): N = Σ n_t
                                     μ = Σ n_t·m_t / N
                                     σ² = (Σ M2_t + Σ n_t·(m_t − μ)²) / N   (Chan et al.)

Fused layers get (m_t, n_t/(n_t−1)·v_t) from TensorFlow's kernel (graphsync/splice/fused_kernels.py); moments
subgraphs get them from `local_moments`, whose statistics keep the reduced axes, so any
`tf.nn.moments` axes work. Float32 towers of either kind also upload a residual that makes their
float32 mean exact enough for the merge (`refine_moments`). Counts come from run-time shapes:
towers may hold different batch sizes, even none. Each function only creates ops; the caller picks
device and scope.
"""
from __future__ import annotations

import dataclasses
import enum

import tensorflow as tf

# False: upload float32 statistics without their residual (benchmarks/step_overhead.py prices the
# residual by building one variant so; both graphsync/splice/fused_kernels.py and local_moments below read it).
REFINE_LOCAL_MOMENTS = True


class Spread(enum.StrEnum):
    """What a tower uploads beside its size and mean for the merge to weigh; its value is the
    statistics view's mark (Mark.SPREAD), read back when gradients are built later."""

    M2 = "m2"           # Σ(x − m)², from `local_moments`
    BESSEL = "bessel"   # the Bessel-corrected variance M2/(n − 1) the fused kernel reports


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
    """(size of x, m, M2, residual) of one tower: mean and centred sum of squares per statistic.
    Empty batches give zeros, not NaN.

    The float32 mean m̂ is off by ~1e-7·|μ| (its sum rounds at the scale of n·|μ|), and Chan's merge
    takes Σ(x − m̂) as 0, so that error entered the merged variance linearly (7.4e-5 at |μ|/σ = 1e4).
    Float32 towers therefore also return residual = Σ(x − m̂), the deviations' own sum, which is
    accurate: the merge corrects m and M2 with it in float64 (`refine_moments`). Other dtypes return
    None. The residual is identically 0 as a function of x, so nothing differentiates it."""
    axes = list(layout.axes)
    size = tf.size(x, out_type=tf.int64)
    sum_x = tf.reduce_sum(x, axes, keepdims=True)
    count = tf.cast(size, x.dtype) / tf.cast(tf.size(sum_x), x.dtype)
    mean = tf.math.divide_no_nan(sum_x, count, name="mean")
    if not (REFINE_LOCAL_MOMENTS and x.dtype == tf.float32):
        centred = tf.math.squared_difference(x, tf.stop_gradient(mean))
        return size, mean, tf.reduce_sum(centred, axes, keepdims=True, name="m2"), None
    deviation = tf.math.subtract(x, tf.stop_gradient(mean), name="deviation")
    m2 = tf.reduce_sum(tf.math.square(deviation), axes, keepdims=True, name="m2")
    return size, mean, m2, tf.reduce_sum(deviation, axes, keepdims=True, name="residual")


def weighted_local_moments(x: tf.Tensor, weights: tf.Tensor, layout: Layout):
    """`local_moments` with frequency weights w that broadcast over x and are the same for every
    statistic (per example or per pixel, as tf.nn.weighted_moments takes them): W = Σw (every
    statistic's), m = Σw·x / W, M2 = Σw·(x − m)², float32 towers with residual Σw·(x − m̂). The
    size returned is W times the number of statistics, in float64, so that the merge and the
    exchange weigh the tower by W where they weigh others by their count. No weight: zeros."""
    axes = list(layout.axes)
    summed = tf.reduce_sum(weights + tf.zeros_like(x), axes, keepdims=True)
    mean = tf.math.divide_no_nan(tf.reduce_sum(weights * x, axes, keepdims=True), summed, name="mean")
    size = tf.cast(tf.reshape(summed, [-1])[0], tf.float64) * tf.cast(tf.size(summed), tf.float64)
    deviation = tf.math.subtract(x, tf.stop_gradient(mean), name="deviation")
    m2 = tf.reduce_sum(weights * tf.math.square(deviation), axes, keepdims=True, name="m2")
    if not (REFINE_LOCAL_MOMENTS and x.dtype == tf.float32):
        return size, mean, m2, None
    return size, mean, m2, tf.reduce_sum(weights * deviation, axes, keepdims=True, name="residual")


def merge_moments(ops, sizes, means, spreads, residuals=None, spread: Spread = Spread.M2, epsilon=None,
                  per_statistic=None):
    """Global (n per tower, N, μ, σ² biased, σ²·N/(N−1)) from every tower's (size, m, spread), in
    float64, the spread being M2 or the Bessel-corrected variance (what the fused kernel reports).
    μ and the variances come back in the towers' dtype; n_t = size_t / (number of statistics).
    Products with n use MulNoNan: an empty tower's NaN statistics then weigh nothing (an M2 spread
    is weighed by sign(n): 0 for an empty tower, 1 else, also for weights W < 1). `ops` is a
    fast_ops.FastOps (this runs once per layer, so op creation cost matters).

    `residuals` (float32 towers): each tower's Σ(x − m̂) (moments subgraphs, `local_moments`; no
    `epsilon`) or, with the layer's `epsilon`, Σy, y = (x − m̂)/s the fused kernel's normalized
    output with γ = 1, β = 0 and s² = v + ε (graphsync.splice.fused_kernels.kernel_moments), so Σ(x − m̂) = s·Σy.
    With d = Σ(x − m̂)/n the tower's true mean is m̂ + d and its M2 is Σ(x − m̂)² − n·d², corrected
    here in float64 for all towers at once: the float32 m̂ alone would put ~1e-7·|μ| per tower into
    Chan's between-tower term.

    `per_statistic` (a float64 scalar tensor; default: read from the means' shape) is the number of
    statistics each size counts; it and `epsilon` may be tensors (graphsync/exchange/gather.py
    traces this merge once, for every layer).
    """
    f64, dtype = tf.float64, means[0].dtype
    if per_statistic is None:
        per_statistic = means[0].shape.num_elements() or ops.cast(tf.size(means[0]), f64)
    counts = ops.binary("RealDiv", ops.cast(ops.stack(sizes), f64), float(per_statistic)
                        if isinstance(per_statistic, int) else per_statistic)
    n = ops.reshape(counts, [-1] + [1] * means[0].shape.rank)
    m = ops.cast(ops.stack(means), f64)
    m2 = ops.cast(ops.stack(spreads), f64)
    if spread is Spread.BESSEL:   # v·(n−1) = M2
        m2 = ops.binary("MulNoNan", m2, ops.unary("Relu", ops.binary("Sub", n, 1.0)))
    else:
        m2 = ops.binary("MulNoNan", m2, ops.unary("Sign", n))
    if residuals is not None and all(r is not None for r in residuals):
        m, m2 = refine_moments(ops, n, m, m2, ops.cast(ops.stack(residuals), f64), epsilon)
    total = ops.sum(counts, 0, name="count")
    mean = ops.binary("RealDiv", ops.sum(ops.binary("MulNoNan", m, n), 0), total)
    deviation = ops.binary("MulNoNan", ops.binary("SquaredDifference", m, mean), n)
    spread_sum = ops.sum(ops.binary("AddV2", m2, deviation), 0)
    unbiased = ops.binary("RealDiv", spread_sum, ops.binary("Maximum", ops.binary("Sub", total, 1.0), 1.0))
    return (ops.unstack(counts, len(sizes)), total, ops.cast(mean, dtype, name="mean"),
            ops.cast(ops.binary("RealDiv", spread_sum, total), dtype, name="variance"),
            ops.cast(unbiased, dtype, name="bessel_variance"))


def refine_moments(ops, n, m, m2, residual, epsilon=None):
    """A float32 tower's (m, M2) made exact in float64 from its residual (see merge_moments): with
    d = Σ(x − m̂)/n — the residual over n, or with `epsilon` s·Σy/n, s = √(M2/n + ε) the fused
    kernel's scale — the true mean is m̂ + d and the true M2 is Σ(x − m̂)² − n·d². All float64,
    broadcasting like n·m."""
    if epsilon is not None:
        epsilon = epsilon if isinstance(epsilon, tf.Tensor) else float(epsilon)
        scale = ops.unary("Sqrt", ops.binary("AddV2", ops.binary("DivNoNan", m2, n), epsilon))
        residual = ops.binary("MulNoNan", scale, residual)
    shift = ops.binary("DivNoNan", residual, n)
    return (ops.binary("AddV2", m, shift),
            ops.binary("Sub", m2, ops.binary("MulNoNan", ops.unary("Square", shift), n)))


def share(total_sum: tf.Tensor, count: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
    """n_t/N of a cross-tower sum: what a local mean's gradient must receive so that it hands
    Σ_s g_s / N to its tower."""
    return total_sum * tf.cast(tf.math.divide_no_nan(count, total), total_sum.dtype)


