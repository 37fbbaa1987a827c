"""rewrite_towers(recompute="segments"): the backward reads whole forward segments — convolutions,
pooling, concatenations, elementwise ops and the synchronized normalizations — recomputed from
checkpoints, and the step is bit for bit the synchronized step without recompute.

Numbers: every variable (trainable and moving statistics) after several steps is *exactly* equal
to the synchronized step without recompute, and one step matches one device on the concatenated
batch (towerlib.tolerance). Structure, which fails without the feature: the backward no longer
reads the forward's convolution outputs inside a segment, and no copy computes a statistic, runs
an exchange, updates a variable or draws random numbers; the copies run, on their towers'
devices, after the backward has begun (step statistics name them).
"""
import os
import warnings

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import graphsync
import handwritten_models as hm
import models
import tiers
import towerlib as tl
from graphsync.errors import GraphsyncError
from graphsync.graph.backward import is_backward
from graphsync.splice import segments
from graphsync.graph.marks import is_recomputed

tf1 = tf.compat.v1
INPUT_SHAPE = (6, 6, 3)
_SHAPES = ("Shape", "ShapeN", "Size", "Rank")


def dropout_net(depth=3):
    """conv → fused batch norm → relu → dropout (seeded), `depth` times: random values inside a segment."""
    def model(x):
        h, updates = models._conv(x, 4, "stem"), []
        for i in range(depth):
            h, up = models.raw_fused_bn(h, f"bn{i}")
            updates += up
            h = tf.nn.dropout(tf.nn.relu(h), rate=0.3, seed=11 + i)
            h = models._conv(h, 4, f"conv{i}")
        return models._head(h), updates
    return model


MODELS = {
    "resnet-fused": models.resnetish(depth=4),
    "encoder-decoder": models.encoder_decoder(fused=True),
    "moments": models.seed_moments(depth=4),
    "keras": models.keras_bn(depth=3),
    "reductions": hm.conv_net("weighted-channel", depth=3),
    "dropout": dropout_net(),
}
CASES = [("resnet-fused", "gather", [3, 5]), ("encoder-decoder", "allreduce", [2, 3, 3]),
         ("moments", "gather", [3, 5]), ("keras", "allreduce", [4, 4]), ("reductions", "gather", [3, 4]),
         ("dropout", "allreduce", [3, 5])]


_steps = tl.variables_after   # every variable after several training steps


def copies(graph):
    return [op for op in graph.get_operations() if is_recomputed(op)]


def convolutions_read_by_the_backward(graph):
    """The towers' forward convolutions whose outputs a gradient op reads (beyond a shape)."""
    return [op.name for op in graph.get_operations()
            if op.type == "Conv2D" and op.name.startswith("tower_") and not is_backward(op)
            and not is_recomputed(op)
            and any(is_backward(c) and c.type not in _SHAPES and _runs(c) for c in op.outputs[0].consumers())]


def _runs(op):
    """Whether anything reads `op`: a gradient op the rewrite replaced is left unread."""
    return any(t.consumers() for t in op.outputs) or bool(op._control_outputs)  # noqa: SLF001


def assert_no_statistic_recomputed(graph):
    """No copy computes a batch statistic, exchanges, updates, reads a variable or draws a random number."""
    for op in copies(graph):
        assert not op.op_def.is_stateful, op.name
        assert not (op.type.startswith("FusedBatchNorm") and op.get_attr("is_training")), op.name
        assert not op.name.startswith("graphsync/"), op.name   # the exchange's own scope
        if op.type in ("Mean", "Sum", "Max", "Min"):
            axes = tf.get_static_value(op.inputs[1])
            assert axes is not None and 0 not in [int(a) % op.inputs[0].shape.rank for a in np.ravel(axes)], op.name
        assert op.control_inputs and all(is_backward(c) for c in op.control_inputs), op.name


