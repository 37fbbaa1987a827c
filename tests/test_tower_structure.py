"""Towers found by structure, whatever their scopes are called (graphsync/towers/structure.py) — and
never where there are none.

Positive graphs: the CIFAR10 pattern (tests/towerlib.py) with its scopes renamed, rewritten with no
options, against one device on the concatenated batch; the same graph before the rewrite differs.
Negative graphs (sequential identical blocks, branches of one network, a GAN, an evaluation tower):
rewrite_towers refuses them as tower-less and not one op changes (the serialized graph is equal).
"""
from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import graphsync
import models
import tiers
import towerlib as tl
from fixture_paths import ROOT
from graphsync.autosync.patching import AutoSync
from graphsync.errors import NoTowersError
from graphsync.plan.planner import make_plan
from graphsync.towers.names import pair_by_name

tf1 = tf.compat.v1
SYNCED, UNSYNCED = 2e-5, 1e-3
FIGURES = {}   # scope format or negative graph → what the test measured (printed with -s)

_references = {}


def _reference(sizes):
    key = tuple(sizes)
    if key not in _references:
        x, t = tl.data(sizes, (6, 6, 3), (5,))
        _references[key] = (x, t, tl.reference_step(models.resnetish(), sizes, x, t))
    return _references[key]


def _errors(scope, sizes):
    """(relative error rewritten, relative error before the rewrite, report): one graph, run
    before and after rewrite_towers with no options."""
    x, t, ref = _reference(sizes)
    built = tl.build(models.resnetish(), sizes, scope=scope)
    worst = lambda got: max(tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "moving"))  # noqa: E731
    before = worst(tl.run_step(built, x, t, sizes))
    report = graphsync.rewrite_towers(built.graph)
    return worst(tl.run_step(built, x, t, sizes)), before, report


@pytest.mark.parametrize("scope, sizes", [
    ("gpu_%d", [3, 5]), ("GPU%d", [3, 5]), ("dev_%d", [3, 5]), ("split_%d", [2, 5, 3]), ("tower-%d", [3, 5]),
    ("Tower_%d", [3, 5]), ("task_0_tower_%d", [3, 5]), ("parallel_%d", [2, 5, 3]),
    ("t%d_gpu", [3, 5]), ("worker%d_tower", [3, 5]),
    (["gpu_0/replica_0", "gpu_0/replica_1", "gpu_1/replica_0", "gpu_1/replica_1"], [2, 3, 1, 4]),
    (["gpu_0/v0", "gpu_1/v1"], [3, 5]),
    (["", "gpu_1", "gpu_2"], [2, 5, 3]),
    (["net", "net_1", "net_2"], [2, 5, 3]),   # TensorFlow's unique names: one scope name per tower call
], ids=lambda v: v if isinstance(v, str) else None)
def test_scope_format_found_by_structure(scope, sizes):
    synced, unsynced, report = _errors(scope, sizes)
    names = [scope % i for i in range(len(sizes))] if isinstance(scope, str) else [s or "(root)" for s in scope]
    FIGURES[str(scope)] = f"{len(report.layers)} layers × {len(report.towers)} towers, rewritten {synced:.1e}, " \
                          f"not rewritten {unsynced:.2f}"
    assert report.towers == names
    assert synced < SYNCED and unsynced > UNSYNCED, (synced, unsynced)


def _keras_model_per_graph():
    """A tf_keras functional model (conv → batch norm → relu, twice, and a dense head), made once per
    graph with seeded initializers and called once per tower: TensorFlow names the calls `model/`,
    `model_1/`, … when the script opens no scope of its own; updates from `model.updates`."""
    import tf_keras as keras
    per_graph = {}

    def call(x):
        if x.graph not in per_graph:
            init = keras.initializers.GlorotUniform(seed=1)
            inputs = keras.Input(x.shape[1:])
            h = inputs
            for i in range(2):
                h = keras.layers.Conv2D(4, 3, padding="same", use_bias=False, kernel_initializer=init)(h)
                h = keras.layers.BatchNormalization(
                    gamma_initializer=keras.initializers.RandomUniform(0.5, 1.5, seed=i))(h, training=True)
                h = keras.layers.ReLU()(h)
            outputs = keras.layers.Dense(5, kernel_initializer=init)(keras.layers.GlobalAveragePooling2D()(h))
            per_graph[x.graph] = keras.Model(inputs, outputs)
        model = per_graph[x.graph]
        seen = set(model.updates)   # the model's own construction made updates too
        y = model(x, training=True)
        return y, [u for u in model.updates if u not in seen]
    return call


