"""`graphsync verify` with no options on replicated trainers (issue 32): every tower has its own copy
of each variable, drawn by unseeded initializers, and the trainer copies the main tower's values
into them before its first step; moving summaries keep EMAs of tower 0's loss and error rates;
the loss `tf.gradients` differentiates sits next to a weight-decay scalar named `*_loss`.

    tensorpack   its ImageNet ResNet example (tests/scripts/export_imagenet_resnet.py: resnet18,
                 NHWC, uint8 images through image_preprocess, weight decay, moving summaries)
                 under SyncMultiGPUTrainerReplicated(2) and …ParameterServer(2), exported in a
                 subprocess (tensorpack stays out of this process), rewritten by `graphsync rewrite`
    tf_cnn_benchmarks `replicated`   built here: towers tower_<i>/ with variable scopes v<i>,
                 gradients averaged across the towers and applied to each tower's copies, the
                 post-init copies v<i>/… ← v0/… in the graph (or not: then the copies are paired by
                 where the towers read them)

Each rewritten graph passes and each original fails; the report says which copies started equal,
which loss it compared and why, and lists the writes it did not judge.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphsync
from cli.main import main
from fixture_paths import ROOT
from graphsync.verification import discovery, run, sources
import tiers

tf1 = tf.compat.v1
EXPORT = os.path.join(ROOT, "tests", "scripts", "export_imagenet_resnet.py")
TRAINERS = ("replicated", "ps")
CLASSES = 5
_ROW = r"^  {}[^\d\n]*(?:\(\d+\))?\s+(\S+)(?:\s+(\S+))?(?:\s+(\S+))?$"


def _verify(*args):
    result = CliRunner().invoke(main, ["verify", *[str(a) for a in args]])
    return result.exit_code, result.output


def _row(text: str, label: str) -> list[float]:
    """The figures of one row of verify's table: (rewritten, original) when both graphs are given,
    whether or not verify adds its "reordered" column between them (noise measured in the towers)."""
    found = re.search(_ROW.format(re.escape(label)), text, re.M)
    assert found, text
    values = [float(v) for v in found.groups() if v is not None]
    return values if len(values) < 3 else [values[0], values[-1]]


# --------------------------------------------------------------------------------------------
# tensorpack's ImageNet ResNet example


@pytest.fixture(scope="module")
def resnet_graphs(tmp_path_factory):
    """trainer → (original .meta, rewritten .meta): resnet18 at 64×64, 2 examples per tower."""
    tmp = tmp_path_factory.mktemp("imagenet_resnet")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))
    done = subprocess.run([sys.executable, EXPORT, str(tmp), "--size", "64", "--batch", "2",
                           *[a for t in TRAINERS for a in ("--trainer", t)]],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    graphs = {}
    for trainer in TRAINERS:
        original, rewritten = tmp / f"{trainer}.meta", tmp / f"{trainer}_sync.meta"
        result = CliRunner().invoke(main, ["rewrite", str(original), "-o", str(rewritten)])
        assert result.exit_code == 0 and result.output.startswith("20 layers × 2 towers synchronized"), result.output
        graphs[trainer] = original, rewritten
    return graphs


@pytest.fixture(scope="module")
def resnet_reports(resnet_graphs):
    """trainer → (`verify rewritten`, `verify original`, `verify rewritten --original original`),
    each (exit status, output)."""
    return {trainer: (_verify(rewritten), _verify(original), _verify(rewritten, "--original", original))
            for trainer, (original, rewritten) in resnet_graphs.items()}


@pytest.mark.parametrize("trainer", TRAINERS)
@tiers.full
def test_imagenet_resnet_rewritten_passes_and_original_fails(resnet_reports, trainer):
    (status, text), (original_status, original_text), _ = resnet_reports[trainer]
    assert status == 0 and text.splitlines()[-1].startswith("PASS: synchronized"), text
    assert original_status == 3, original_text
    assert re.search(r"^FAIL: layer `\S+` is not synchronized: its batch (mean|variance) changes by ", original_text, re.M), \
        original_text


@pytest.mark.parametrize("trainer", TRAINERS)
@tiers.full
def test_imagenet_resnet_figures_rewritten_and_original(resnet_reports, trainer):
    """Gradients and moving statistics: float rounding after the rewrite (measured ~1e-6 and
    ~4e-7), 0.3 and more before it; the moving summaries change either way and are not judged."""
    _, _, (status, text) = resnet_reports[trainer]
    assert status == 0, text
    gradients, updates = _row(text, "gradients applied"), _row(text, "moving-statistics updates")
    assert gradients[0] < 1e-4 and gradients[1] > 0.1, text
    assert updates[0] < 1e-4 and updates[1] > 0.1, text
    # 20 batch norms × mean and variance × 2 towers; tower 0's EMAs of its cost and top-1 / top-5 errors apart
    assert "moving-statistics updates (80)" in text and "other writes, not judged (3)" in text
    # they change beyond float rounding, by how much depends on the examples: 1.7e-4 to 0.038 measured
    assert min(_row(text, "other writes, not judged")) > 1e-5, text
    assert re.search(r"^note: 3 writes that depend on the examples but on no batch statistic \(moving summaries "
                     r"of one tower's loss or error rates, e\.g\. EMA/", text, re.M), text


@pytest.mark.parametrize("trainer", TRAINERS)
@tiers.full
def test_imagenet_resnet_loss_is_what_the_gradients_differentiate(resnet_reports, trainer):
    """Not `tower*/l2_regularize_loss` (weight decay: named *_loss, but no example changes it)."""
    (_, text), _, _ = resnet_reports[trainer]
    assert "loss: tower0/cost:0, tower1/cost:0 (what tf.gradients differentiates, in every tower: the gradients " \
           "applied come from it)" in text, text


@tiers.full
def test_imagenet_resnet_replicated_copies_start_equal(resnet_reports, resnet_graphs):
    """The replicated trainer's copies (every variable of tower 1, optimizer slots and moving
    statistics included: 164) start as the main tower's, as its sync_variables_from_main_tower
    does; the parameter servers' towers share their variables, so there are none."""
    (_, text), (_, original_text), _ = resnet_reports["replicated"]
    line = ("variables: 164 per-tower copies of the main tower's variables start equal to them (the graph's own "
            "copy ops, which the trainer runs before its first step, e.g. tower1/conv0/W ← conv0/W "
            "(sync_variables/AssignVariableOp))")
    assert line in text.splitlines() and line in original_text.splitlines(), text
    (_, ps_text), _, _ = resnet_reports["ps"]
    assert "variables:" not in ps_text
    _, rewritten = resnet_graphs["replicated"]
    subject = _subject(rewritten)
    assert subject.copies.of["tower1/conv0/W"] == "conv0/W"
    assert subject.copies.of["tower1/linear/W/Momentum"] == "linear/W/Momentum"


