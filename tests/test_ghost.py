"""Ghost batch norm (virtual_batch_size=k) normalizes sub-batches of k examples on purpose: the
rewrite leaves it alone — the graph and one training step exactly what the original computes, even
and uneven towers — and says why, in the report and in `graphsync inspect`."""
import io
import warnings

import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphsync
import models
import towerlib as tl
from cli.main import main

tf1 = tf.compat.v1
K = 2
REASON = f"ghost batch norm (virtual_batch_size={K}): normalizes sub-batches by design"


def layers_ghost(x):
    """tf.compat.v1.layers.batch_normalization(virtual_batch_size=k), twice."""
    before = set(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
    h = models._conv(x, 4, "stem")
    for i in range(2):
        h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True, virtual_batch_size=K, name=f"gbn{i}"))
    return models._head(h), [u for u in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if u not in before]


def keras_ghost():
    """tf_keras BatchNormalization(virtual_batch_size=k), one layer object shared by the towers."""
    import tf_keras
    per_graph = {}

    def model(x):
        layer = per_graph.setdefault(x.graph, tf_keras.layers.BatchNormalization(virtual_batch_size=K))
        seen = len(layer.updates)
        h = layer(models._conv(x, 4, "stem"), training=True)
        return models._head(tf.nn.relu(h)), layer.updates[seen:]

    return model


MODELS = {"layers": layers_ghost, "keras": keras_ghost()}


@pytest.mark.parametrize("model_key,batch_sizes", [("layers", [4, 4]), ("layers", [4, 6, 2]), ("keras", [2, 6])])
def test_left_alone_and_named(model_key, batch_sizes):
    x, t = tl.data(batch_sizes, (6, 6, 3), (5,))
    original = tl.run_step(tl.build(MODELS[model_key], batch_sizes), x, t, batch_sizes)
    built = tl.build(MODELS[model_key], batch_sizes)
    before = built.graph.as_graph_def()
    with pytest.warns(graphsync.GraphsyncWarning, match=r"batch statistics in the towers stay per tower, "
                                                        r"unsynchronized: tower_0/.*: ghost batch norm"):
        report = graphsync.rewrite_towers(built.graph)
    assert not report.changed and report.summary.startswith("nothing changed")
    ghosts = [s for s in report.skipped if s.reason == REASON]
    layers = 2 if model_key == "layers" else 1
    assert len(ghosts) == layers * len(batch_sizes), str(report)
    assert built.graph.as_graph_def() == before
    got = tl.run_step(built, x, t, batch_sizes)
    for key in ("output", "grads", "moving", "variables"):
        assert tl.max_rel_error(got[key], original[key]) == 0.0, key


def test_next_to_a_synchronized_batch_norm_it_keeps_its_own_statistics():
    def model(x):
        y, updates = layers_ghost(x)
        h = tf1.layers.batch_normalization(tf.reshape(y, [-1, 5]), training=True, name="bn")
        return h, updates + [u for u in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if "/bn/" in u.name]

    built = tl.build(model, [4, 6])
    ghost_mean = built.graph.get_operation_by_name("tower_1/gbn0/moments/mean")
    readers = sorted(c.name for c in ghost_mean.outputs[0].consumers())
    with pytest.warns(graphsync.GraphsyncWarning, match=r"^4 batch statistics .* \(and 3 more: "):
        report = graphsync.rewrite_towers(built.graph)
    assert [l.name for l in report.layers] == ["bn/moments/mean"], str(report)
    assert sorted(c.name for c in ghost_mean.outputs[0].consumers()) == readers


def test_inspect_names_it(tmp_path):
    built = tl.build(layers_ghost, [4, 4])
    path = tmp_path / "ghost.meta"
    with built.graph.as_default():
        tf1.train.export_meta_graph(str(path))
    result = CliRunner().invoke(main, ["inspect", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.count(REASON) == 4, result.output


def test_graphsync_run_says_so_by_default():
    """Under `graphsync run` a step that is not one device's never goes unsaid: one line, even
    when nothing else in the graph is synchronized; none with --quiet."""
    said, quiet = io.StringIO(), io.StringIO()
    graphsync.AutoSync(stream=said).first_use(tl.build(layers_ghost, [4, 4]).graph)
    graphsync.AutoSync(stream=quiet, quiet=True).first_use(tl.build(layers_ghost, [4, 4]).graph)
    assert said.getvalue().splitlines() == [
        "graphsync: warning: 4 batch statistics in the towers stay per tower, unsynchronized: "
        f"tower_0/gbn0/moments/mean: {REASON} (and 3 more: report.skipped, graphsync inspect)"]
    assert quiet.getvalue() == ""


def test_one_tower_has_nothing_to_say():
    built = tl.build(layers_ghost, [4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphsync.GraphsyncWarning)
        report = graphsync.rewrite_towers(built.graph)
    assert not report.changed and len(report.skipped) == 2