def assert_one_device(model, built, x, t, batch_sizes):
    ref = tl.reference_step(model, batch_sizes, x, t)
    noise = max(tl.max_rel_error(v, ref[k]) for k, v in tl.reordered_reference_step(model, batch_sizes, x, t).items())
    one = tl.run_step(built, x, t, batch_sizes)
    tolerance = tl.tolerance(tf.float32, noise, sum(batch_sizes) * INPUT_SHAPE[0] * INPUT_SHAPE[1])
    errors = {k: tl.max_rel_error(one[k], ref[k]) for k in ref}
    assert max(errors.values()) <= tolerance, errors


@pytest.mark.parametrize("model_key,strategy,batch_sizes", tiers.cases(
    CASES, [c[0] for c in CASES], fast={"resnet-fused", "encoder-decoder"}))
def test_segments_are_bit_for_bit_and_one_device(model_key, strategy, batch_sizes):
    model = MODELS[model_key]
    x, t = tl.data(batch_sizes, INPUT_SHAPE, (5,) if model_key != "encoder-decoder" else (72,))
    reports = []
    plain = tl.build(model, batch_sizes, rewrite=lambda g: reports.append(
        graphsync.rewrite_towers(g, strategy=strategy)))
    built = tl.build(model, batch_sizes, rewrite=lambda g: reports.append(
        graphsync.rewrite_towers(g, strategy=strategy, recompute="segments")))
    report = reports[1]
    assert report.recompute == "segments" and report.recomputed > 0
    assert f"recomputed in the backward: {report.recomputed} tensors, whole forward segments" in str(report)

    # convolutions run again in the backward, and nothing that makes or exchanges a statistic does
    made = copies(built.graph)
    assert "Conv2D" in {op.type for op in made}, sorted({op.type for op in made})
    assert len(convolutions_read_by_the_backward(built.graph)) < len(convolutions_read_by_the_backward(plain.graph))
    assert_no_statistic_recomputed(built.graph)
    assert all(op.device == op.inputs[0].op.device for op in made if op.inputs[0].op.device)
    if model_key == "dropout":
        assert not [op for op in made if "Random" in op.type]
        assert any(op.type in ("GreaterEqual", "SelectV2", "Mul") and "dropout" in op.name for op in made)

    # bit for bit: every variable after several steps
    for a, b in zip(_steps(plain, x, t, batch_sizes), _steps(built, x, t, batch_sizes), strict=True):
        np.testing.assert_array_equal(a, b)
    assert_one_device(model, built, x, t, batch_sizes)


def test_the_copies_run_and_nothing_is_exchanged_twice():
    """After Grappler the copies are still separate nodes and run; the step runs the same exchange
    ops as without recompute (the statistics are not exchanged again) and one more of each
    recomputed convolution."""
    batch_sizes = [3, 5]
    plain = tl.build(MODELS["resnet-fused"], batch_sizes, rewrite=lambda g: graphsync.rewrite_towers(g))
    built = tl.build(MODELS["resnet-fused"], batch_sizes,
                     rewrite=lambda g: graphsync.rewrite_towers(g, recompute="segments"))
    made = copies(built.graph)
    ran, ran_plain = tl.executed_nodes(built, batch_sizes), tl.executed_nodes(plain, batch_sizes)
    # Grappler's remapper may fuse a copied activation into the copied normalization before it
    fused = {op.name for op in made if op.type == "Relu" and op.inputs[0].op.name in ran}
    assert made and {op.name for op in made} - fused <= ran, sorted({op.name for op in made} - fused - ran)
    exchange = {n for n in ran if n.startswith("graphsync/")}
    assert exchange and exchange == {n for n in ran_plain if n.startswith("graphsync/")}
    assert {n for n in ran if "_recompute/Conv2D" in n}


@pytest.mark.parametrize("model_key,strategy", [("resnet-fused", "gather"),
                                                pytest.param("moments", "allreduce", marks=tiers.full),
                                                pytest.param("encoder-decoder", "gather", marks=tiers.full)])
