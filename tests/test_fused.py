"""Fused batch norm: one training step of the rewritten multi-tower graph equals the single-device
step on the concatenated batch (outputs, per-tower losses, summed gradients, moving statistics,
updated variables), and the un-rewritten graph does not.

Tolerance: derived from each run (towerlib.tolerance): four times one device's own noise (the same
step on the batch in another order) or the dtype's rounding over the largest sum, whichever is larger.
Measured on float32: errors 0.6–7e-6 against a reordering noise of 1–6e-6, with oneDNN and without.
Without the rewrite the errors are 1e-2 and more.

Channels-first: "raw-nchw" (NCHW convolutions) needs channels-first convolution gradients, which
only oneDNN provides on CPUs; "raw-nchw-bn" covers the batch norm's NCHW path everywhere.
"""
import functools
import warnings

import pytest
import tensorflow as tf

import graphsync
import models
import tiers
import towerlib as tl

UNSYNCED_MIN_ERROR = 1e-3
INPUT_SHAPE = (6, 6, 3)


@functools.lru_cache(maxsize=None)
def _data(batch_sizes, input_shape, np_dtype):
    return tl.data(list(batch_sizes), input_shape, (5,), dtype=np_dtype)


def _reference(model_key, model_fn, batch_sizes, dtype, input_shape=(6, 6, 3)):
    x, t = _data(tuple(batch_sizes), input_shape, dtype.as_numpy_dtype)
    return tl.reference_step(model_fn, batch_sizes, x, t, dtype=dtype, input_shape=input_shape)


_reference = functools.lru_cache(maxsize=None)(_reference)


@functools.lru_cache(maxsize=None)
def tolerance(model_key, model_fn, batch_sizes, dtype, input_shape=INPUT_SHAPE):
    """towerlib.tolerance for this model and batch: the reordering noise measured now, and the
    dtype's rounding over a filter gradient's sum (examples × positions)."""
    x, t = _data(tuple(batch_sizes), input_shape, dtype.as_numpy_dtype)
    ref = _reference(model_key, model_fn, tuple(batch_sizes), dtype, input_shape)
    reordered = tl.reordered_reference_step(model_fn, batch_sizes, x, t, dtype=dtype, input_shape=input_shape)
    noise = max(tl.max_rel_error(reordered[k], ref[k]) for k in ref)
    return tl.tolerance(dtype, noise, sum(batch_sizes) * input_shape[0] * input_shape[1])


def skip_without_kernels(model_key, dtype=tf.float32):
    if model_key == "raw-nchw" and not tl.channels_first_conv_gradients():
        pytest.skip("this CPU's TensorFlow has no channels-first convolution gradient (oneDNN off); "
                    "raw-nchw-bn covers the batch norm's NCHW path")
    if not tl.fused_batch_norm_kernels(dtype):
        pytest.skip(f"this CPU's TensorFlow has no {dtype.name} fused batch norm (TensorFlow 2.12 with oneDNN "
                    "off): the model itself cannot run")


def _errors(model_key, model_fn, batch_sizes, *, gradients="after", dtype=tf.float32, rewrite=True, **kw):
    ref = _reference(model_key, model_fn, tuple(batch_sizes), dtype)
    x, t = _data(tuple(batch_sizes), (6, 6, 3), dtype.as_numpy_dtype)
    reports = []
    rewrite_fn = (lambda g: reports.append(graphsync.rewrite_towers(g, **kw))) if rewrite else None
    built = tl.build(model_fn, batch_sizes, gradients=gradients, rewrite=rewrite_fn, dtype=dtype)
    got = tl.run_step(built, x, t, batch_sizes)
    return {k: tl.max_rel_error(got[k], ref[k]) for k in ref}, (reports[0] if reports else None), built


MODELS = {
    "raw-v3": models.resnetish(depth=3),
    "raw-v2": models.resnetish(depth=2, version=2),
    "raw-v1": models.resnetish(depth=2, version=1),
    "raw-nchw": models.resnetish(depth=2, data_format="NCHW"),
    "raw-nchw-bn": models.resnetish(depth=2, bn_format="NCHW"),
    "raw-avg-factor": models.resnetish(depth=2, avg_factor=0.3),
    "layers": models.layers_bn(depth=2),
    "keras": models.keras_bn(depth=2),
}

