"""Towers of one example (segmentation and detection train at 1 image per device): where the trace
meets a reshape of a static shape, the batch axis has size 1 like other axes, and sizes alone
cannot place it (graphsync/batch_axis/reshape.py). A group norm written the usual way (reshape to
[N, H, W, G, C/G] from tf.shape, moments, reshape back) followed by a batch norm written by hand
(a mean and tf.math.reduce_variance, or tf.nn.weighted_moments) must equal one device on the
concatenated batch whatever each tower holds, 1 example included; plain towers must not.
"""
from __future__ import annotations

import pytest
import tensorflow as tf

import graphsync
import tiers
import towerlib as tl

tf1 = tf.compat.v1
INPUT, OUTPUT = (6, 6, 3), (5,)
TOLERANCE, UNSYNCED = 2e-5, 1e-3


def make(sizes, form):
    """The model, each tower's input given its static batch size (as a traced step's is)."""
    sizes = iter(list(sizes) * 2)

    def model(x):
        x = tf.ensure_shape(x, (next(sizes),) + INPUT)
        h = tf.nn.conv2d(x, tf1.get_variable("stem/w", [3, 3, 3, 8],
                                             initializer=tf1.glorot_uniform_initializer(seed=1)), 1, "SAME")
        s = tf.shape(h)
        grouped = tf.reshape(h, [s[0], s[1], s[2], 2, 4])
        m, v = tf.nn.moments(grouped, [1, 2, 4], keepdims=True)
        h = tf.reshape((grouped - m) * tf.math.rsqrt(v + 1e-5), s)          # group norm
        if form == "reduce_variance":
            mean = tf.reduce_mean(h, [0, 1, 2], keepdims=True)
            variance = tf.math.reduce_variance(h, [0, 1, 2], keepdims=True)
        else:
            weights = tf.nn.sigmoid(h[..., :1])   # per-example weights, computed from the examples
            mean, variance = tf.nn.weighted_moments(h, [0, 1, 2], weights, keepdims=True)
        h = (h - mean) * tf.math.rsqrt(variance + 1e-3)                      # batch norm by hand
        w = tf1.get_variable("head/w", [8, 5], initializer=tf1.glorot_uniform_initializer(seed=2))
        return tf.reduce_mean(tf.nn.relu(h), [1, 2]) @ w, []
    return model


CASES = [(form, sizes) for form in ("reduce_variance", "weighted_moments") for sizes in ([1, 1], [1, 2], [2, 2])]
IDS = [f"{form}-{'x'.join(map(str, sizes))}" for form, sizes in CASES]


@pytest.mark.parametrize("form,sizes", tiers.cases(CASES, IDS, fast={"reduce_variance-1x1", "weighted_moments-1x2"}))
def test_one_example_per_tower_equals_one_device(form, sizes):
    reports = []
    built = tl.build(make(sizes, form), sizes, input_shape=INPUT,
                     rewrite=lambda g: reports.append(graphsync.rewrite_towers(g)))
    report, = reports
    assert report.changed, report.summary
    # the group norm is left alone; the batch norm by hand is one layer of three reductions
    assert [len(layer.reductions) for layer in report.layers] == [3], str(report)
    x, t = tl.data(sizes, INPUT, OUTPUT)
    reference = tl.reference_step(make([sum(sizes)], form), sizes, x, t)
    got = tl.run_step(built, x, t, sizes)
    plain = tl.run_step(tl.build(make(sizes, form), sizes, input_shape=INPUT), x, t, sizes)
    errors = {k: tl.max_rel_error(got[k], reference[k]) for k in ("output", "grads")}
    unsynced = {k: tl.max_rel_error(plain[k], reference[k]) for k in ("output", "grads")}
    assert max(errors.values()) < TOLERANCE and max(unsynced.values()) > UNSYNCED, (errors, unsynced, report.summary)
