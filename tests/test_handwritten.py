"""Batch statistics written by hand (graphsync/match/handwritten.py, sufficient.py): one training
step of the rewritten graph equals the single-device step on the concatenated batch — outputs,
per-tower losses, gradients, moving averages (assign, assign_moving_average,
ExponentialMovingAverage), updated variables — and the un-rewritten graph does not. Before and
after the gradients, both strategies, uneven towers; tf.nn.weighted_moments with a per-pixel mask,
per-example weights and weights per channel computed from the data, so they differ between towers
(weights per channel: no form, the rule synchronizes their sums as reductions).

Tolerances as in test_moments.py: float64 1e-12 (measured ≤ 1.1e-14), float32 5e-5 (measured
≤ 6e-7). Un-rewritten errors are 0.1 and more.
"""
import functools
import warnings

import numpy as np
import pytest
import tensorflow as tf

import graphsync
import handwritten_models as hm
import tiers
import towerlib as tl

tf1 = tf.compat.v1
TOLERANCE = {tf.float64: 1e-12, tf.float32: 5e-5}
SHAPE, WIDTH = (6, 6, 3), 5

CASES = [  # form, net, batch sizes, gradients, strategy, dtype
    ("sub-square", "conv", [3, 5, 4], "after", "gather", tf.float64),
    ("sub-square", "conv", [4, 4], "before", "allreduce", tf.float64),
    ("sqdiff-keepdims", "conv", [2, 5], "before-sum", "gather", tf.float64),
    ("sqdiff-keepdims", "dense", [3, 5, 4], "after", "allreduce", tf.float32),
    ("sum-count-dd", "conv", [3, 5, 4], "after", "gather", tf.float64),
    ("sum-count-dd", "dense", [4, 2], "before-sum", "allreduce", tf.float64),
    ("second-moment", "conv", [3, 5, 4], "after", "allreduce", tf.float64),
    ("second-moment", "conv", [5, 3], "before", "gather", tf.float32),
    ("stopped-sub", "conv", [3, 4], "after", "gather", tf.float64),
    ("sufficient", "conv", [3, 5, 4], "after", "gather", tf.float64),
    ("sufficient", "dense", [4, 4], "before-sum", "allreduce", tf.float64),
    ("sufficient-shift", "conv", [3, 5, 4], "after", "allreduce", tf.float64),
    ("sufficient-shift", "conv", [2, 6], "before", "gather", tf.float64),
    ("weighted-pixel", "conv", [3, 5, 4], "after", "gather", tf.float64),
    ("weighted-pixel", "conv", [4, 4], "before-sum", "allreduce", tf.float32),
    ("weighted-example", "dense", [3, 5, 4], "after", "allreduce", tf.float32),
    ("weighted-example", "conv", [2, 6], "before", "gather", tf.float64),
    ("weighted-channel", "conv", [3, 5, 4], "after", "gather", tf.float64),
    ("weighted-channel", "conv", [4, 4], "before", "allreduce", tf.float32),
]
BY_RULE = ("weighted-channel",)   # no form takes weights per channel: the rule's reductions
FOUND_AS = {"sufficient-shift": "tf.nn.sufficient_statistics with a shift", "weighted-pixel": "tf.nn.weighted_moments",
            "weighted-example": "tf.nn.weighted_moments", "weighted-channel": "reductions: sum + sum + sum of squares"}


def _model(form, net, **kw):
    return (hm.conv_net if net == "conv" else hm.dense_net)(form, **kw)


def _moving_in_reference_order(built):
    """Shared moving statistics, and tower 0's own ExponentialMovingAverage slots (each tower
    makes its own; the CIFAR10 pattern runs tower 0's updates) named as the reference names them."""
    def key(v):
        return v.name.split("/", 1)[1] if v.name.startswith("tower_0/") else v.name
    built.moving = sorted((v for v in built.moving if not v.name.startswith("tower_") or
                           v.name.startswith("tower_0/")), key=key)
    return built


