"""`graphsync verify` with no options on graphs as real training scripts build them.

Each graph shape is built from code on the package index (a tf_keras application in a tower loop
fed by one whole-batch placeholder split in the graph; MirroredStrategy in graph mode with its
per-replica tf.data iterators; tf_slim nets in clones that make their own random inputs; one
tf.data iterator split into the towers), saved as .meta before and after the rewrite, and checked
through the command: exit 0 on the rewritten graph, 3 on the original, one line on stderr, no
traceback. Smaller graphs cover the other ways of splitting a batch, queues, staging areas, towers
of different sizes, exchanges that must change every tower's set of examples, and refusals.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphsync
import tiers
import towerlib as tl
from cli.main import main
from graphsync import io as gio
from graphsync.verification import DEFAULT_TOLERANCE

tf1 = tf.compat.v1
tf1.disable_eager_execution()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")
CLASSES = 5


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _tf_slim():
    return tl.import_tf_slim()


# --------------------------------------------------------------------------------------------
# Real-world graph shapes


def keras_application_split():
    """tf_keras MobileNetV2 (alpha 0.35, 32×32, no weights) called in two towers of the CIFAR10
    loop; images and labels are whole-batch placeholders split with tf.split in the graph."""
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    graph = tf.Graph()
    with graph.as_default():
        model = tf_keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                                  classes=CLASSES)
        optimizer = tf1.train.GradientDescentOptimizer(0.1)
        images = tf1.placeholder(tf.float32, [None, 32, 32, 3])
        labels = tf1.placeholder(tf.int32, [None])
        tower_grads = []
        for i, (x, y) in enumerate(zip(tf.split(images, 2), tf.split(labels, 2))):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"):
                probabilities = model(x, training=True)
                loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(y, probabilities))
                if i == 0:
                    updates = model.get_updates_for(x)
                tower_grads.append(optimizer.compute_gradients(loss, model.trainable_variables))
        averaged = [(tf.add_n([g for g, _ in gv]) / 2, gv[0][1]) for gv in zip(*tower_grads)]
        with tf.control_dependencies(updates):
            optimizer.apply_gradients(averaged)
    return graph


def mirrored_strategy():
    """tf.compat.v1 MirroredStrategy in graph mode over two CPUs: a tf.data pipeline distributed
    into per-replica iterators (replica 0 unscoped), tf_keras layers, a v1 optimizer's minimize."""
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf1.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            dataset = tf.data.Dataset.from_tensor_slices(
                (rng.randn(64, 8, 8, 3).astype(np.float32), rng.randint(0, CLASSES, 64).astype(np.int32)))
            iterator = strategy.make_dataset_iterator(dataset.repeat().batch(8))
            conv = tf_keras.layers.Conv2D(4, 3, use_bias=False)
            norm = tf_keras.layers.BatchNormalization()
            dense = tf_keras.layers.Dense(CLASSES)
            optimizer = tf1.train.GradientDescentOptimizer(0.1)

            def step(inputs):
                x, y = inputs
                h = tf.nn.relu(norm(conv(x), training=True))
                logits = dense(tf.reduce_mean(h, [1, 2]))
                loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
                weights = conv.trainable_variables + norm.trainable_variables + dense.trainable_variables
                with tf.control_dependencies([optimizer.minimize(loss, var_list=weights)] + norm.get_updates_for(x)):
                    return tf.identity(loss)

            strategy.run(step, args=(iterator.get_next(),))
    return graph


def slim_clones():
    """tf_slim resnet_v2 (one tiny block) in model_deploy-style clones; each clone makes its own
    inputs as a stand-in reader does: random uint8-like images cast to float and scaled, random
    integer labels; losses through tf.losses into the `losses` collection."""
    slim = _tf_slim()
    from tf_slim.nets import resnet_v2

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        optimizer = tf1.train.GradientDescentOptimizer(0.1)
        clone_grads = []
        for i in range(2):
            with tf1.name_scope(f"clone_{i}") as scope, tf.device(f"/cpu:{i}"), \
                    tf1.variable_scope(tf1.get_variable_scope(), reuse=i > 0):
                raw = tf.cast(tf.random.uniform([4, 32, 32, 3], maxval=255.0), tf.uint8)
                images = tf.cast(raw, tf.float32) / 128.0 - 1.0
                labels = tf.random.uniform([4], maxval=CLASSES, dtype=tf.int32)
                blocks = [resnet_v2.resnet_v2_block("block1", base_depth=4, num_units=1, stride=2)]
                with slim.arg_scope(resnet_v2.resnet_arg_scope()):
                    logits, _ = resnet_v2.resnet_v2(images, blocks, num_classes=CLASSES, is_training=True,
                                                    include_root_block=False, scope="resnet")
                tf1.losses.sparse_softmax_cross_entropy(labels, tf.squeeze(logits, [1, 2]), scope=scope)
                clone_loss = tf.add_n(tf1.losses.get_losses(scope=scope)) / 2
                clone_grads.append(optimizer.compute_gradients(clone_loss))
        summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*clone_grads)]
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "clone_0")):
            optimizer.apply_gradients(summed)
    return graph


