"""Reductions the rule finds and no form covers (EvoNorm-B0, Switchable Norm, masked batch norm over
steps, statistics after an atrous convolution, …) (graphsync/plan/reductions.py, splice/reduction.py):
one training step of the rewritten graph equals the single-device step on the concatenated batch —
outputs, per-tower losses, gradients, updated variables — and the un-rewritten graph does not
(off by more than 3× the tolerance). Three uneven towers; gradients built before and after the
rewrite; gather and all-reduce; float32 and float64.

Tolerances from towerlib.tolerance: 4× the distance between two one-device runs of the batch in
different orders (float32), at least 2·u·√n (float64: that bound alone, 4e-15; measured ≤ 1e-15,
float32 ≤ 2e-6). Un-rewritten errors are 0.05 and more. Measured errors are printed by `-s`.
"""
import functools
import itertools
import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import graphsync
import tiers
import towerlib as tl
from graphsync import batch_axis

tf1 = tf.compat.v1
BATCHES = (2, 3, 4)
EPSILON = 1e-3
WIDTH = 5


def _variable(name, shape, dtype, low=0.5, high=1.5):
    return tf1.get_variable(name, shape, dtype, tf1.random_uniform_initializer(low, high, seed=len(name)))


def _conv(h, name, channels=4):
    w = tf1.get_variable(name, [3, 3, h.shape[-1], channels], h.dtype,
                         tf1.random_normal_initializer(stddev=0.3, seed=len(name)))
    return tf.nn.conv2d(h, w, 1, "SAME")


def _affine(h, name):
    return h * _variable(name + "_gamma", [h.shape[-1]], h.dtype) + _variable(name + "_beta", [h.shape[-1]], h.dtype,
                                                                                -0.5, 0.5)


def _mask(h):   # per pixel (or step), computed in the tower from the data: it differs between towers
    return tf.cast(h[..., :1] > -0.5, h.dtype)


def _evonorm_b0(h):
    """EvoNorm-B0: x / max(√(batch variance + ε), v·x + instance std), then γ, β."""
    batch_variance = tf.math.reduce_variance(h, [0, 1, 2], keepdims=True)
    instance_std = tf.sqrt(tf.math.reduce_variance(h, [1, 2], keepdims=True) + EPSILON)
    v = _variable("evonorm_v", [h.shape[-1]], h.dtype)
    return _affine(h / tf.maximum(tf.sqrt(batch_variance + EPSILON), v * h + instance_std), "evonorm")


def _weighted_folded(h):
    mean, variance = tf.nn.weighted_moments(h, [0, 1, 2], _mask(h))   # static shapes: zeros_like is a Const
    return _affine((h - mean) * tf.math.rsqrt(variance + EPSILON), "weighted")


def _sums(h):
    """A Sum over the batch axis alone (keep_dims) and a Mean over the batch and one more axis."""
    h = h * tf.math.rsqrt(tf.reduce_sum(tf.square(h), [0], keepdims=True) + 1.0)
    return h - tf.reduce_mean(h, [0, 1])


def _min_max_scaling(h):
    """(h − min) / (max − min + 1) over the batch: the extremum's gradient goes to the elements
    equal to it, split among all towers' ties (duplicated examples make some, see _reference)."""
    low = tf.reduce_min(h, [0, 1, 2])
    return _affine((h - low) / (tf.reduce_max(h, [0, 1], keepdims=True) - low + 1.0), "bn")


def _switchable(h):
    """Switchable Normalization: softmax-weighted instance, layer and batch statistics, the layer
    and batch ones made from the instance ones (means over channels, over the batch)."""
    mean_in, var_in = tf.nn.moments(h, [1, 2], keepdims=True)
    square_in = var_in + tf.square(mean_in)
    mean_ln = tf.reduce_mean(mean_in, [3], keepdims=True)
    var_ln = tf.reduce_mean(square_in, [3], keepdims=True) - tf.square(mean_ln)
    mean_bn = tf.reduce_mean(mean_in, [0], keepdims=True)
    var_bn = tf.reduce_mean(square_in, [0], keepdims=True) - tf.square(mean_bn)
    w_mean, w_var = (tf.nn.softmax(_variable(f"sn_{k}_weights", [3], h.dtype, -1.0, 1.0)) for k in ("mean", "var"))
    mean = w_mean[0] * mean_in + w_mean[1] * mean_ln + w_mean[2] * mean_bn
    variance = w_var[0] * var_in + w_var[1] * var_ln + w_var[2] * var_bn
    return _affine((h - mean) * tf.math.rsqrt(variance + EPSILON), "sn")