@pytest.mark.parametrize("gradients", ["after", "before"])
def test_a_keras_model_called_per_device_without_a_scope_is_towers(gradients):
    """A script's loop `with tf.device(d): y = model(x_d)` and nothing else: the towers are the
    model's calls, `model/` and `model_1/` (the first call's scope carries no number). Found by
    structure, synchronized, equal to one device; the graph left alone differs."""
    sizes = [3, 5]
    model = _keras_model_per_graph()
    x, t = tl.data(sizes, (6, 6, 3), (5,))
    ref = tl.reference_step(model, sizes, x, t)
    worst = lambda got: max(tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "moving"))  # noqa: E731
    unsynced = worst(tl.run_step(tl.build(model, sizes, scope=["", ""]), x, t, sizes))
    reports = []
    built = tl.build(model, sizes, scope=["", ""], gradients=gradients,
                     rewrite=lambda g: reports.append(graphsync.rewrite_towers(g)))
    synced = worst(tl.run_step(built, x, t, sizes))
    FIGURES[f"keras model per device, gradients {gradients}"] = f"rewritten {synced:.1e}, not rewritten {unsynced:.2f}"
    assert reports[0].towers == ["model", "model_1"] and len(reports[0].layers) == 2, str(reports[0])
    assert synced < SYNCED and unsynced > UNSYNCED, (synced, unsynced)
    if gradients == "after":   # verify: each tower's targets are root placeholders its loss reads
        verified = graphsync.verify(built.graph)
        assert verified.passed and verified.reason.startswith("synchronized:"), verified.format()


def _siamese(x):
    """One network called on the two halves of each example's channels (the two images of a pair),
    its embeddings multiplied: TensorFlow names the calls `net/` and `net_1/`, in one place. The
    moving averages follow the first call (two updates of one variable in a step would race)."""
    embeddings, updates = [], []
    for images in (x[..., :3], x[..., 3:]):
        with tf1.variable_scope("net", reuse=tf1.AUTO_REUSE):
            h, update = models.raw_fused_bn(models._conv(images, 5, "conv"), "bn")  # noqa: SLF001
            embeddings.append(tf.reduce_mean(tf.nn.relu(h), [1, 2]))
            updates = updates or update
    return embeddings[0] * embeddings[1], updates


def test_a_siamese_network_in_towers_pairs_branch_with_branch():
    """The Siamese network trained on two towers (`tower_0/net/`, `tower_0/net_1/` on one device,
    `tower_1/…` on another): the towers are tower_0 and tower_1, each branch's batch norm is a layer
    of its own, and the step equals one device's on the concatenated pairs. Alone on one device the
    same network is no towers: refused in one line, not one op changed."""
    sizes = [3, 5]
    x, t = tl.data(sizes, (6, 6, 6), (5,))
    ref = tl.reference_step(_siamese, sizes, x, t, input_shape=(6, 6, 6))
    built = tl.build(_siamese, sizes, input_shape=(6, 6, 6))
    report = graphsync.rewrite_towers(built.graph)
    assert report.towers == ["tower_0", "tower_1"] and len(report.layers) == 2, str(report)
    got = tl.run_step(built, x, t, sizes)
    assert max(tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "moving")) < SYNCED

    graph = tf.Graph()
    with graph.as_default():
        y, _ = _siamese(tf1.placeholder(tf.float32, [None, 6, 6, 6]))
        _train(tf.reduce_sum(y), graph)
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    with pytest.raises(NoTowersError) as refused:
        graphsync.rewrite_towers(graph)
    assert "\n" not in str(refused.value) and "net/, net_1/" in str(refused.value), str(refused.value)
    assert graph.as_graph_def().SerializeToString(deterministic=True) == before


