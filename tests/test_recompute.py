"""rewrite_towers(recompute=True): the backward reads the normalized output and the elementwise ops
after it recomputed, and the step is bit for bit the step without recompute.

Numbers: every variable (trainable and moving statistics) after several steps is *exactly* equal
to the synchronized step without recompute, and one step matches one device on the concatenated
batch (towerlib.tolerance). Structure, which fails without the feature: no gradient op reads the
forward's activations any more (only shape readers do), the copies wait for a gradient tensor, and
they still run after Grappler (step statistics name them).
"""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import graphsync
from graphsync.graph.marks import is_recomputed
from graphsync.graph.backward import is_backward
import models
import tiers
import towerlib as tl

tf1 = tf.compat.v1
INPUT_SHAPE = (6, 6, 3)

MODELS = {
    "raw-fused": models.resnetish(depth=3),
    "layers-fused": models.layers_bn(depth=2),
    "moments": models.seed_moments(depth=3),
    "keras": models.keras_bn(depth=2),
}


_steps = tl.variables_after   # every variable after several training steps


def _forward_activations(graph):
    """The towers' forward outputs of the activations after their batch norms."""
    return [op.outputs[0] for op in graph.get_operations()
            if op.type == "Relu" and op.name.startswith("tower_") and not is_backward(op)
            and not is_recomputed(op)]


def _gradient_readers(tensors):
    return [c.name for t in tensors for c in t.consumers()
            if is_backward(c) and c.type not in ("Shape", "ShapeN", "Size", "Rank")]


@pytest.mark.parametrize("model_key,strategy,batch_sizes", [
    ("raw-fused", "gather", [3, 5]),
    pytest.param("layers-fused", "allreduce", [4, 4], marks=tiers.full),
    pytest.param("moments", "gather", [3, 5], marks=tiers.full),
    pytest.param("keras", "allreduce", [2, 3, 3], marks=tiers.full),
])
def test_recomputed_step_is_bit_for_bit_and_one_device(model_key, strategy, batch_sizes):
    model = MODELS[model_key]
    x, t = tl.data(batch_sizes, INPUT_SHAPE, (5,))
    reports = []
    plain = tl.build(model, batch_sizes, rewrite=lambda g: reports.append(
        graphsync.rewrite_towers(g, strategy=strategy)))
    recomputed = tl.build(model, batch_sizes, rewrite=lambda g: reports.append(
        graphsync.rewrite_towers(g, strategy=strategy, recompute=True)))
    assert reports[1].recompute and reports[1].recomputed >= len(reports[1].layers) * len(batch_sizes)
    assert f"recomputed in the backward: {reports[1].recomputed} tensors" in str(reports[1])

    # without recompute the backward reads the forward's activations; with it, none does
    assert _gradient_readers(_forward_activations(plain.graph))
    assert not _gradient_readers(_forward_activations(recomputed.graph))
    copies = [op for op in recomputed.graph.get_operations() if is_recomputed(op)]
    assert copies and all(op.control_inputs and all(is_backward(c) for c in op.control_inputs)
                          for op in copies)
    assert all(op.device == op.inputs[0].op.device or op.device for op in copies)

    # bit for bit: every variable after several steps
    want, got = _steps(plain, x, t, batch_sizes), _steps(recomputed, x, t, batch_sizes)
    assert len(want) == len(got)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)

    # and one device on the concatenated batch
    ref = tl.reference_step(model, batch_sizes, x, t)
    reordered = tl.reordered_reference_step(model, batch_sizes, x, t)
    noise = max(tl.max_rel_error(reordered[k], ref[k]) for k in ref)
    one = tl.run_step(recomputed, x, t, batch_sizes)
    tolerance = tl.tolerance(tf.float32, noise, sum(batch_sizes) * INPUT_SHAPE[0] * INPUT_SHAPE[1])
    errors = {k: tl.max_rel_error(one[k], ref[k]) for k in ref}
    assert max(errors.values()) <= tolerance, errors


def test_copies_survive_grappler_and_run():
    """The copies are still separate nodes when the step runs (Grappler's CSE did not merge them
    back into the forward), on their tower's device."""
    batch_sizes = [3, 5]
    built = tl.build(MODELS["raw-fused"], batch_sizes, rewrite=lambda g: graphsync.rewrite_towers(g, recompute=True))
    copies = {op.name for op in built.graph.get_operations() if is_recomputed(op)}
    ran = tl.executed_nodes(built, batch_sizes)
    assert copies and copies <= ran, sorted(copies - ran)