def _after_atrous(h):
    """DeepLab's atrous convolution (SpaceToBatchND, Conv2D, BatchToSpaceND), then a batch variance."""
    w = tf1.get_variable("atrous", [3, 3, h.shape[-1], 4], h.dtype, tf1.random_normal_initializer(stddev=0.3, seed=6))
    h = tf.nn.atrous_conv2d(h, w, 2, "SAME")
    return _affine(h * tf.math.rsqrt(tf.math.reduce_variance(h, [0, 1, 2]) + EPSILON), "bn")


def _declared_per_example(h):
    """An op type the trace has no rule for (Erfinv), then a centring: refused unless the user
    declares the op per example (GRAPHSYNC_PER_EXAMPLE_OPS, set for this module by `declared`)."""
    h = tf.math.erfinv(0.9 * tf.tanh(h))
    return _affine(h - tf.reduce_mean(h, [0, 1, 2]), "bn")


FORMS = {   # name: h -> normalized h, written as users write them
    "reduce_variance": lambda h: _affine(h * tf.math.rsqrt(tf.math.reduce_variance(h, [0, 1, 2]) + EPSILON), "bn"),
    "reduce_std": lambda h: _affine(h / (tf.math.reduce_std(h, [0, 1, 2]) + EPSILON), "bn"),
    "mean_only": lambda h: _affine(h - tf.reduce_mean(h, [0, 1, 2]), "bn"),
    "sum_and_partial_mean": _sums,
    "weighted_folded": _weighted_folded,
    "evonorm_b0": _evonorm_b0,
    "min_max_scaling": _min_max_scaling,
    "switchable": _switchable,
    "after_atrous": _after_atrous,
    "declared_per_example": _declared_per_example,
    "masked_sequence": None,   # [N, T, C] with a mask per step: _sequence_model
}
STATIC = ("weighted_folded",)   # built with static batch sizes per tower (the rest: dynamic)
REDUCTIONS = {   # how many reductions each layer a report lists holds (graphsync/plan/normalizations.py)
    "reduce_variance": [2], "reduce_std": [2], "mean_only": [1], "weighted_folded": [3], "evonorm_b0": [2],
    "after_atrous": [2], "declared_per_example": [1], "masked_sequence": [3],
    "sum_and_partial_mean": [1, 1], "min_max_scaling": [1, 1],   # over different axes: two statistics
}   # switchable: its batch mean and variance share no activation the grouping follows (two layers)
CASES = [  # gradients, strategy, dtype
    ("after", "gather", tf.float64),
    ("before", "allreduce", tf.float64),
    ("before-sum", "gather", tf.float32),
    ("after", "allreduce", tf.float32),
]
IMAGE, SEQUENCE = (6, 6, 3), (5, 3)


def _image_model(form, sizes):
    sizes = iter(sizes)

    def model(x):
        if form in STATIC:
            x = tf.ensure_shape(x, [next(sizes)] + x.shape.as_list()[1:])
        h = FORMS[form](_conv(x, "c1"))
        return tf.reduce_mean(_conv(tf.nn.relu(h), "c2", WIDTH), [1, 2]), []
    return model


def _dense(h, name, width):
    w = tf1.get_variable(name, [h.shape[-1], width], h.dtype, tf1.random_normal_initializer(stddev=0.5, seed=len(name)))
    return tf.matmul(h, w)


def _sequence_model(form, sizes):
    def model(x):
        """Masked batch norm over examples and steps: mean Σ(h·m)/Σm, variance Σ((h − mean)²·m)/Σm."""
        h = _dense(x, "w1", 4)
        mask = _mask(x)
        count = tf.reduce_sum(mask, [0, 1])
        mean = tf.reduce_sum(h * mask, [0, 1]) / count
        variance = tf.reduce_sum(tf.square(h - mean) * mask, [0, 1]) / count
        h = _affine((h - mean) * tf.math.rsqrt(variance + EPSILON), "bn") * mask
        return tf.reduce_mean(_dense(tf.nn.relu(h), "w2", WIDTH), [1]), []
    return model