def test_two_streams_alike_on_two_devices_keep_their_own_statistics():
    """A two-stream network (two inputs, the same layers built twice with weights of their own,
    `stream/` on one device and `stream_1/` on another, fused by one loss) is named like towers
    built in a loop and placed like them, but its streams are not replicas: refused in one line,
    not one op changed."""
    graph = tf.Graph()
    with graph.as_default():
        outputs = []
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.variable_scope(None, default_name="stream"):
                images = tf1.placeholder(tf.float32, [None, 6, 6, 4])
                outputs.append(tf.reduce_mean(_conv_bn(_conv_bn(images, "l0"), "l1"), [1, 2]))
        _train(tf.reduce_sum(tf.square(outputs[0] - outputs[1])), graph)
    assert {op.name.split("/")[0] for op in graph.get_operations() if op.type == "FusedBatchNormV3"} == \
        {"stream", "stream_1"}
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    with pytest.raises(NoTowersError) as refused:
        graphsync.rewrite_towers(graph)
    assert "\n" not in str(refused.value)
    assert graph.as_graph_def().SerializeToString(deterministic=True) == before


def test_verify_finds_the_towers_a_rewrite_found_by_structure():
    """`gpu_0/`, `gpu_1/` are towers by structure; once rewritten, their batch norms are replaced
    and structure finds nothing: verify reads the towers the rewrite marked, and passes (it once
    said "found no towers" unless given --towers)."""
    built = tl.build(models.resnetish(), [3, 5], scope="gpu_%d")
    graphsync.rewrite_towers(built.graph)
    report = graphsync.verify(built.graph)
    assert report.passed and report.reason.startswith("synchronized:"), report.format()
    assert "gpu_0" in report.format() and "gpu_1" in report.format(), report.format()


# --------------------------------------------------------------------------------------------
# Negative graphs: not towers, not one op changed


def _conv_bn(x, name, channels=4):
    with tf1.variable_scope(name, reuse=tf1.AUTO_REUSE):
        y, _ = models.raw_fused_bn(models._conv(x, channels, "conv"), "bn")  # noqa: SLF001
    return tf.nn.relu(y)


def _train(loss, graph):
    variables = graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)
    return tf1.train.GradientDescentOptimizer(0.1).apply_gradients(zip(tf.gradients(loss, variables), variables))


def sequential_blocks():
    h = tf1.placeholder(tf.float32, [None, 6, 6, 4])
    for i in range(4):
        with tf1.name_scope(f"block_{i}"):
            h = _conv_bn(h, f"block_{i}")
    return tf.reduce_sum(tf.square(h))


def branches_of_one_network(stem=True):
    x = tf1.placeholder(tf.float32, [None, 6, 6, 4])
    h = _conv_bn(x, "stem") if stem else x
    outputs = []
    for i in range(2):
        with tf1.name_scope(f"mixed/branch_{i}"):
            outputs.append(_conv_bn(h, f"mixed/branch_{i}"))
    return tf.reduce_sum(tf.square(tf.concat(outputs, -1)))


def gan():
    """net_0 the generator, net_1 and net_2 the discriminator on fake and real images: the same
    batch-norm layers under the same names in all three."""
    z = tf1.placeholder(tf.float32, [None, 6, 6, 4])
    real = tf1.placeholder(tf.float32, [None, 6, 6, 4])
    with tf1.name_scope("net_0"), tf1.variable_scope("generator"):
        fake = _conv_bn(_conv_bn(z, "l0"), "l1")
    scores = []
    for i, images in ((1, fake), (2, real)):
        with tf1.name_scope(f"net_{i}"), tf1.variable_scope("discriminator", reuse=tf1.AUTO_REUSE):
            scores.append(tf.reduce_mean(_conv_bn(_conv_bn(images, "l0"), "l1"), [1, 2, 3]))
    return tf.reduce_mean(tf.nn.softplus(scores[0]) + tf.nn.softplus(-scores[1]))


def evaluation_tower():
    """model_0 trains, model_1 evaluates (batch norm in training mode, never differentiated)."""
    losses = []
    for i in range(2):
        with tf1.name_scope(f"model_{i}"):
            x = tf1.placeholder(tf.float32, [None, 6, 6, 4], name="train_images" if i == 0 else "eval_images")
            losses.append(tf.reduce_sum(tf.square(_conv_bn(_conv_bn(x, "l0"), "l1"))))
    tf.identity(losses[1], name="eval_loss")
    return losses[0]