@functools.lru_cache(maxsize=None)
def _reference(form, net, batch_sizes, dtype, layer_norm=False):
    x, t = tl.data(list(batch_sizes), SHAPE, (WIDTH,), dtype=dtype.as_numpy_dtype)
    ref = _moving_in_reference_order(tl.build(_model(form, net, **_kw(net, layer_norm)), [sum(batch_sizes)],
                                              scope="", devices=["/cpu:0"], grad_divisor=len(batch_sizes),
                                              dtype=dtype, input_shape=SHAPE))
    result = tl.run_step(ref, x, t, [sum(batch_sizes)])
    per_example = np.square(result["output"] - t.astype(np.float64)).reshape(len(x), -1).sum(1) * 0.5
    result["loss"] = np.array([p.sum() for p in np.split(per_example, np.cumsum(batch_sizes)[:-1])])
    return (x, t), result


def _kw(net, layer_norm):
    return {"layer_norm": True} if layer_norm else {}


def _errors(form, net, batch_sizes, gradients, strategy, dtype, rewrite=True, layer_norm=False):
    (x, t), ref = _reference(form, net, tuple(batch_sizes), dtype, layer_norm)
    reports = []
    fn = (lambda g: reports.append(graphsync.rewrite_towers(g, strategy=strategy))) if rewrite else None
    built = _moving_in_reference_order(tl.build(_model(form, net, **_kw(net, layer_norm)), batch_sizes,
                                                gradients=gradients, rewrite=fn, dtype=dtype, input_shape=SHAPE))
    got = tl.run_step(built, x, t, batch_sizes)
    return {k: tl.max_rel_error(got[k], ref[k]) for k in ref}, (reports[0] if reports else None), built


IDS = [f"{f}-{n}-{'x'.join(map(str, b))}-{g}-{s}-{d.name}" for f, n, b, g, s, d in CASES]
FAST = {"sub-square-conv-4x4-before-allreduce-float64", "second-moment-conv-5x3-before-gather-float32",
        "sufficient-conv-3x5x4-after-gather-float64", "weighted-pixel-conv-4x4-before-sum-allreduce-float32",
        "weighted-channel-conv-3x5x4-after-gather-float64"}