def model_of(form, sizes):
    return (_sequence_model if form == "masked_sequence" else _image_model)(form, sizes)


def _shape(form):
    return SEQUENCE if form == "masked_sequence" else IMAGE


@pytest.fixture(autouse=True)
def declared(monkeypatch):
    """Erfinv declared per example for every test here, as a user would declare a custom op."""
    monkeypatch.setenv(batch_axis.PER_EXAMPLE_ENV, "Erfinv")


@functools.lru_cache(maxsize=None)
def _reference(form, dtype):
    """(x, t), one device's step, and the tolerance (from one device's step on reordered examples)."""
    x, t = tl.data(list(BATCHES), _shape(form), (WIDTH,), dtype=dtype.as_numpy_dtype)
    if form == "min_max_scaling":   # tower 1 repeats tower 0's examples: extrema tie across towers
        x[BATCHES[0]:2 * BATCHES[0]] = x[:BATCHES[0]]
    kw = dict(dtype=dtype, input_shape=_shape(form))
    ref = tl.reference_step(model_of(form, [sum(BATCHES)]), list(BATCHES), x, t, **kw)
    noise = 0.0   # float64: 2·u·√n bounds it (measured reorderings ≤ 1e-16), one run spared per form
    if dtype != tf.float64:
        again = tl.reordered_reference_step(model_of(form, [sum(BATCHES)]), list(BATCHES), x, t, **kw)
        noise = max(tl.max_rel_error(again[k], ref[k]) for k in ("output", "loss", "grads", "variables"))
    return (x, t), ref, tl.tolerance(dtype, noise, sum(BATCHES) * int(np.prod(_shape(form)[:-1])))


def _errors(form, gradients, strategy, dtype, rewrite=True, batches=BATCHES):
    (x, t), ref, _ = _reference(form, dtype)
    reports = []
    fn = (lambda g: reports.append(graphsync.rewrite_towers(g, strategy=strategy))) if rewrite else None
    built = tl.build(model_of(form, batches), list(batches), gradients=gradients, rewrite=fn, dtype=dtype,
                     input_shape=_shape(form))
    got = tl.run_step(built, x, t, list(batches))
    return {k: tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "variables")}, reports, built


@functools.lru_cache(maxsize=None)
def _synchronized(form, gradients, strategy, dtype):
    errors, reports, _ = _errors(form, gradients, strategy, dtype)
    return errors, reports


@functools.lru_cache(maxsize=None)
def _unsynchronized(form, dtype):
    return _errors(form, "after", "gather", dtype, rewrite=False)[0]


STEP_CASES = [(f, *c) for f, c in itertools.product(FORMS, CASES)]
STEP_IDS = [f"{f}-{g}-{s}-{d.name}" for f, g, s, d in STEP_CASES]
FAST = {STEP_IDS[i * len(CASES) + i % len(CASES)] for i in range(len(FORMS))}   # every form once, cases in turn


@pytest.mark.parametrize("form,gradients,strategy,dtype", tiers.cases(STEP_CASES, STEP_IDS, FAST))
def test_step_equals_single_device_reference(form, gradients, strategy, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphsync.GraphsyncWarning)   # nothing left per tower
        errors, reports = _synchronized(form, gradients, strategy, dtype)
    tolerance = _reference(form, dtype)[2]
    unsynchronized = _unsynchronized(form, dtype)
    print(f"\n{form} {gradients} {strategy} {dtype.name}: tolerance {tolerance:.1e}, rewritten "
          f"{max(errors.values()):.1e} {errors}, unrewritten {max(unsynchronized.values()):.1e}")
    assert reports and reports[0].layers and "reduction" in {l.kind for l in reports[0].layers}, reports
    if form in REDUCTIONS:
        assert [len(l.reductions) for l in reports[0].layers] == REDUCTIONS[form], str(reports[0])
    assert max(errors.values()) < tolerance, (errors, tolerance)
    assert unsynchronized["output"] > 3 * tolerance and unsynchronized["grads"] > 3 * tolerance, \
        (unsynchronized, tolerance)


