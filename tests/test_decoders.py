"""Decoders that upsample by transposed convolution (issue 52): every normalization form after a
transposed convolution equals one device on the concatenated batch, rewritten before or after the
gradients, gathered or all-reduced, with recompute off, per layer or by segments.

A transposed convolution is a `Conv2DBackpropInput` (`Conv3DBackpropInputV2`,
`DepthwiseConv2dNativeBackpropInput`) in the forward: graphsync once took every op of such a type
for the backward, and everything after it with it. The decoder's batch norms then trained per
tower without a word, or were refused as "gradient already built" before any gradient existed.
Each case here also checks that the graph left alone differs from one device (the case can fail).

Tolerances: float32 through 4 layers, gradients summed over ≤ 8 examples of ≤ 32 values:
measured ≤ 1.2e-5 (depthwise), so 5e-5; unsynchronized errors are 1e-2 and more.
"""
import functools
import warnings

import numpy as np
import pytest
import tensorflow as tf

import behaviours
import decoder_models as dm
import graphsync
import tiers
import towerlib as tl

tf1 = tf.compat.v1
TOLERANCE = 5e-5
SHAPE = (4, 4, 3)
FORMS = ("fused", "layers-moments", "keras", "moments", "handwritten")
KINDS = {  # how the transposed convolution is written, and its rank (4: 2-D, 5: 3-D, 3: 1-D)
    "nn": ("nn", 4), "layers": ("layers", 4), "keras": ("keras", 4), "depthwise": ("depthwise", 4),
    "nn-3d": ("nn", 5), "layers-3d": ("layers", 5), "nn-1d": ("nn", 3),
}


def _matrix():
    cases = []
    for form in FORMS:
        for kind, (spelling, rank) in KINDS.items():
            if (form == "fused" and rank != 4) or (form == "keras" and spelling == "depthwise"):
                continue   # tf.layers fuses 4-D inputs only; Keras has no depthwise transposed layer
            for stride in (1, 2):
                for gradients in ("after", "before"):
                    cases.append((form, kind, stride, gradients))
    return cases


CASES = _matrix()
IDS = [f"{f}-{k}-s{s}-{g}" for f, k, s, g in CASES]
FAST = {"fused-nn-s2-after", "layers-moments-layers-s2-before", "keras-keras-s1-after",
        "moments-depthwise-s2-before", "handwritten-nn-3d-s2-after"}


def _model(form, kind, stride):
    spelling, rank = KINDS[kind]
    return dm.decoder(form, spelling, rank, stride)


@functools.lru_cache(maxsize=None)
def _reference(form, kind, stride, batch_sizes):
    model = _model(form, kind, stride)
    probe = tl.build(model, [1], scope="", devices=["/cpu:0"], input_shape=SHAPE)
    width = probe.targets[0].shape[1]
    x, t = tl.data(list(batch_sizes), SHAPE, (width,))
    return x, t, tl.reference_step(model, list(batch_sizes), x, t, input_shape=SHAPE)


def _errors(form, kind, stride, gradients, batch_sizes=(3, 5), rewrite=True, **options):
    x, t, ref = _reference(form, kind, stride, tuple(batch_sizes))
    reports = []
    fn = (lambda g: reports.append(graphsync.rewrite_towers(g, **options))) if rewrite else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
        built = tl.build(_model(form, kind, stride), list(batch_sizes), gradients=gradients, rewrite=fn,
                         input_shape=SHAPE)
    got = tl.run_step(built, x, t, list(batch_sizes))
    return {k: tl.max_rel_error(got[k], ref[k]) for k in ref}, (reports[0] if reports else None), built


@pytest.mark.parametrize("form,kind,stride,gradients", tiers.cases(CASES, IDS, FAST))
def test_batch_norm_after_a_transposed_convolution_equals_one_device(form, kind, stride, gradients):
    errors, report, _ = _errors(form, kind, stride, gradients)
    assert len(report.layers) == 2 and len(report.towers) == 2, report.summary
    assert max(errors.values()) < TOLERANCE, errors
    unsynced = _unsynchronized(form, kind, stride)
    assert unsynced["output"] > 1e-3 and unsynced["moving"] > 1e-3, unsynced