CASES = [
    ("raw-v3", [4, 4], "after", tf.float32),
    ("raw-v3", [3, 5, 8], "after", tf.float32),
    ("raw-v3", [2, 3, 4, 7], "after", tf.float32),
    ("raw-v3", [3, 5, 8], "before-sum", tf.float32),
    ("raw-v3", [5, 2], "before", tf.float32),
    ("raw-v2", [3, 5], "after", tf.float32),
    ("raw-v1", [6, 2], "after", tf.float32),
    ("raw-nchw", [3, 5, 4], "after", tf.float32),
    ("raw-nchw", [3, 5], "before-sum", tf.float32),
    ("raw-nchw-bn", [3, 5, 4], "after", tf.float32),
    ("raw-nchw-bn", [3, 5], "before-sum", tf.float32),
    ("raw-avg-factor", [3, 5], "after", tf.float32),
    ("raw-v3", [4, 6], "after", tf.float16),
    ("raw-v3", [4, 6], "after", tf.bfloat16),
    ("layers", [3, 5, 4, 4], "after", tf.float32),
    ("layers", [4, 4], "before-sum", tf.float32),
    ("keras", [3, 5], "after", tf.float32),
    ("keras", [4, 4, 4], "before", tf.float32),
]


IDS = [f"{m}-{'x'.join(map(str, b))}-{g}-{d.name}" for m, b, g, d in CASES]
FAST = {"raw-v3-3x5x8-after-float32", "raw-v3-5x2-before-float32", "layers-4x4-before-sum-float32",
        "keras-3x5-after-float32", "raw-nchw-bn-3x5x4-after-float32"}
KERNELS = {i for i in IDS if "nchw" in i or "float16" in i}   # oneDNN's channels-first and half kernels