def _subject(path):
    _, graph, collection = sources.load(str(path), None)
    working, _, _ = run.on_cpus(graph)
    return discovery.discover(working, losses_collection=collection)


# --------------------------------------------------------------------------------------------
# tf_cnn_benchmarks' replicated mode


def cnn_benchmarks_replicated(rewrite: bool, copy_ops: bool = True, towers: int = 2) -> tf.Graph:
    """As tf_cnn_benchmarks' VariableMgrLocalReplicated builds it: tower_<i>/ name scopes with
    variable scopes v<i> (every tower its own unseeded copy of each variable), per-tower images and
    labels, a cross entropy plus weight decay (`l2_loss`, no example in it) as the differentiated
    loss, gradients averaged across towers and applied to each tower's own copies, tower 0's
    batch-norm updates, an EMA of tower 0's loss; and, with `copy_ops`, the post-init copies of
    v0/… into v<i>/…."""
    graph = tf.Graph()
    with graph.as_default():
        optimizer = tf1.train.MomentumOptimizer(0.1, 0.9)
        tower_grads, tower_vars, losses = [], [], []
        for i in range(towers):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), tf1.variable_scope(f"v{i}"):
                images = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
                labels = tf1.placeholder(tf.int32, [None], name="labels")
                with tf1.variable_scope("cg"):
                    h = tf1.layers.conv2d(images, 8, 3, use_bias=False, name="conv0")
                    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True, name="bn0"))
                    h = tf1.layers.conv2d(h, 8, 3, use_bias=False, name="conv1")
                    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True, name="bn1"))
                    logits = tf1.layers.dense(tf.reduce_mean(h, [1, 2]), CLASSES, name="affine")
                xent = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
                                      name="xentropy")
                variables = tf1.trainable_variables(f"v{i}/")
                l2 = tf.multiply(4e-5, tf.add_n([tf.nn.l2_loss(v) for v in variables]), name="l2_loss")
                loss = tf.add_n([xent, l2], name="total")
                losses.append(loss)
                tower_vars.append(variables)
                tower_grads.append(tf.gradients(loss, variables))
        train = []
        for i in range(towers):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"apply_{i}"):
                averaged = [tf.add_n(list(gs)) / towers for gs in zip(*tower_grads)]
                train.append(optimizer.apply_gradients(zip(averaged, tower_vars[i])))
        ema = tf1.train.ExponentialMovingAverage(0.9)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0")):
            tf.group(*train, ema.apply([losses[0]]), name="train_op")
        if copy_ops:
            by_name = {v.op.name: v for v in tf1.global_variables()}
            tf.group(*[v.assign(by_name["v0/" + name.partition("/")[2]].read_value())
                       for name, v in by_name.items() if re.match(r"v[1-9]\d*/", name)], name="post_init")
        if rewrite:
            graphsync.rewrite_towers(graph)
    return graph