@pytest.mark.parametrize("form,net,batch_sizes,gradients,strategy,dtype", tiers.cases(CASES, IDS, FAST))
def test_step_equals_single_device_reference(form, net, batch_sizes, gradients, strategy, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
        errors, report, _ = _errors(form, net, batch_sizes, gradients, strategy, dtype)
    if form in BY_RULE:   # Σw·x, Σw and Σw·(x − μ)² of each layer, each summed over the towers: one layer each
        assert [len(l.reductions) for l in report.layers] == [3, 3] and \
            {l.kind for l in report.layers} == {"reduction"}, str(report)
    else:
        assert len(report.layers) == 2 and {l.kind for l in report.layers} == {"moments"}, str(report)
    assert {l.found_as for l in report.layers} == {FOUND_AS.get(form, "mean and variance by hand")}, str(report)
    assert max(errors.values()) < TOLERANCE[dtype], errors
    unsynced, _, _ = _errors(form, net, batch_sizes, gradients, strategy, dtype, rewrite=False)
    for key in ("output", "loss", "grads", "moving"):
        assert unsynced[key] > 1e-3, (key, unsynced)


def _look_alikes(built):
    """Next to each tower's batch norm: a loss-like batch mean of the output and a by-hand batch
    mean and variance of it that normalize nothing (a monitoring summary)."""
    with built.graph.as_default():
        for i, y in enumerate(built.outputs):
            with tf1.name_scope(f"tower_{i}/monitor/"):
                tf.reduce_mean(tf.square(y), name="aux_loss")
                mean = tf.reduce_mean(y, [0])
                spread = tf.reduce_mean(tf.square(y - mean), [0], name="spread")
                tf1.summary.histogram("mean", mean), tf1.summary.histogram("spread", spread)


def test_only_the_batch_norm_changes_next_to_loss_pooling_layer_norm_and_monitors():
    (x, t), ref = _reference("sub-square", "conv", (3, 5), tf.float64, True)
    built = _moving_in_reference_order(tl.build(_model("sub-square", "conv", layer_norm=True), [3, 5],
                                                dtype=tf.float64, input_shape=SHAPE))
    _look_alikes(built)
    graph = built.graph
    untouched = {op.name: [t.name for t in op.inputs] for op in graph.get_operations()
                 if "/monitor/" in op.name or op.type == "Mean" and op.inputs[0].shape.rank == 4 and
                 tf.get_static_value(op.inputs[1]).tolist() in ([1, 2], [1, 2, 3])}
    with warnings.catch_warnings():   # layer norm, monitors, losses: nothing that trains per tower to warn of
        warnings.simplefilter("error", graphsync.GraphsyncWarning)
        report = graphsync.rewrite_towers(graph)
    assert [l.name for l in report.layers] == ["Mean", "Mean_4"], str(report)
    skipped = {s.op: s.reason for s in report.skipped}
    assert "exclude the batch axis" in skipped["tower_1/Mean_2"]          # the layer norm
    assert "normalize nothing" in skipped["tower_0/monitor/Mean"]        # the monitor
    assert not any("aux_loss" in op or "Mean_6" in op for op in skipped)   # the loss, the pooling
    for name, inputs in untouched.items():
        assert [t.name for t in graph.get_operation_by_name(name).inputs] == inputs, name
    got = tl.run_step(built, x, t, [3, 5])
    assert max(tl.max_rel_error(got[k], ref[k]) for k in ref) < 1e-12


def test_second_rewrite_changes_nothing():
    _, report, built = _errors("second-moment", "conv", [3, 5], "after", "gather", tf.float64)
    assert report.layers
    before = built.graph.as_graph_def()
    again = graphsync.rewrite_towers(built.graph)
    assert not again.changed
    assert built.graph.as_graph_def() == before


def test_a_sum_over_the_wrong_count_is_no_mean():
    """Σ over the batch and the pixels divided by the batch size alone is not a mean: left alone."""
    graph = tf.Graph()
    with graph.as_default():
        for i in range(2):
            with tf1.name_scope(f"tower_{i}/"):
                h = tf1.placeholder(tf.float32, [None, 4, 4, 3])
                right = tf.reduce_sum(h, [0, 1, 2]) / (tf.cast(tf.shape(h)[0], tf.float32) * 16.0)
                wrong = tf.reduce_sum(h, [0, 1, 2]) / tf.cast(tf.shape(h)[0], tf.float32)
                for mean in (right, wrong):
                    variance = tf.reduce_mean(tf.square(h - mean), [0, 1, 2])
                    tf.nn.batch_normalization(h, mean, variance, None, None, 1e-3)
    report = graphsync.rewrite_towers(graph)
    assert [l.tower_ops[0] for l in report.layers] == ["tower_0/truediv"], str(report)


def _normalized_output(x):
    """conv → batch norm by hand → relu → the pooled output itself: no variable after the batch
    norm, only the loss (the model's last layer)."""
    w = tf1.get_variable("w", [3, 3, x.shape[-1], 4], initializer=tf1.glorot_uniform_initializer(seed=1))
    h = tf.nn.conv2d(x, w, 1, "SAME")
    with tf1.name_scope("last_bn"):
        h = (h - tf.reduce_mean(h, [0, 1, 2])) * tf.math.rsqrt(tf.math.reduce_variance(h, [0, 1, 2]) + 1e-3)
    return tf.reduce_mean(tf.nn.relu(h), [1, 2]), []


def test_a_batch_norm_with_no_variable_after_it_is_synchronized_or_said():
    """Its examples reach the loss, not a variable: rewritten after the gradients, they are seen to
    be differentiated and it is synchronized (equal to one device); before, one line says it stays."""
    sizes = [2, 3, 4]
    x, t = tl.data(sizes, SHAPE, (4,))
    ref = tl.reference_step(_normalized_output, sizes, x, t, input_shape=SHAPE)
    built = tl.build(_normalized_output, sizes, rewrite=graphsync.rewrite_towers, input_shape=SHAPE)
    got = tl.run_step(built, x, t, sizes)
    assert max(tl.max_rel_error(got[k], ref[k]) for k in ref) < 1e-5
    with pytest.warns(graphsync.GraphsyncWarning, match=r"tower_0/last_bn/\S+ \(Mean\) reduces over the batch; its "
                      r"value is read back into the examples, .* it stays per tower; if it normalizes the model's "
                      r"output, rewrite after the gradients are built"):
        tl.build(_normalized_output, sizes, rewrite=graphsync.rewrite_towers, gradients="before", input_shape=SHAPE)