@functools.lru_cache(maxsize=None)
def _unsynchronized(form, kind, stride):
    """The errors of the graph left alone (the same graph whether its gradients come before or
    after where the rewrite would be): once per model."""
    return _errors(form, kind, stride, "after", rewrite=False)[0]


OPTIONS = [  # (form, kind, gradients, rewrite_towers options)
    ("fused", "layers", "after", {"strategy": "allreduce"}),
    ("moments", "nn", "before", {"strategy": "allreduce"}),
    ("handwritten", "keras", "after", {"strategy": "allreduce"}),
    ("fused", "nn", "after", {"recompute": True}),
    ("layers-moments", "layers", "before", {"recompute": True}),
    ("fused", "keras", "after", {"recompute": "segments"}),
    ("moments", "nn", "after", {"recompute": "segments"}),
    ("handwritten", "layers", "before", {"recompute": "segments"}),
]
OPTION_IDS = [f"{f}-{k}-{g}-{'-'.join(f'{a}={b}' for a, b in o.items())}" for f, k, g, o in OPTIONS]


OPTIONS_FAST = {"fused-keras-after-recompute=segments", "moments-nn-before-strategy=allreduce"}


@pytest.mark.parametrize("form,kind,gradients,options", tiers.cases(OPTIONS, OPTION_IDS, OPTIONS_FAST))
def test_decoders_with_every_exchange_and_recompute(form, kind, gradients, options):
    errors, report, built = _errors(form, kind, 2, gradients, batch_sizes=(3, 5, 2, 4), **options)
    assert len(report.layers) == 2 and len(report.towers) == 4, report.summary
    assert max(errors.values()) < TOLERANCE, errors
    if options.get("recompute"):   # and bit for bit the synchronized step without recompute
        x, t, _ = _reference(form, kind, 2, (3, 5, 2, 4))
        _, _, plain = _errors(form, kind, 2, gradients, batch_sizes=(3, 5, 2, 4),
                              strategy=options.get("strategy", "gather"))
        # rewritten before the gradients, each layer is recomputed when tf.gradients reaches it
        assert report.recomputed > 0 if gradients == "after" else report.recompute_deferred == len(report.layers)
        for got, want in zip(tl.variables_after(built, x, t, [3, 5, 2, 4], steps=2),
                             tl.variables_after(plain, x, t, [3, 5, 2, 4], steps=2)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("behaviour", tiers.cases(["v1", "control-flow-v1"], ["v1", "control-flow-v1"],
                                                  fast={"v1"}))
def test_decoders_under_tf1_behaviour(behaviour):
    """Ref variables and Switch/Merge control flow (tf_cnn_benchmarks, most TF1 scripts)."""
    with behaviours.behaviour(behaviour):
        for form, gradients in (("fused", "after"), ("moments", "before")):
            x, t, ref = _reference.__wrapped__(form, "layers", 2, (3, 5))
            reports = []
            built = tl.build(_model(form, "layers", 2), [3, 5], gradients=gradients, input_shape=SHAPE,
                             rewrite=lambda g: reports.append(graphsync.rewrite_towers(g)))
            got = tl.run_step(built, x, t, [3, 5])
            errors = {k: tl.max_rel_error(got[k], ref[k]) for k in ref}
            assert len(reports[0].layers) == 2 and max(errors.values()) < TOLERANCE, (form, errors)


def test_forward_ops_whose_type_looks_like_a_gradient_stay_forward():
    """A decoder that upsamples by ops of gradient-kernel types, used on purpose in the forward
    (a transposed convolution, a depthwise one, ReluGrad as a gate): nothing is backward before
    tf.gradients runs, and after it exactly what the gradient's seed reaches."""
    from graphsync.graph.backward import has_backward, is_backward

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, (None, 4, 4, 3))
        w = tf1.get_variable("w", [3, 3, 3, 3])
        up = tf.nn.conv2d_transpose(x, w, tf.stack([tf.shape(x)[0], 8, 8, 3]), 2)
        gated = tf.raw_ops.ReluGrad(gradients=up, features=up)
        y = tf.nn.depthwise_conv2d_backprop_input(tf.stack([tf.shape(x)[0], 8, 8, 3]),
                                                  tf1.get_variable("d", [3, 3, 3, 1]), gated, [1, 1, 1, 1], "SAME")
        loss = tf.reduce_sum(y)
        forward = graph.get_operations()
        assert not has_backward(graph) and not any(is_backward(op) for op in forward)
        grads = tf.gradients(loss, tf1.trainable_variables())
        assert not any(is_backward(op) for op in forward if op is not loss.op)
        assert all(is_backward(g.op) for g in grads)
        assert {"Conv2DBackpropInput", "ReluGrad", "DepthwiseConv2dNativeBackpropInput"} <= \
            {op.type for op in forward}