def dataset_iterator_split():
    """One tf.data iterator's whole batch, split into two towers of tf.compat.v1.layers."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        dataset = tf.data.Dataset.from_tensor_slices(
            (rng.randn(64, 8, 8, 3).astype(np.float32), rng.randint(0, CLASSES, 64).astype(np.int32)))
        images, labels = tf1.data.make_one_shot_iterator(dataset.repeat().batch(8)).get_next()
        _towers(zip(tf.split(images, 2), tf.split(labels, 2)))
    return graph


def _towers(per_tower_inputs, scope="tower_%d", reduction=tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS):
    """The CIFAR10 loop around a small conv → BN → relu → dense model of tf.compat.v1.layers.
    Towers of different sizes need a loss summed over examples (`reduction` SUM): a mean per
    tower weighs an example by 1/n_t, which moving it to another tower changes."""
    optimizer = tf1.train.GradientDescentOptimizer(0.1)
    grads = []
    for i, (x, y) in enumerate(per_tower_inputs):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(scope % i), tf1.variable_scope("model", reuse=i > 0):
            h = tf1.layers.conv2d(x, 4, 3, use_bias=False, kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
            h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True))
            logits = tf1.layers.dense(tf.reduce_mean(h, [1, 2]), CLASSES,
                                      kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
            loss = tf1.losses.sparse_softmax_cross_entropy(y, logits, loss_collection=None, reduction=reduction)
            grads.append(optimizer.compute_gradients(loss))
    summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*grads)]
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, scope % 0)):
        return optimizer.apply_gradients(summed)


SHAPES = {"keras_application_split": keras_application_split, "mirrored_strategy": mirrored_strategy,
          "slim_clones": slim_clones, "dataset_iterator_split": dataset_iterator_split}


@pytest.fixture(scope="module", params=[pytest.param(name, marks=tiers.full) if name == "keras_application_split"
                                        else name for name in sorted(SHAPES)])
def shape(request, tmp_path_factory):
    """(name, original .meta, rewritten .meta, `verify rewritten --original original --json`,
    `verify original`) for one graph shape."""
    folder = tmp_path_factory.mktemp(request.param)
    graph = SHAPES[request.param]()
    original, rewritten = folder / "original.meta", folder / "rewritten.meta"
    tf1.train.export_meta_graph(str(original), graph=graph)
    graphsync.rewrite_towers(graph)
    tf1.train.export_meta_graph(str(rewritten), graph=graph)
    both = _invoke("verify", rewritten, "--original", original, "--json")
    alone = _invoke("verify", original)
    return request.param, original, rewritten, both, alone


def test_rewritten_graph_passes_with_no_options(shape):
    name, _, _, both, _ = shape
    assert both.exit_code == 0, both.stdout + both.stderr
    report = json.loads(both.stdout)
    assert report["passed"] and report["summary"].startswith("PASS: synchronized")
    assert report["rewritten"]["batch_norm_running"] == [] and report["rewritten"]["layers"]
    assert {i["kind"] for i in report["inputs"]} == {"per_tower"}
    assert [i["dtype"] for i in report["inputs"]] == ["float32", "int32"]   # images, labels
    assert report["inputs"][1]["classes"] == CLASSES


def test_original_fails_with_one_line_and_exit_3(shape):
    name, _, _, _, alone = shape
    assert alone.exit_code == 3, alone.stdout + alone.stderr
    assert len(alone.stderr.splitlines()) == 1
    assert alone.stderr.startswith("graphsync: error: layer `")
    assert " is not synchronized: its batch " in alone.stderr
    assert alone.stdout.splitlines()[-1].startswith("FAIL: ")


def test_every_quantity_changes_on_the_original(shape):
    """Per-tower statistics move the loss, the gradients and the moving statistics beyond the
    tolerance; synchronized, they stay within float rounding."""
    name, _, _, both, _ = shape
    report = json.loads(both.stdout)
    original, rewritten = report["original"], report["rewritten"]
    for check in ("loss", "gradients", "updates"):
        assert original[check] > DEFAULT_TOLERANCE, (check, both.stdout)
        assert original[check] > 3 * rewritten[check], (check, both.stdout)


def test_how_the_inputs_were_found(shape):
    name, _, _, both, _ = shape
    report = json.loads(both.stdout)
    origins = [i["origin"] for i in report["inputs"]]
    expected = {
        "keras_application_split": ["Split of Placeholder:0 (a placeholder)", "Split of Placeholder_1:0 (a placeholder)"],
        "mirrored_strategy": ["a tf.data iterator in each tower"] * 2,
        "slim_clones": ["a random tensor in each tower, fed after its preprocessing (Sub)",
                        "a random tensor in each tower"],
        "dataset_iterator_split": ["Split of IteratorGetNext:0 (a tf.data iterator)",
                                   "Split of IteratorGetNext:1 (a tf.data iterator)"],
    }[name]
    assert origins == expected
    if name == "mirrored_strategy":
        assert report["towers"] == ["(root)", "replica_1"]
    assert report["loss"] and len(report["loss"]) == 2   # one per tower, however it was found


# --------------------------------------------------------------------------------------------
# Other ways real scripts hand a batch to their towers


def _whole_batch(split):
    """A graph whose whole-batch placeholders reach the towers through `split(tensor, tower)`."""
    def build(rewrite):
        graph = tf.Graph()
        with graph.as_default():
            images = tf1.placeholder(tf.float32, [8, 6, 6, 3])
            labels = tf1.placeholder(tf.int32, [8])
            _towers([(split(images, i), split(labels, i)) for i in range(2)])
            if rewrite:
                graphsync.rewrite_towers(graph)
        return graph
    return build


def _in_tower_slice(tensor, i):
    with tf1.name_scope(f"tower_{i}/"):
        return tensor[4 * i:4 * (i + 1)]


def _pipeline(kind):
    """A queue or a staging area handing 2 × 4 examples to the towers."""
    def build(rewrite):
        graph = tf.Graph()
        with graph.as_default():
            shapes = [[4, 6, 6, 3], [4]]
            pieces = []
            for i in range(2):
                if kind == "queue":
                    queue = tf1.FIFOQueue(8, [tf.float32, tf.int32], shapes=shapes)
                    pieces.append(queue.dequeue())
                else:
                    area = tf.raw_ops.Unstage(dtypes=[tf.float32, tf.int32])
                    pieces.append([tf.ensure_shape(t, s) for t, s in zip(area, shapes)])
            _towers(pieces)
            if rewrite:
                graphsync.rewrite_towers(graph)
        return graph
    return build


SPLITS = {
    "strided": _whole_batch(lambda t, i: t[i::2]),
    "slice": _whole_batch(lambda t, i: tf.slice(t, [4 * i] + [0] * (t.shape.rank - 1), [4] + t.shape[1:].as_list())),
    "unstack": _whole_batch(lambda t, i: tf.unstack(tf.reshape(t, [2, 4] + t.shape[1:].as_list()))[i]),
    "sliced_in_each_tower": _whole_batch(_in_tower_slice),
    "queue": _pipeline("queue"),
    "staging_area": _pipeline("staging"),
}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_other_ways_to_feed_towers(name):
    rewritten = graphsync.verify(SPLITS[name](rewrite=True))
    assert rewritten.passed, rewritten.format()
    assert rewritten.per_tower == 4 and [i["kind"] for i in rewritten.inputs] == ["per_tower"] * 2
    assert rewritten.inputs[1]["classes"] == CLASSES and rewritten.loss
    original = graphsync.verify(SPLITS[name](rewrite=False))
    assert not original.passed and "not synchronized: " in original.reason


# --------------------------------------------------------------------------------------------
# Towers of different sizes


def _uneven_fixed(rewrite):
    """One whole batch of 8, split 3 + 5 (tf.split with sizes) into two towers."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [8, 6, 6, 3])
        labels = tf1.placeholder(tf.int32, [8])
        _towers(zip(tf.split(images, [3, 5]), tf.split(labels, [3, 5])), reduction=tf1.losses.Reduction.SUM)
        if rewrite:
            graphsync.rewrite_towers(graph)
    return graph