def test_gradients_built_after_the_rewrite_recompute_segments_too(model_key, strategy):
    """Rewritten before the gradients exist: each segment is recomputed when tf.gradients reaches
    its layers; the step is bit for bit the one without recompute, and one device's."""
    batch_sizes = [3, 5]
    model = MODELS[model_key]
    reports = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = tl.build(model, batch_sizes, gradients="before", rewrite=lambda g: reports.append(
            graphsync.rewrite_towers(g, strategy=strategy, recompute="segments")))
    assert not [w for w in caught if "recompute" in str(w.message)], [str(w.message) for w in caught]
    assert reports[0].recomputed == 0 and reports[0].recompute_deferred == len(reports[0].layers)
    plain = tl.build(model, batch_sizes, gradients="before",
                     rewrite=lambda g: graphsync.rewrite_towers(g, strategy=strategy))
    assert "Conv2D" in {op.type for op in copies(built.graph)}
    assert len(convolutions_read_by_the_backward(built.graph)) < len(convolutions_read_by_the_backward(plain.graph))
    assert_no_statistic_recomputed(built.graph)
    x, t = tl.data(batch_sizes, INPUT_SHAPE, (5,) if model_key != "encoder-decoder" else (72,))
    for a, b in zip(_steps(plain, x, t, batch_sizes, 2), _steps(built, x, t, batch_sizes, 2), strict=True):
        np.testing.assert_array_equal(a, b)
    assert_one_device(model, built, x, t, batch_sizes)


@pytest.mark.parametrize("value", ["segment", 1, "True", "layers"])
def test_any_other_value_is_a_one_line_error_and_the_graph_is_untouched(value):
    built = tl.build(MODELS["resnet-fused"], [3, 5])
    before = len(built.graph.get_operations())
    with pytest.raises(GraphsyncError) as raised:
        graphsync.rewrite_towers(built.graph, recompute=value)
    assert "\n" not in str(raised.value) and "segments" in str(raised.value)
    assert len(built.graph.get_operations()) == before


def test_sync_batch_norm_hook_passes_segments_on():
    batch_sizes = [3, 5]
    built = tl.build(MODELS["resnet-fused"], batch_sizes)
    with built.graph.as_default():
        hook = graphsync.SyncBatchNormHook(recompute="segments")
        hook.begin()
    assert hook.report.recompute == "segments" and hook.report.recomputed > 0
    assert "Conv2D" in {op.type for op in copies(built.graph)}
    x, t = tl.data(batch_sizes, INPUT_SHAPE, (5,))
    assert_one_device(MODELS["resnet-fused"], built, x, t, batch_sizes)


@pytest.mark.parametrize("source,reference,towers", [
    ("META4", "META1", 4), pytest.param("MOMENTS2", "MOMENTS1", 2, marks=tiers.full)], ids=["fused", "moments"])
def test_a_saved_graph_rewritten_with_segments_trains_bit_for_bit_like_without(tmp_path, source, reference, towers):
    """`graphsync rewrite --recompute segments` on a saved graph: the output keeps its copies, and
    the user's loop on it (import, restore, one step) gives every variable exactly as the graph
    rewritten without recompute, and one device's."""
    import json
    import fixture_paths
    import test_cli
    paths = {}
    for name, extra in (("plain", []), ("segments", ["--recompute", "segments"])):
        paths[name] = tmp_path / f"{name}.meta"
        result = test_cli.invoke("rewrite", getattr(fixture_paths, source), "-o", paths[name], "--json", *extra)
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
    assert report["recompute"] == "segments" and report["recomputed"] > 0
    graph = tf.Graph()
    with graph.as_default():
        tf1.train.import_meta_graph(str(paths["segments"]))
    assert "Conv2D" in {op.type for op in copies(graph)}
    images, labels = test_cli.batch(towers)
    plain, _ = test_cli.train_step(str(paths["plain"]), towers, images, labels)
    got, _ = test_cli.train_step(str(paths["segments"]), towers, images, labels)
    assert plain.keys() == got.keys()
    for name in plain:
        np.testing.assert_array_equal(plain[name], got[name], err_msg=name)
    one, _ = test_cli.train_step(getattr(fixture_paths, reference), 1, images, labels)
    assert test_cli.max_relative_error(got, one) < 2e-5