def _issue_block(x):
    """The issue's net: conv2d_transpose → a batch norm by hand (reduce_mean, reduce_variance,
    moving averages, tf.nn.batch_normalization) → ReLU."""
    from tensorflow.python.training import moving_averages
    w = tf1.get_variable("up/w", [3, 3, 4, 3], x.dtype, tf1.glorot_uniform_initializer(seed=1))
    h = tf.nn.conv2d_transpose(x, w, tf.stack([tf.shape(x)[0], 8, 8, 4]), 2)
    gamma = tf1.get_variable("bn/gamma", [4], x.dtype, tf1.random_uniform_initializer(0.5, 1.5, seed=2))
    beta = tf1.get_variable("bn/beta", [4], x.dtype, tf1.zeros_initializer())
    mm = tf1.get_variable("bn/moving_mean", [4], x.dtype, tf1.zeros_initializer(), trainable=False)
    mv = tf1.get_variable("bn/moving_variance", [4], x.dtype, tf1.ones_initializer(), trainable=False)
    mean, variance = tf.reduce_mean(h, [0, 1, 2]), tf.math.reduce_variance(h, [0, 1, 2])
    updates = [moving_averages.assign_moving_average(mm, mean, 0.9, zero_debias=False),
               moving_averages.assign_moving_average(mv, variance, 0.9, zero_debias=False)]
    y = tf.nn.relu(tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-3))
    return tf.reshape(y, [-1, 8 * 8 * 4]), updates


def test_the_issue_net_is_synchronized_not_left_per_tower():
    """Rewritten after the gradients, it once reported 0 layers, raised nothing and trained per tower."""
    x, t = tl.data([3, 5], SHAPE, (256,))
    ref = tl.reference_step(_issue_block, [3, 5], x, t, input_shape=SHAPE)
    reports = []
    built = tl.build(_issue_block, [3, 5], input_shape=SHAPE,
                     rewrite=lambda g: reports.append(graphsync.rewrite_towers(g)))
    got = tl.run_step(built, x, t, [3, 5])
    errors = {k: tl.max_rel_error(got[k], ref[k]) for k in ref}
    assert reports[0].layers and max(errors.values()) < TOLERANCE, (reports[0].summary, errors)


def test_a_plan_that_synchronizes_nothing_in_towers_with_batch_norms_is_refused():
    """Whatever made the plan miss them, towers that still normalize with their own batch and a
    plan of no layer are one line, not a report of 0 layers (plan/left_alone.py)."""
    import dataclasses

    from graphsync.plan import left_alone, planner

    for form, gradients in (("fused", "after"), ("handwritten", "before")):
        built = tl.build(_model(form, "nn", 2), [3, 5], gradients=gradients, input_shape=SHAPE)
        plan = planner.make_plan(built.graph)
        assert plan.layers
        missed = dataclasses.replace(plan, layers=(), cross_example=())
        with pytest.raises(graphsync.GraphsyncError, match=r"normalizes with its tower's own batch in 2 towers"):
            left_alone.refuse(built.graph, missed)
    # a graph without batch statistics (a layer norm only) is a success with 0 layers
    def layer_norm_only(x):
        x = x * tf1.get_variable("scale", [3], x.dtype, tf1.ones_initializer())
        mean, variance = tf.nn.moments(x, [1, 2, 3], keepdims=True)
        return tf.reshape((x - mean) * tf.math.rsqrt(variance + 1e-3), [-1, 48]), []
    report = graphsync.rewrite_towers(tl.build(layer_norm_only, [3, 5], input_shape=SHAPE).graph)
    assert not report.layers