def _per_tower_placeholders(sizes, rewrite):
    """Each tower's own placeholders, of the given batch sizes (None: the script decides the sizes
    when it runs)."""
    graph = tf.Graph()
    with graph.as_default():
        inputs = []
        for i, size in enumerate(sizes):
            with tf1.name_scope(f"tower_{i}/"):
                inputs.append((tf1.placeholder(tf.float32, [size, 6, 6, 3], name="images"),
                               tf1.placeholder(tf.int32, [size], name="labels")))
        _towers(inputs, reduction=tf1.losses.Reduction.SUM)
        if rewrite:
            graphsync.rewrite_towers(graph)
    return graph


def _uneven_at_run_time(rewrite):
    return _per_tower_placeholders((None, None), rewrite)


def test_uneven_fixed_sizes():
    rewritten = graphsync.verify(_uneven_fixed(rewrite=True))
    assert rewritten.passed, rewritten.format()
    assert rewritten.per_tower == [3, 5] and rewritten.examples == 8 and rewritten.moved == 2
    assert "inputs: 3/5 random examples per tower" in rewritten.format()
    assert [i["shape"] for i in rewritten.inputs] == ["[3|5, 6, 6, 3]", "[3|5]"]
    original = graphsync.verify(_uneven_fixed(rewrite=False))
    assert not original.passed and "not synchronized: " in original.reason and "when 2 of 8 examples move" in original.reason
    assert original.rewritten.loss > DEFAULT_TOLERANCE and original.rewritten.gradients > DEFAULT_TOLERANCE


