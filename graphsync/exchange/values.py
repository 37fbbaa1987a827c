"""What the exchange strategies hand the splice: a tower's view of the global statistics."""
from __future__ import annotations

import dataclasses

import tensorflow as tf



@dataclasses.dataclass
class Synchronized:
    """One tower's view of the global statistics of its sync group, shaped like its uploads."""

    count: tf.Tensor      # n_t, float64
    total: tf.Tensor      # N, float64
    mean: tf.Tensor       # μ
    variance: tf.Tensor   # σ² (biased)
    bessel: tf.Tensor     # σ²·N/(N−1), what a fused op reports as its batch variance