@pytest.mark.parametrize("model_key,strategy", [("raw-fused", "gather"),
                                                pytest.param("moments", "allreduce", marks=tiers.full),
                                                pytest.param("keras", "gather", marks=tiers.full)])
def test_gradients_built_after_the_rewrite_read_copies_too(model_key, strategy):
    """recompute=True before the gradients exist: the gradient functions graphsync registered move
    the backward's readers onto copies when tf.gradients builds them; the step is bit for bit the
    one without recompute, and one device's."""
    batch_sizes = [3, 5]
    model = MODELS[model_key]
    reports = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = tl.build(model, batch_sizes, gradients="before", rewrite=lambda g: reports.append(
            graphsync.rewrite_towers(g, strategy=strategy, recompute=True)))
    assert not [w for w in caught if "recompute" in str(w.message)], [str(w.message) for w in caught]
    assert reports[0].recomputed == 0 and reports[0].recompute_deferred == len(reports[0].layers)
    assert f"{len(reports[0].layers)} layers when their gradients are built" in str(reports[0])
    plain = tl.build(model, batch_sizes, gradients="before",
                     rewrite=lambda g: graphsync.rewrite_towers(g, strategy=strategy))
    assert _gradient_readers(_forward_activations(plain.graph))
    assert not _gradient_readers(_forward_activations(built.graph))
    x, t = tl.data(batch_sizes, INPUT_SHAPE, (5,))
    for a, b in zip(_steps(plain, x, t, batch_sizes, 2), _steps(built, x, t, batch_sizes, 2), strict=True):
        np.testing.assert_array_equal(a, b)
    ref = tl.reference_step(model, batch_sizes, x, t)
    noise = max(tl.max_rel_error(v, ref[k]) for k, v in tl.reordered_reference_step(model, batch_sizes, x, t).items())
    one = tl.run_step(built, x, t, batch_sizes)
    tolerance = tl.tolerance(tf.float32, noise, sum(batch_sizes) * INPUT_SHAPE[0] * INPUT_SHAPE[1])
    errors = {k: tl.max_rel_error(one[k], ref[k]) for k in ref}
    assert max(errors.values()) <= tolerance, errors


def test_sync_batch_norm_hook_passes_recompute_on():
    built = tl.build(MODELS["raw-fused"], [3, 5])
    with built.graph.as_default():
        hook = graphsync.SyncBatchNormHook(recompute=True)
        hook.begin()
    assert hook.report.recompute and hook.report.recomputed == 3 * 2   # one ReLU output per layer and tower
    assert not _gradient_readers(_forward_activations(built.graph))


def test_graphsync_rewrite_recompute_writes_a_graph_that_keeps_its_copies(tmp_path):
    """`graphsync rewrite --recompute`: the report says how many tensors, and the saved graph keeps
    the copies, their attribute and their ordering."""
    import json
    from click.testing import CliRunner
    from cli.main import main
    from fixture_paths import META2
    out = tmp_path / "synced.meta"
    result = CliRunner().invoke(main, ["rewrite", str(META2), "-o", str(out), "--recompute", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["recompute"] and report["recomputed"] > 0
    graph = tf.Graph()
    with graph.as_default():
        tf1.train.import_meta_graph(str(out))
    copies = [op for op in graph.get_operations() if is_recomputed(op)]
    assert len(copies) >= report["recomputed"] and all(op.control_inputs for op in copies)


@tiers.full
@pytest.mark.parametrize("mode", ["layers", "segments"])
def test_graphsync_run_recompute_trains_bit_for_bit_like_without(mode):
    """`graphsync run --recompute layers|segments` on an unchanged script: the same variables, bit
    for bit, as `graphsync run`, and the report counts the recomputed tensors."""
    import json
    import test_run
    tmp = __import__("tempfile").mkdtemp()
    runs = {name: test_run._start(test_run._graphsync() + ["run"] + extra + ["--report", f"{tmp}/{name}.json",
                                                                           test_run.TRAIN, f"{tmp}/{name}.npz"])
            for name, extra in (("plain", []), ("recompute", ["--recompute", mode]))}
    for name, process in runs.items():
        result = test_run._finish(process)
        assert result.returncode == 0, result.stderr[-2000:]
    with open(f"{tmp}/recompute.json") as f:
        reports = json.load(f)["graphs"]
    assert reports and all(r["recompute"] == mode and r["recomputed"] > 0 for r in reports)
    plain, recomputed = test_run._loops(f"{tmp}/plain.npz"), test_run._loops(f"{tmp}/recompute.npz")
    assert plain.keys() == recomputed.keys()
    for loop in plain:
        for name in plain[loop]:
            np.testing.assert_array_equal(plain[loop][name], recomputed[loop][name])