def test_uneven_fixed_sizes_in_per_tower_placeholders():
    """Each tower's own placeholders fix its size (3 and 5), as a saved graph with towers of
    different fixed batch sizes does."""
    def build(rewrite):
        return _per_tower_placeholders((3, 5), rewrite)
    rewritten = graphsync.verify(build(rewrite=True))
    assert rewritten.passed and rewritten.per_tower == [3, 5], rewritten.format()
    assert not graphsync.verify(build(rewrite=False)).passed
    with pytest.raises(graphsync.GraphsyncError, match="the graph fixes 3 examples in tower 0, not 4"):
        graphsync.verify(build(rewrite=True), batch_size=4)


def test_uneven_sizes_at_run_time(tmp_path):
    rewritten = graphsync.verify(_uneven_at_run_time(rewrite=True), batch_size=[2, 6])
    assert rewritten.passed, rewritten.format()
    assert rewritten.per_tower == [2, 6] and rewritten.moved == 2
    original = graphsync.verify(_uneven_at_run_time(rewrite=False), batch_size=[2, 6])
    assert not original.passed
    path = tmp_path / "uneven.meta"
    tf1.train.export_meta_graph(str(path), graph=_uneven_at_run_time(rewrite=True))
    result = _invoke("verify", path, "--batch-size", "3,5")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "inputs: 3/5 random examples per tower" in result.stdout
    bad = _invoke("verify", path, "--batch-size", "3,x")
    assert bad.exit_code == 2 and "N,N" in bad.stderr


# --------------------------------------------------------------------------------------------
# Exchanges that prove something, and refusals


@pytest.fixture(scope="module")
def two_by_two():
    """The 2-tower fixture with two examples per tower, rewritten and original."""
    path = os.path.join(FIXTURES, "cifar10_2towers.meta")
    loaded = gio.load(path)
    graphsync.rewrite_towers(loaded.graph)
    return graphsync.verify(loaded, original=path, batch_size=2)


def test_two_towers_of_two_change_the_loss_and_gradients(two_by_two):
    """Moving both examples of each tower would merely swap the towers: the exchange moves one of
    each, so per-tower statistics change the loss and gradients too, not only tower 0's updates."""
    report = two_by_two
    assert report.passed, report.format()
    assert report.moved == 2 and report.examples == 4
    for check in ("loss", "gradients", "updates"):
        assert getattr(report.original, check) > 10 * DEFAULT_TOLERANCE, (check, report.format())


def test_one_example_per_tower_is_refused_in_one_line():
    path = os.path.join(FIXTURES, "cifar10_2towers.meta")
    with pytest.raises(graphsync.GraphsyncError, match="no exchange of examples changes which examples share a "
                                                       r"tower \(towers of 1/1 examples\)"):
        graphsync.verify(path, batch_size=1)
    result = _invoke("verify", path, "--batch-size", "1")
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("graphsync: error: no exchange of examples")
    four = _invoke("verify", os.path.join(FIXTURES, "cifar10_4towers.meta"), "--batch-size", "1,1,1,2")
    assert four.exit_code == 1 and len(four.stderr.splitlines()) == 1 and "1/1/1/2" in four.stderr