@pytest.mark.parametrize("model_key,batch_sizes,gradients,dtype", tiers.cases(CASES, IDS, FAST, KERNELS))
def test_step_equals_single_device_reference(model_key, batch_sizes, gradients, dtype):
    skip_without_kernels(model_key, dtype)
    model = MODELS[model_key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
        errors, report, _ = _errors(model_key, model, batch_sizes, gradients=gradients, dtype=dtype)
    assert report.layers and len(report.towers) == len(batch_sizes)
    allowed = tolerance(model_key, model, tuple(batch_sizes), dtype)
    assert max(errors.values()) < allowed, (allowed, errors)

    unsynced, _, _ = _errors(model_key, model, batch_sizes, gradients=gradients, dtype=dtype, rewrite=False)
    for key in ("output", "loss", "grads", "moving"):
        assert unsynced[key] > UNSYNCED_MIN_ERROR, (key, unsynced)
    assert max(unsynced.values()) > 3 * allowed, (allowed, unsynced)   # the check tells one from the other


def test_one_tower_changes_nothing():
    model = MODELS["raw-v3"]
    built = tl.build(model, [6], gradients="after")
    before = built.graph.as_graph_def()
    report = graphsync.rewrite_towers(built.graph)
    assert not report.layers and not report.changed
    assert all("single tower" in s.reason for s in report.skipped) and len(report.skipped) == 3
    assert built.graph.as_graph_def() == before


@tiers.full
def test_more_than_fifty_layers_per_tower():
    """Float32 rounding grows with depth: at 52 layers the worst gradient (a small beta) is off by
    1.6e-4 relative, the median by 1e-5 (measured); per-tower statistics are off by 30."""
    model = models.resnetish(depth=52, channels=2)
    errors, report, _ = _errors("deep", model, [3, 5])
    assert len(report.layers) == 52
    assert max(errors.values()) < 1e-3, errors
    unsynced, _, _ = _errors("deep", model, [3, 5], rewrite=False)
    assert min(unsynced[k] for k in ("output", "loss", "grads", "moving")) > 0.1, unsynced


def _conv3d_model(x):
    """NDHWC 5-D activations (the fused op accepts them), ref variables as TF1 created them."""
    w = tf.compat.v1.get_variable("w3", [1, 3, 3, 3, 4], initializer=tf.compat.v1.glorot_uniform_initializer(seed=2),
                                  use_resource=False)
    h = tf.nn.conv3d(tf.expand_dims(x, 1), w, [1] * 5, "SAME")
    with tf.compat.v1.variable_scope("bn3d"):
        gamma = tf.compat.v1.get_variable("gamma", [4], initializer=tf.compat.v1.random_uniform_initializer(0.5, 1.5, seed=1),
                                          use_resource=False)
        beta = tf.compat.v1.get_variable("beta", [4], initializer=tf.compat.v1.zeros_initializer(), use_resource=False)
        mmean = tf.compat.v1.get_variable("moving_mean", [4], initializer=tf.compat.v1.zeros_initializer(),
                                          trainable=False, use_resource=False)
    y, mean, _ = tf.compat.v1.nn.fused_batch_norm(h, gamma, beta, epsilon=1e-3, data_format="NDHWC", is_training=True)[:3]
    head = tf.compat.v1.get_variable("head3d", [4, 5], initializer=tf.compat.v1.glorot_uniform_initializer(seed=3),
                                     use_resource=False)
    update = tf.compat.v1.assign(mmean, mmean * 0.9 + mean * 0.1)
    return tf.matmul(tf.reduce_mean(tf.nn.relu(y), [1, 2, 3]), head), [update]


def test_five_dimensional_input_and_ref_variables():
    """Ref variables are read without snapshots, so apply_gradients races with other gradients even
    on one device (the reference repeated differs by 0.1): compare everything before the update."""
    errors, report, built = _errors("conv3d", _conv3d_model, [3, 5])
    assert built.variables[0].op.type == "VariableV2"
    del errors["variables"]
    assert len(report.layers) == 1 and max(errors.values()) < 2e-5, errors
    unsynced, _, _ = _errors("conv3d", _conv3d_model, [3, 5], rewrite=False)
    assert unsynced["output"] > UNSYNCED_MIN_ERROR


def test_no_rewrite_order_warns():
    """Per-tower tf.gradients after a forward rewrite stay linear (tests/test_before_gradients.py)."""
    for gradients in ("before", "before-sum", "after"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", graphsync.GraphsyncWarning)
            tl.build(MODELS["raw-v3"], [2, 2], gradients=gradients, rewrite=graphsync.rewrite_towers)


def _offset_statistics_graph(shape, strategy, kind="fused"):
    """Four towers of one training-mode fused batch norm (or tf.nn.moments) on placeholders of
    unknown batch size, rewritten with `strategy` (None: not rewritten); returns (graph, inputs,
    per-tower (batch mean, batch variance) as the consumers see them): Bessel-corrected for the
    fused op, biased for tf.nn.moments."""
    import numpy as np  # noqa: F401  (kept local: only these tests need it)
    graph = tf.Graph()
    with graph.as_default():
        inputs, seen = [], []
        for i in range(4):
            with tf.device(f"/cpu:{i}"), tf.compat.v1.name_scope(f"tower_{i}/"):
                x = tf.compat.v1.placeholder(tf.float32, (None,) + shape[1:], name="x")
                c = shape[-1]
                if kind == "fused":
                    _, mean, variance = tf.compat.v1.nn.fused_batch_norm(x, tf.ones([c]), tf.zeros([c]), epsilon=1e-3,
                                                                         is_training=True)[:3]
                else:
                    mean, variance = tf.nn.moments(x, list(range(len(shape) - 1)))
                inputs.append(x)
                seen.append((tf.identity(mean), tf.identity(variance)))
        if strategy:
            assert len(graphsync.rewrite_towers(graph, strategy=strategy).layers) == 1
    return graph, inputs, seen


@pytest.mark.parametrize("kind", ["fused", "moments"])
@pytest.mark.parametrize("batch_sizes", [[8, 8, 8, 8], [8, 3, 0, 5]], ids=["even", "uneven-with-empty-tower"])
def test_statistics_accurate_on_offset_data(batch_sizes, kind):
    """Target of issue 11: the merged variance within 3e-6 relative of float64 on the same float32
    data at |μ|/σ = 1e3 and 1e4 (x = offset + N(0, 1) per channel; max over 16 channels, median of 5
    seeds). Without the residual correction the fused path measured 2.4e-5 / 3.0e-4 (the
    single-device kernel 5.3e-6 / 3.1e-4), the tf.nn.moments path 6.1e-6 / 7.4e-5; towers without
    the rewrite are off by ~1e-2. Both strategies (the all-reduce measured 2.4e-5 / 3.0e-4 before it
    refined each tower's moments)."""
    import numpy as np
    shape = (8, 16, 16, 16)
    for strategy in ("gather", "allreduce", None):
        graph, inputs, seen = _offset_statistics_graph(shape, strategy, kind)
        with tf.compat.v1.Session(graph=graph, config=tl.CONFIG) as sess:
            for offset in (1e3, 1e4):
                var_errors, mean_errors = [], []
                for seed in range(5):
                    rng = np.random.RandomState(seed)
                    parts = [(offset + rng.randn(b, *shape[1:])).astype(np.float32) for b in batch_sizes]
                    got = sess.run(seen, dict(zip(inputs, parts)))
                    whole = np.concatenate(parts).astype(np.float64).reshape(-1, shape[-1])
                    want_var = whole.var(0, ddof=1 if kind == "fused" else 0)
                    tower = next(i for i, b in enumerate(batch_sizes) if b)   # a tower with data
                    mean, var = (np.asarray(v, np.float64) for v in got[tower])
                    var_errors.append(np.max(np.abs(var - want_var) / want_var))
                    mean_errors.append(np.max(np.abs(mean - whole.mean(0)) / np.sqrt(want_var)))
                if strategy:
                    assert np.median(var_errors) <= 3e-6, (strategy, offset, var_errors)
                    assert np.median(mean_errors) <= 1e-3, (offset, mean_errors)
                    assert all(np.all(np.isfinite(v)) for pair in got for v in pair)
                else:
                    assert np.median(var_errors) > 1e-3, (offset, var_errors)
