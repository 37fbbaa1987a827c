"""Batch norm with its statistics written by hand, in the spellings real TF1 code uses, each
`model(x) -> (output, update_ops)` with its moving averages (tests/test_handwritten.py)."""
from __future__ import annotations

import functools

import tensorflow as tf

import models

tf1 = tf.compat.v1
EPSILON = 1e-3
DECAY = 0.9


def _affine(name, channels, dtype):
    with tf1.variable_scope(name):
        gamma = tf1.get_variable("gamma", [channels], dtype, tf1.random_uniform_initializer(0.5, 1.5, seed=3))
        beta = tf1.get_variable("beta", [channels], dtype, tf1.random_uniform_initializer(-0.5, 0.5, seed=4))
        moving_mean = tf1.get_variable("moving_mean", [channels], dtype, tf1.zeros_initializer(), trainable=False)
        moving_var = tf1.get_variable("moving_variance", [channels], dtype, tf1.ones_initializer(), trainable=False)
    return gamma, beta, moving_mean, moving_var


def _assign(moving, value):
    """tf.compat.v1.assign(moving, decay·moving + (1 − decay)·value)."""
    return tf1.assign(moving, DECAY * moving + (1 - DECAY) * tf.reshape(value, [-1]))


def _sub_square(x, name):
    """The issue's CIFAR10 spelling: reduce_mean, Square(x − m), normalization by hand."""
    gamma, beta, mm, mv = _affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    mean = tf.reduce_mean(x, axes)
    variance = tf.reduce_mean(tf.square(x - mean), axes)
    y = (x - mean) * tf.math.rsqrt(variance + EPSILON) * gamma + beta
    return y, [_assign(mm, mean), _assign(mv, variance)]


def _sqdiff_keepdims(x, name):
    """keep_dims, SquaredDifference without StopGradient, tf.nn.batch_normalization,
    assign_moving_average."""
    from tensorflow.python.training import moving_averages
    gamma, beta, mm, mv = _affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    mean = tf.reduce_mean(x, axes, keepdims=True)
    variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axes, keepdims=True)
    y = tf.nn.batch_normalization(x, mean, variance, beta, gamma, EPSILON)
    updates = [moving_averages.assign_moving_average(mm, tf.reshape(mean, [-1]), DECAY, zero_debias=False),
               moving_averages.assign_moving_average(mv, tf.reshape(variance, [-1]), DECAY, zero_debias=False)]
    return y, updates


def _sum_count_dd(x, name):
    """Sum / count for the mean, Mul(d, d) for the variance, d shared with the normalization,
    ExponentialMovingAverage on the statistics."""
    gamma, beta, mm, mv = _affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    count = tf.cast(tf.shape(x)[0], x.dtype)
    for a in axes[1:]:
        count *= x.shape[a]
    mean = tf.reduce_sum(x, axes) / count
    d = x - mean
    variance = tf.reduce_mean(d * d, axes)
    y = d * (gamma * tf.math.rsqrt(variance + EPSILON)) + beta
    ema = tf1.train.ExponentialMovingAverage(DECAY, zero_debias=False)
    average = ema.apply([mean, variance])
    with tf.control_dependencies([average]):
        updates = [tf1.assign(mm, ema.average(mean)), tf1.assign(mv, ema.average(variance))]
    return y, updates


def _second_moment(x, name):
    """E[x²] − m², tf.nn.batch_normalization."""
    gamma, beta, mm, mv = _affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    mean = tf.reduce_mean(x, axes)
    variance = tf.reduce_mean(tf.square(x), axes) - tf.square(mean)
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, EPSILON), [_assign(mm, mean), _assign(mv, variance)]


def _stopped_sub(x, name):
    """Square(x − StopGradient(m)) over a keep_dims mean."""
    gamma, beta, mm, mv = _affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    mean = tf.reduce_mean(x, axes, keepdims=True)
    variance = tf.reduce_mean(tf.square(x - tf.stop_gradient(mean)), axes, keepdims=True)
    y = (x - mean) / tf.sqrt(variance + EPSILON) * gamma + beta
    return y, [_assign(mm, mean), _assign(mv, variance)]