def test_the_command_line_takes_a_mode_or_says_which():
    """--recompute alone is today's recompute; --recompute segments the new one; a script path
    after it, or any other word, is one line that says what to write."""
    import test_cli
    from fixture_paths import META2
    out = {}
    for extra in (["--recompute"], ["--recompute", "layers"], ["--recompute", "segments"]):
        result = test_cli.invoke("rewrite", META2, "--dry-run", "--json", *extra)
        assert result.exit_code == 0, result.output
        out[extra[-1]] = __import__("json").loads(result.stdout)["recompute"]
    assert out == {"--recompute": "layers", "layers": "layers", "segments": "segments"}
    result = test_cli.invoke("rewrite", META2, "--dry-run", "--recompute", "train.py")
    assert result.exit_code == 2
    line = test_cli.one_error_line(result)
    assert "'train.py' is not a recompute mode" in line and "--recompute segments" in line


@tiers.full
@pytest.mark.parametrize("name", os.environ.get("GRAPHSYNC_SEGMENT_APPLICATIONS", "MobileNetV2").split(","))
def test_keras_applications_train_bit_for_bit_with_segments(name):
    """tf_keras.applications models (code graphsync's authors did not write), 2 uneven towers
    (MobileNetV2 in the full tier; GRAPHSYNC_SEGMENT_APPLICATIONS=MobileNetV2,ResNet50V2 adds the
    float64 ResNet50V2, 160 s more):
    rewritten with segments, the towers equal one device, and two training steps leave every
    variable exactly as the graph rewritten without recompute does. Grappler's remapper is off for
    the comparison: on ResNet50V2 (float64) with the remapper, the arithmetic and the layout
    optimizers all on, a few of the stem's gradients differ in their last bits for some starting
    values (with any one of them off, never: see the closing note of issue 44)."""
    import test_applications
    import whole_models
    graphs = {mode: test_applications._build(name) for mode in ("plain", "segments")}
    for mode, built in graphs.items():
        graphsync.rewrite_towers(built[0], recompute="segments" if mode == "segments" else False)
    graph, inputs, outputs, references, train, init, size = graphs["segments"]
    assert "Conv2D" in {op.type for op in copies(graph)}
    assert_no_statistic_recomputed(graph)
    x = np.random.RandomState(0).rand(sum(test_applications.SIZES), size, size, 3)
    feed = dict(zip(inputs, np.split(x, np.cumsum(test_applications.SIZES)[:-1])))
    error, noise = whole_models._run(graph, inputs, outputs, references, train, init, feed, step=True)
    assert error <= max(4 * noise, whole_models.FLOOR), (error, noise)

    start = {}   # Keras' unseeded initializers differ from graph to graph: both start from the same values
    config = tf1.ConfigProto()
    config.CopyFrom(tl.CONFIG)
    config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF

    def variables_after_two_steps(built):
        graph, inputs, _, _, train, init, _ = built
        with graph.as_default(), tf1.Session(graph=graph, config=config) as sess:
            sess.run(init)
            variables = tf1.global_variables()
            if start:
                for v in variables:
                    v.load(start[v.op.name], sess)
            else:
                start.update(zip([v.op.name for v in variables], sess.run(variables)))
            feed = dict(zip(inputs, np.split(x, np.cumsum(test_applications.SIZES)[:-1])))
            for _ in range(2):
                sess.run(train, feed)
            return sess.run(variables)
    for a, b in zip(variables_after_two_steps(graphs["plain"]), variables_after_two_steps(graphs["segments"]),
                    strict=True):
        np.testing.assert_array_equal(a, b)
