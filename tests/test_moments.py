"""Moments-based batch norm (tf.nn.moments subgraphs): one training step of the rewritten graph
equals the single-device step on the concatenated batch, and the un-rewritten graph does not.

Tolerances: float64 models agree to ~5e-15 (measured), so 1e-12; float32 ones to ~1e-5 (the
squared loss's gradients through 3-6 layers), so 5e-5. Un-rewritten errors are 1e-2 and more.
"""
import functools
import warnings

import pytest
import tensorflow as tf

import graphsync
import models
import tiers
import towerlib as tl

tf1 = tf.compat.v1
TOLERANCE = {tf.float64: 1e-12, tf.float32: 5e-5}

MODELS = {  # name: (model, input shape, output width)
    "seed": (models.seed_moments(6, layer_norm=True), (6, 6, 3), 5),
    "encoder-decoder": (models.encoder_decoder(), (6, 6, 3), 72),
    "keras-dense": (models.keras_dense_bn(), (2, 2, 3), 5),
    "keras-dense-f64": (models.keras_dense_bn(dtype="float64"), (2, 2, 3), 5),
    "mixed": (models.mixed(), (6, 6, 3), 5),
}

CASES = [
    ("seed", [3, 5, 4], "after", tf.float64),
    ("seed", [4, 4], "before", tf.float64),
    ("seed", [2, 3, 4, 7], "before-sum", tf.float64),
    ("seed", [3, 5], "after", tf.float32),
    ("encoder-decoder", [3, 5, 4], "after", tf.float32),
    ("encoder-decoder", [4, 4], "before-sum", tf.float32),
    ("encoder-decoder", [2, 6, 3, 5], "after", tf.float64),
    ("keras-dense", [3, 5], "after", tf.float32),
    ("keras-dense-f64", [5, 3, 4], "after", tf.float64),
    ("keras-dense-f64", [3, 3], "before", tf.float64),
    ("mixed", [3, 5, 4], "after", tf.float32),
    ("mixed", [4, 4], "before-sum", tf.float32),
]


@functools.lru_cache(maxsize=None)
def _reference(model_key, batch_sizes, dtype):
    model, shape, width = MODELS[model_key]
    x, t = tl.data(list(batch_sizes), shape, (width,), dtype=dtype.as_numpy_dtype)
    return (x, t), tl.reference_step(model, list(batch_sizes), x, t, dtype=dtype, input_shape=shape)


def _errors(model_key, batch_sizes, gradients, dtype, rewrite=True):
    model, shape, _ = MODELS[model_key]
    (x, t), ref = _reference(model_key, tuple(batch_sizes), dtype)
    reports = []
    fn = (lambda g: reports.append(graphsync.rewrite_towers(g))) if rewrite else None
    built = tl.build(model, batch_sizes, gradients=gradients, rewrite=fn, dtype=dtype, input_shape=shape)
    got = tl.run_step(built, x, t, batch_sizes)
    return {k: tl.max_rel_error(got[k], ref[k]) for k in ref}, (reports[0] if reports else None), built


IDS = [f"{m}-{'x'.join(map(str, b))}-{g}-{d.name}" for m, b, g, d in CASES]
FAST = {"seed-3x5-after-float32", "mixed-4x4-before-sum-float32", "keras-dense-3x5-after-float32"}


@pytest.mark.parametrize("model_key,batch_sizes,gradients,dtype", tiers.cases(CASES, IDS, FAST))
def test_step_equals_single_device_reference(model_key, batch_sizes, gradients, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
        errors, report, _ = _errors(model_key, batch_sizes, gradients, dtype)
    assert report.layers and len(report.towers) == len(batch_sizes)
    assert max(errors.values()) < TOLERANCE[dtype], errors
    unsynced, _, _ = _errors(model_key, batch_sizes, gradients, dtype, rewrite=False)
    for key in ("output", "loss", "grads", "moving"):
        assert unsynced[key] > 1e-3, (key, unsynced)


def test_mixed_model_reports_both_kinds_and_leaves_layer_norm_alone():
    _, report, built = _errors("mixed", [3, 5], "after", tf.float32)
    assert sorted(l.kind for l in report.layers) == ["fused", "moments"]
    assert report.summary.startswith("2 layers × 2 towers") and "fused, moments" in report.summary
    skipped = {s.op: s.reason for s in report.skipped}
    assert {"tower_0/layer_norm/mean", "tower_1/layer_norm/mean"} <= set(skipped)
    assert "exclude the batch axis" in skipped["tower_0/layer_norm/mean"]
    layer_norm = built.graph.get_operation_by_name("tower_1/layer_norm/mean")
    assert layer_norm.outputs[0].consumers(), "the layer norm must keep its own statistics"


def test_no_original_moments_op_runs_and_towers_stay_apart():
    _, report, built = _errors("seed", [3, 5, 4], "after", tf.float32)
    old = set()
    for layer in report.layers:
        for name in layer.tower_ops:
            mean_op = built.graph.get_operation_by_name(name)
            sqdiff = [c for c in mean_op.outputs[0].consumers()]
            assert not sqdiff  # nothing reads the old mean, not even its StopGradient
            old.add(name)
            old.add(name.replace("/mean", "/variance"))
            old.add(name.replace("/mean", "/SquaredDifference"))
    executed = tl.executed_nodes(built, [3, 5, 4])
    assert executed and len(old) == 3 * 6 * 3 and not executed & old

    prefixes = [f"tower_{i}/" for i in range(3)]
    for op in built.graph.get_operations():
        home = next((p for p in prefixes if op.name.startswith(p + "gradients")), None)
        for tensor in op.inputs if home else ():
            owner = next((p for p in prefixes if tensor.op.name.startswith(p)), home)
            assert owner == home, f"{op.name} reads {tensor.name}"


def test_second_rewrite_of_a_moments_graph_changes_nothing():
    _, report, built = _errors("mixed", [3, 5], "after", tf.float32)
    before = built.graph.as_graph_def()
    again = graphsync.rewrite_towers(built.graph)
    assert not again.changed and "already synchronized" in again.summary
    assert built.graph.as_graph_def() == before


@pytest.mark.parametrize("model_key", ["seed", "mixed"])
def test_gradients_the_script_names_itself_are_paired(model_key, monkeypatch):
    """tf.gradients(…, name="tower_grads"): its gradient functions sit under `tower_grads/<op>_grad/`,
    not `gradients/`; the moments' gradients are still paired (they were refused as "already built
    by ops graphsync cannot pair"), and the step equals one device."""
    plain = tf.gradients
    monkeypatch.setattr(tf, "gradients", lambda *args, **kw: plain(*args, name="tower_grads", **kw))
    errors, report, built = _errors(model_key, [3, 5], "after", tf.float32)
    assert report.layers and all("tower_grads" in op.name for op in built.graph.get_operations()
                                 if op.name.endswith("_grad/Neg")), report.summary
    assert max(errors.values()) < TOLERANCE[tf.float32], errors