@pytest.fixture(scope="module", params=[True, False], ids=["copy_ops", "no_copy_ops"])
def cnn_benchmarks(request):
    """(with copy ops?, verify rewritten with the original, verify original alone)."""
    copy_ops = request.param
    rewritten = cnn_benchmarks_replicated(True, copy_ops)
    original = cnn_benchmarks_replicated(False, copy_ops)
    return copy_ops, graphsync.verify(rewritten, original=original), graphsync.verify(original)


def test_cnn_benchmarks_replicated_rewritten_passes_and_original_fails(cnn_benchmarks):
    _, report, alone = cnn_benchmarks
    assert report.passed and report.reason.startswith("synchronized:"), report.format()
    assert report.rewritten.gradients < 1e-5 and report.rewritten.updates < 1e-5, report.format()
    assert report.original.gradients > 1e-2 and report.original.updates > 1e-2, report.format()
    assert not alone.passed and alone.reason.startswith("layer `"), alone.format()   # its first batch norm


def test_cnn_benchmarks_replicated_copies_found_with_or_without_copy_ops(cnn_benchmarks):
    """With the post-init ops: every v1/… variable (slots and moving statistics too); without
    them, the variables tower 1 reads in its forward pass, paired by where tower 0 reads its own."""
    copy_ops, report, _ = cnn_benchmarks
    # v1/: 2 convolution kernels, 2 batch norms' γ, β, moving mean and variance, the dense layer's
    # kernel and bias (12), and the momentum slots of the 8 trainable ones
    assert report.copies.startswith("20 per-tower copies of the main tower's variables start equal to them ("), \
        report.copies
    if copy_ops:
        assert re.search(r"\(the graph's own copy ops, which the trainer runs before its first step, e\.g\. "
                         r"v1/cg/affine/bias ← v0/cg/affine/bias \(AssignVariableOp(_\d+)?\)\)$", report.copies)
    else:
        # the 12 variables tower 1's layers read, by where tower 0's read theirs; the slots by name
        assert "(paired by where the towers read them; paired by their names within the towers, e.g. " \
            in report.copies, report.copies
    assert "variables: " + report.copies in report.format().splitlines()


def test_cnn_benchmarks_loss_and_writes_apart(cnn_benchmarks):
    _, report, _ = cnn_benchmarks
    assert report.loss == ["tower_0/v0/total:0", "tower_1/v1/total:0"], report.loss
    assert report.loss_source.startswith("what tf.gradients differentiates, in every tower")
    # every tower's 2 batch norms × mean and variance (verify fetches tower 1's too); the EMA of tower 0's loss apart
    assert report.rewritten.counts["updates"] == 8 and report.rewritten.counts["other_writes"] == 1
    assert report.rewritten.other_writes > 1e-3     # tower 0's loss changes: not judged


def test_unequal_copies_would_fail_the_rewritten_graph(monkeypatch):
    """Why the copies start equal: with each tower's own draw the rewritten graph fails."""
    from graphsync.verification.discovery import copies

    monkeypatch.setattr(copies, "find", lambda *args: copies.Copies({}, ""))
    report = graphsync.verify(cnn_benchmarks_replicated(True))
    assert not report.passed and report.rewritten.gradients > 1e-2, report.format()


def test_shared_variables_have_no_copies():
    """Towers sharing one set of variables (CIFAR10's loop) report no copies."""
    path = os.path.join(ROOT, "fixtures", "cifar10_2towers.meta")
    subject = _subject(path)
    assert len(subject.copies) == 0 and subject.copies.describe() == ""


def test_a_named_loss_that_no_example_changes_is_not_compared():
    """No tf.gradients and a scalar named *_loss in every tower that depends on no example: verify
    says so and compares the moving statistics."""
    graph = tf.Graph()
    with graph.as_default():
        for i in range(2):
            with tf1.name_scope(f"tower_{i}"), tf1.variable_scope("m", reuse=i > 0):
                x = tf1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
                h = tf1.layers.batch_normalization(tf1.layers.conv2d(x, 4, 3, name="conv"), training=True)
                tf.multiply(1e-4, tf.nn.l2_loss(tf1.trainable_variables("m/conv")[0]), name="wd_loss")
                tf.reduce_sum(h, name="activity")
        tf.group(*tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
        graphsync.rewrite_towers(graph)
    report = graphsync.verify(graph)
    assert report.passed and report.loss == [], report.format()
    assert "loss: tower_*/m/wd_loss:0 (named *_loss in every tower) does not depend on the examples: not compared" \
        in report.notes