NEGATIVE = {"sequential identical blocks": sequential_blocks, "branches after a stem": branches_of_one_network,
            "branches reading the input": lambda: branches_of_one_network(stem=False), "GAN": gan,
            "evaluation tower beside the training network": evaluation_tower}


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_no_towers_where_there_are_none(name):
    graph = tf.Graph()
    with graph.as_default():
        _train(NEGATIVE[name](), graph)
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    n_bn = sum(op.type == "FusedBatchNormV3" for op in graph.get_operations())
    with pytest.raises(NoTowersError) as refused:
        graphsync.rewrite_towers(graph)
    assert not refused.value.parallel_structure
    assert graph.as_graph_def().SerializeToString(deterministic=True) == before
    said = io.StringIO()
    AutoSync(stream=said).first_use(graph)     # graphsync run: silent, and still not one op changed
    assert said.getvalue() == "" and graph.as_graph_def().SerializeToString(deterministic=True) == before
    FIGURES[name] = f"{n_bn} batch norms, {len(graph.get_operations())} ops: 0 changed, silent under graphsync run"


def test_evaluation_tower_beside_training_towers_is_left_alone():
    sizes = [3, 5]
    x, t, ref = _reference(sizes)
    kept = {}

    def add_eval_tower_then_rewrite(graph):
        with tf.device("/cpu:2"), tf1.name_scope("gpu_2/"), \
                tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
            y, _ = models.resnetish()(tf1.placeholder(tf.float32, [None, 6, 6, 3], name="eval_x"))
            tf.identity(y, name="eval_output")
        kept.update({n.name: n.SerializeToString(deterministic=True) for n in graph.as_graph_def().node if n.name.startswith("gpu_2/")})
        kept["report"] = graphsync.rewrite_towers(graph)

    built = tl.build(models.resnetish(), sizes, scope="gpu_%d", rewrite=add_eval_tower_then_rewrite)
    report = kept.pop("report")
    got = tl.run_step(built, x, t, sizes)
    synced = max(tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "moving"))
    after = {n.name: n.SerializeToString(deterministic=True) for n in built.graph.as_graph_def().node if n.name.startswith("gpu_2/")}
    assert report.towers == ["gpu_0", "gpu_1"] and synced < SYNCED
    assert after == kept
    assert {s.reason for s in report.skipped if s.op.startswith("gpu_2/")} == \
        {"not differentiated: an evaluation tower, left alone"}
    FIGURES["evaluation tower beside gpu_0, gpu_1"] = f"training towers rewritten {synced:.1e}, " \
                                                      f"{len(after)} eval-tower ops: 0 changed"


# --------------------------------------------------------------------------------------------
# Several candidates, partial families, parallel scopes without an index: one line, never a guess


def _towers(scopes, layers_of, channels=4):
    graph = tf.Graph()
    with graph.as_default():
        losses = []
        for scope in scopes:
            with tf1.name_scope(scope), tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                h = tf1.placeholder(tf.float32, [None, 6, 6, channels])
                for layer in layers_of(scope):
                    h = _conv_bn(h, layer, channels)
                losses.append(tf.reduce_sum(tf.square(h)))
        _train(tf.add_n(losses), graph)
    return graph


def _refused(graph, *fragments):
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    with pytest.raises(graphsync.GraphsyncError) as refused:
        graphsync.rewrite_towers(graph)
    message = str(refused.value)
    assert "\n" not in message and all(f in message for f in fragments), message
    assert graph.as_graph_def().SerializeToString(deterministic=True) == before
    return message


def test_several_families_are_named_not_guessed():
    graph = _towers(["gpu_0", "gpu_1", "aux_0", "aux_1"], lambda s: ["l0", "l1"] if s.startswith("gpu") else ["a0"])
    _refused(graph, "several families", "gpu_%d (gpu_0/, gpu_1/)", "aux_%d (aux_0/, aux_1/)",
             r"towers='gpu_\\d+/'", r"towers='aux_\\d+/'")


def test_family_qualifying_partly_is_named():
    graph = _towers(["gpu_0", "gpu_1", "gpu_2"], lambda s: ["l0", "l1", "l2"] if s != "gpu_2" else ["l0", "l1"])
    _refused(graph, "qualify only partly", "missing from gpu_2/", "towers='gpu_0/|gpu_1/'")


def test_parallel_scopes_without_an_index_are_said_by_default():
    graph = _towers(["left", "right"], lambda s: ["l0", "l1"])
    message = _refused(graph, "left/, right/", "towers='left/|right/'")
    said = io.StringIO()
    AutoSync(stream=said).first_use(graph)
    assert said.getvalue() == f"graphsync: graph 1 left alone: {message}\n"


# --------------------------------------------------------------------------------------------
# Names that drift between towers; inspect says how towers were found