@pytest.mark.parametrize("gradients,strategy", [("after", "gather"), ("before", "allreduce")])
def test_a_tower_without_examples(gradients, strategy):
    """Counts come from run-time shapes: a tower of 0 examples adds nothing, NaN nowhere."""
    batches = (BATCHES[0] + BATCHES[1], 0, BATCHES[2])
    errors, _, _ = _errors("reduce_variance", gradients, strategy, tf.float64, batches=batches)
    del errors["loss"]   # the reference's losses are per tower of BATCHES
    assert max(errors.values()) < _reference("reduce_variance", tf.float64)[2], errors


def test_nested_statistics_are_spliced_inner_first():
    """reduce_variance: the mean, then the variance of the deviations from the synchronized mean."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
        _, reports = _synchronized("reduce_variance", "after", "gather", tf.float64)
    assert [(l.name, l.reductions) for l in reports[0].layers] == [
        ("reduce_variance", ("reduce_variance/Mean", "reduce_variance/Mean_1"))], str(reports[0])


@pytest.mark.parametrize("form,gradients,strategy", [("mean_only", "before", "gather"),
                                                    ("min_max_scaling", "before", "allreduce")])
def test_second_rewrite_changes_nothing(form, gradients, strategy):
    """Rewritten before its gradients, each tower reads its views, which the rule counts as merges."""
    built = tl.build(model_of(form, BATCHES), list(BATCHES), gradients=gradients, dtype=tf.float64,
                     rewrite=lambda g: graphsync.rewrite_towers(g, strategy=strategy), input_shape=IMAGE)
    before = built.graph.as_graph_def()
    assert not graphsync.rewrite_towers(built.graph, strategy=strategy).changed
    assert built.graph.as_graph_def() == before


def test_a_product_over_the_batch_stays_refused():
    """Prod is not synchronized: refused, in one line."""
    def model(x):
        h = _conv(x, "c1")
        return tf.reduce_mean(_conv(h * tf.reduce_prod(tf.sigmoid(h), [0, 1, 2]), "c2", WIDTH), [1, 2]), []
    with pytest.raises(graphsync.GraphsyncError, match=r"^tower_0/Prod \(Prod\) computes a batch statistic"):
        tl.build(model, list(BATCHES), rewrite=graphsync.rewrite_towers)


def test_an_op_type_without_a_rule_read_back_is_refused_until_declared(monkeypatch):
    """Undeclared, Erfinv ends the trace and the model reads back a mean past it: Erfinv might
    combine examples, so the rewrite is refused in one line naming the remedy, the graph left alone.
    (Declared, it trains as one device: test_step_equals_single_device_reference.)"""
    monkeypatch.delenv(batch_axis.PER_EXAMPLE_ENV)
    built = tl.build(model_of("declared_per_example", BATCHES), list(BATCHES), dtype=tf.float64, input_shape=IMAGE)
    before = built.graph.as_graph_def()
    with pytest.raises(graphsync.GraphsyncError) as refused:
        graphsync.rewrite_towers(built.graph)
    message = str(refused.value)
    assert "\n" not in message and re.match(
        r"tower_\d/Mean \(Mean\) reduces a tensor the batch axis could not be followed into \(past "
        r"tower_\d/erfinv/Erfinv: no rule for op type Erfinv\), and the model reads it back \(and 2 more: "
        r"graphsync inspect\): graphsync cannot tell "
        r"whether Erfinv combines examples; if it keeps each example apart \(batch on axis 0\), declare it: "
        r"GRAPHSYNC_PER_EXAMPLE_OPS=Erfinv; else compute it outside the towers$", message), message
    assert built.graph.as_graph_def() == before


def _fused_and_centring(x):
    h = _conv(x, "c1")
    h = _conv(tf.nn.relu(h - tf.reduce_mean(h, [0, 1, 2])), "c2")
    h = tf1.layers.batch_normalization(h, training=True, fused=True, name="bn")
    return tf.reduce_mean(_conv(tf.nn.relu(h), "c3", WIDTH), [1, 2]), []


@functools.lru_cache(maxsize=None)
def _beside_reference():
    """(x, t), one device's step, and how far the un-rewritten graph's gradients are from it."""
    x, t = tl.data(list(BATCHES), IMAGE, (WIDTH,), dtype=np.float64)
    ref = tl.reference_step(_fused_and_centring, list(BATCHES), x, t, dtype=tf.float64)
    unsynchronized = tl.run_step(tl.build(_fused_and_centring, list(BATCHES), dtype=tf.float64), x, t, list(BATCHES))
    return (x, t), ref, tl.max_rel_error(unsynchronized["grads"], ref["grads"])


@pytest.mark.parametrize("gradients,strategy", [("after", "allreduce"), ("before", "gather")])
def test_beside_a_recognized_batch_norm(gradients, strategy):
    """A recognized form keeps its own path (tf.compat.v1.layers' float64 batch norm runs
    tf.nn.moments: no fused float64 kernel); the centring beside it is a reduction layer."""
    (x, t), ref, unsynchronized = _beside_reference()
    reports = []
    built = tl.build(_fused_and_centring, list(BATCHES), gradients=gradients, dtype=tf.float64,
                     rewrite=lambda g: reports.append(graphsync.rewrite_towers(g, strategy=strategy)))
    got = tl.run_step(built, x, t, list(BATCHES))
    assert sorted(l.kind for l in reports[0].layers) == ["moments", "reduction"], str(reports[0])
    errors = {k: tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "variables")}
    tolerance = tl.tolerance(tf.float64, 0.0, sum(BATCHES) * 36)
    assert max(errors.values()) < tolerance and unsynchronized > 3 * tolerance, (errors, unsynchronized)


@tiers.full   # two worker processes: tests/test_between_graph.py's fast case
@pytest.mark.parametrize("through", ["collectives", "ps"])
@pytest.mark.parametrize("form,gradients", [("reduce_variance", "after"), ("reduce_variance", "before"),
                                            ("min_max_scaling", "after"), ("min_max_scaling", "before")])
def test_between_worker_processes(form, gradients, through, tmp_path):
    """Two worker processes of one tower each (between-graph replication, tests/between_graph_worker.py),
    their variables on the workers (collectives) or on a ps task (queues on it): the reductions are
    summed (Max/Min: merged, their ties counted) over both workers, gradients built before and
    after the rewrite, against one device on the concatenated batch; each worker alone on its
    shard is off by far more."""
    import cluster as cl
    sizes = [3, 5]
    x, t = tl.data(sizes, IMAGE, (WIDTH,))
    if form == "min_max_scaling":   # worker 1 repeats worker 0's examples: extrema tie across processes
        x[3:6] = x[:3]
    np.savez(tmp_path / "batch.npz", x=x, t=t)
    spec = cl.cluster_spec({"worker": 2, **({"ps": 1} if through == "ps" else {})})
    with cl.servers(spec, jobs=["ps"]):
        got = cl.between_graph_step(spec, sizes, tmp_path / "workers", options={
            "form": form, "gradients": gradients, "data": str(tmp_path / "batch.npz")})
    ref = tl.reference_step(model_of(form, [sum(sizes)]), sizes, x, t)
    # reduce_variance: one layer of two reductions; min-max scaling: a Min and a Max over different axes
    assert list(got[0]["kinds"]) == ["reduction"] * (1 if form == "reduce_variance" else 2), got[0]["kinds"]
    assert str(got[0]["strategy"]) == ("ps" if through == "ps" else "allreduce"), got[0]["strategy"]
    errors = {"output": tl.max_rel_error(np.concatenate([g["output"] for g in got]), ref["output"]),
              "loss": tl.max_rel_error(np.concatenate([g["loss"] for g in got]), ref["loss"]),
              "grads": tl.max_rel_error(got[0]["grads"] + got[1]["grads"],
                                        np.concatenate([g.ravel() for g in ref["grads"]]))}
    alone = [tl.reference_step(model_of(form, [n]), [n], x[s:s + n], t[s:s + n]) for n, s in ((3, 0), (5, 3))]
    apart = tl.max_rel_error(np.concatenate([a["output"] for a in alone]), ref["output"])
    print(f"\n{form} between 2 workers through {through}, gradients {gradients}: {errors}, each worker alone "
          f"{apart:.1e}")
    assert max(errors.values()) < 2e-5, errors
    assert apart > 1e-2, apart