def test_no_loss_found_compares_gradients_and_moving_statistics():
    """tf.gradients of a vector (no scalar loss, nothing named loss): verify says so and passes."""
    graph = tf.Graph()
    with graph.as_default():
        per_example = []
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), tf1.variable_scope("m", reuse=i > 0):
                x = tf1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
                h = tf1.layers.batch_normalization(tf1.layers.conv2d(x, 4, 3), training=True)
                per_example.append(tf.reduce_sum(tf.square(h), [1, 2, 3]))
        variables = tf1.trainable_variables()
        grads = tf.gradients(tf.concat(per_example, 0), variables)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0")):
            tf1.train.GradientDescentOptimizer(0.1).apply_gradients(zip(grads, variables))
        graphsync.rewrite_towers(graph)
    report = graphsync.verify(graph)
    assert report.passed, report.format()
    assert report.loss == [] and report.rewritten.loss is None and report.rewritten.gradients is not None
    assert "loss: none found" in report.format()
    assert any(note.startswith("no loss found") for note in report.notes)


def _with_dropout(rewrite):
    """Per-tower placeholders of unknown batch size, dropout after the batch norm (its mask's shape
    comes from the activation at run time) and Gaussian noise on the images."""
    graph = tf.Graph()
    with graph.as_default():
        optimizer = tf1.train.GradientDescentOptimizer(0.1)
        grads = []
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), tf1.variable_scope("m", reuse=i > 0):
                images = tf1.placeholder(tf.float32, [None, 6, 6, 3], name="images")
                noisy = images + tf.random.normal(tf.shape(images), stddev=0.1)
                h = tf1.layers.conv2d(noisy, 4, 3, use_bias=False)
                h = tf1.layers.dropout(tf.nn.relu(tf1.layers.batch_normalization(h, training=True)), 0.5,
                                       training=True)
                loss = tf.reduce_sum(tf.square(tf1.layers.dense(tf.reduce_mean(h, [1, 2]), 3)), name="loss")
                grads.append(optimizer.compute_gradients(loss))
        summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*grads)]
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0")):
            optimizer.apply_gradients(summed)
        if rewrite:
            graphsync.rewrite_towers(graph)
    return graph


def test_dropout_and_noise_move_with_their_examples():
    """Masks and noise drawn anew in every run, or left in place while the examples move, would
    change every figure of a synchronized graph: they are fed as their ops draw them, per example."""
    rewritten = graphsync.verify(_with_dropout(rewrite=True))
    assert rewritten.passed, rewritten.format()
    noise = [i for i in rewritten.inputs if i["origin"].startswith("noise in each tower")]
    assert len(noise) == 2 and {i["dtype"] for i in noise} == {"float32"}
    assert rewritten.inputs[0]["name"] == "tower_*/m/images:0" and rewritten.per_tower == 4
    original = graphsync.verify(_with_dropout(rewrite=False))
    assert not original.passed and "not synchronized: " in original.reason


# --------------------------------------------------------------------------------------------
# The range of integer inputs, from what reads them


def _integer_graph(kind):
    """Two towers whose integer input is read by a one-hot, an embedding table, or nothing that
    tells its range (drawn in the tower with a maxval)."""
    graph = tf.Graph()
    with graph.as_default():
        losses = []
        for i in range(2):
            with tf1.name_scope(f"tower_{i}/"), tf1.variable_scope("m", reuse=i > 0):
                if kind == "random_maxval":
                    codes = tf.random.uniform([4, 3], maxval=6, dtype=tf.int32)
                else:
                    codes = tf1.placeholder(tf.int32, [None, 3], name="codes")
                if kind == "one_hot":
                    h = tf.reshape(tf.one_hot(codes, 7), [-1, 21])
                elif kind == "gather":
                    table = tf1.get_variable("table", [11, 2])
                    h = tf.reshape(tf.nn.embedding_lookup(table, codes), [-1, 6])
                else:   # read twice: fed as drawn, integers in its range
                    h = tf.concat([tf.cast(codes, tf.float32), tf.cast(codes * 2, tf.float32)], 1)
                h = tf1.layers.batch_normalization(tf1.layers.dense(h, 4), training=True)
                losses.append(tf.reduce_sum(tf.square(h), name="loss"))
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.add_n(losses))
    return graph


@pytest.mark.parametrize("kind, classes, source", [
    ("one_hot", 7, "a one-hot depth"), ("gather", 11, "a gather's table size"),
    ("random_maxval", 6, "the maxval it is drawn with")])
def test_integer_range_from_what_reads_it(kind, classes, source):
    report = graphsync.verify(_integer_graph(kind))
    item = next(i for i in report.inputs if i["dtype"] == "int32")
    assert (item["classes"], item["classes_from"]) == (classes, source)
    assert not report.passed   # not rewritten