def test_uniquified_layer_names_pair_in_creation_order():
    per_tower = {"a": [("m/bn/F", 1, "a0"), ("m/bn_1/F", 2, "a1")],
                 "b": [("m_1/bn_2/F", 3, "b0"), ("m_1/bn_3/F", 4, "b1")]}
    assert pair_by_name(per_tower) == {"m/bn/F": {"a": "a0", "b": "b0"}, "m/bn_1/F": {"a": "a1", "b": "b1"}}
    same = {"a": [("bn/F", 1, "a0"), ("bn_1/F", 2, "a1")], "b": [("bn/F", 3, "b0"), ("bn_1/F", 4, "b1")]}
    assert pair_by_name(same) == {"bn/F": {"a": "a0", "b": "b0"}, "bn_1/F": {"a": "a1", "b": "b1"}}


def test_keras_model_built_per_tower_pairs_its_drifting_layers():
    import tf_keras as keras
    graph = tf.Graph()
    with graph.as_default():
        for i in range(2):
            with tf1.name_scope(f"gpu_{i}"):
                model = keras.Sequential([keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
                                          keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization()])
                model(tf1.placeholder(tf.float32, [None, 8, 8, 3]), training=True)
    plan = make_plan(graph)
    assert plan.found_by == "structure: gpu_%d" and [t.prefix for t in plan.towers] == ["gpu_0/", "gpu_1/"]
    assert [[s.op.name for s in layer.sites] for layer in plan.layers] == [
        ["gpu_0/sequential/batch_normalization/FusedBatchNormV3",
         "gpu_1/sequential_1/batch_normalization_2/FusedBatchNormV3"],
        ["gpu_0/sequential/batch_normalization_1/FusedBatchNormV3",
         "gpu_1/sequential_1/batch_normalization_3/FusedBatchNormV3"]]


def test_inspect_says_how_towers_were_found(tmp_path):
    from click.testing import CliRunner
    from cli.main import main
    lines = {}
    for scope in ("gpu_%d", "tower_%d"):
        built = tl.build(models.resnetish(), [2, 2], scope=scope)
        path = tmp_path / f"{scope[:-3]}.meta"
        with built.graph.as_default():
            tf1.train.export_meta_graph(str(path))
        result = CliRunner().invoke(main, ["inspect", str(path)])
        assert result.exit_code == 0, result.output
        lines[scope] = [line for line in result.output.splitlines() if line.startswith("towers (")]
    assert lines == {"gpu_%d": ["towers (2): found by structure: gpu_%d"],
                     "tower_%d": ["towers (2): found by known name tower_%d"]}


# --------------------------------------------------------------------------------------------
# graphsync run on unchanged scripts


@tiers.full
def test_graphsync_run_synchronizes_gpu_towers_and_stays_silent_without(tmp_path):
    script = os.path.join(ROOT, "tests", "scripts", "train_structure.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))
    runner = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())", "run"]
    started = {kind: subprocess.Popen(runner + [script, str(tmp_path / kind), kind], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for kind in ("gpu", "blocks", "siamese")}
    plain = subprocess.run([sys.executable, script, str(tmp_path / "plain"), "gpu"], cwd=ROOT, env=env,
                           capture_output=True, text=True)
    done = {kind: p.communicate(timeout=600) for kind, p in started.items()}
    assert plain.returncode == 0 and all(p.returncode == 0 for p in started.values()), done
    said = {kind: [line for line in err.splitlines() if line.startswith("graphsync:")] for kind, (_, err) in done.items()}
    assert said["gpu"] == ["graphsync: 2 layers × 2 towers synchronized on /device:CPU:0 (fused, moments; "
                           "gradients rewritten)"]
    assert said["blocks"] == []
    assert len(said["siamese"]) == 1 and "left/, right/" in said["siamese"][0]

    sys.path.insert(0, os.path.join(ROOT, "tests", "scripts"))
    import tower_model
    one_device = tower_model.one_device_variables(8)
    load = lambda name: dict(np.load(tmp_path / f"{name}.npz"))  # noqa: E731
    synced, unsynced = tl.max_rel_error(load("gpu"), one_device), tl.max_rel_error(load("plain"), one_device)
    FIGURES["graphsync run, gpu_%d script"] = f"variables after one step {synced:.1e} (python: {unsynced:.3f})"
    assert synced < 1e-4 and unsynced > 1e-2, (synced, unsynced)


def teardown_module():
    for name, figure in FIGURES.items():
        print(f"{name}: {figure}")