def _sufficient(x, name, shift=False):
    """tf.nn.sufficient_statistics + tf.nn.normalize_moments, with a per-tower shift (the tower's
    first example, stopped) or none."""
    gamma, beta, mm, mv = _affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    s = tf.stop_gradient(tf.reshape(x[:1], [-1, x.shape[-1]])[0]) if shift else None
    counts, mean_ss, var_ss, s = tf.nn.sufficient_statistics(x, axes, shift=s)
    mean, variance = tf.nn.normalize_moments(counts, mean_ss, var_ss, s)
    y = tf.nn.batch_normalization(x, mean, variance, beta, gamma, EPSILON)
    return y, [_assign(mm, mean), _assign(mv, variance)]


def _weighted(x, name, weights):
    """tf.nn.weighted_moments with weights per example, pixel or channel (keepdims=False)."""
    gamma, beta, mm, mv = _affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    mean, variance = tf.nn.weighted_moments(x, axes, weights)
    y = tf.nn.batch_normalization(x, mean, variance, beta, gamma, EPSILON)
    return y, [_assign(mm, mean), _assign(mv, variance)]


def pixel_mask(images):
    """A segmentation-style mask of ignored pixels, from the data (so it differs between towers)."""
    return tf.cast(images[..., :1] > -1.0, images.dtype)


def example_weights(images):
    """Per-example weights in (0, 1), from the data, stopped."""
    return tf.stop_gradient(tf.sigmoid(tf.reduce_mean(images, list(range(1, images.shape.rank)), keepdims=True)))


def channel_weights(images):
    """A pixel mask times a weight per channel (of 4): every channel's statistics weigh the towers
    differently."""
    return pixel_mask(images) * tf.constant([0.5, 1.0, 1.5, 2.0], images.dtype)


WEIGHTS = {"weighted-pixel": pixel_mask, "weighted-example": example_weights, "weighted-channel": channel_weights}

FORMS = {
    "sub-square": _sub_square,
    "sqdiff-keepdims": _sqdiff_keepdims,
    "sum-count-dd": _sum_count_dd,
    "second-moment": _second_moment,
    "stopped-sub": _stopped_sub,
    "sufficient": _sufficient,
    "sufficient-shift": lambda x, name: _sufficient(x, name, shift=True),
}


def conv_net(form, depth=2, layer_norm=False):
    """conv → hand-written batch norm → relu, `depth` times; a hand-written layer norm after the
    first block when asked; global average pooling and a dense head."""
    def model(x):
        bn = FORMS[form] if form in FORMS else functools.partial(_weighted, weights=WEIGHTS[form](x))
        updates, h = [], x
        for i in range(depth):
            h = models._conv_as(h, 4, f"conv{i}")
            h, up = bn(h, f"bn{i}")
            updates += up
            h = tf.nn.relu(h)
            if layer_norm and i == 0:
                mean = tf.reduce_mean(h, [1, 2, 3], keepdims=True)
                variance = tf.reduce_mean(tf.square(h - mean), [1, 2, 3], keepdims=True)
                h = (h - mean) * tf.math.rsqrt(variance + EPSILON)
        pooled = tf.reduce_mean(h, [1, 2])
        w = models._var("head/w", [4, 5], x.dtype, tf1.glorot_uniform_initializer(seed=9))
        return tf.matmul(pooled, w), updates

    return model


def dense_net(form, depth=2):
    """Dense → hand-written batch norm over axis 0 → relu (2-D activations)."""
    def model(x):
        bn = FORMS[form] if form in FORMS else functools.partial(_weighted, weights=tf.reshape(WEIGHTS[form](x), [-1, 1]))
        updates = []
        h = tf.reshape(x, [-1, x.shape[1] * x.shape[2] * x.shape[3]])
        for i in range(depth):
            w = models._var(f"dense{i}/w", [h.shape[-1], 6], x.dtype, tf1.glorot_uniform_initializer(seed=i))
            h, up = bn(tf.matmul(h, w), f"bn{i}")
            updates += up
            h = tf.nn.relu(h)
        w = models._var("head/w", [6, 5], x.dtype, tf1.glorot_uniform_initializer(seed=9))
        return tf.matmul(h, w), updates

    return model
