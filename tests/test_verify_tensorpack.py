"""`graphsync verify` with no options on graphs whose towers' inputs all live in the first
tower's name scope: tensorpack 0.11's SyncMultiGPUTrainerReplicated and …ParameterServer with a
TensorInput of random tensors (tests/scripts/export_tensorpack.py, run as a subprocess: tensorpack
stays out of this process), and hand-built graphs where every tower's placeholders or random
inputs, preprocessing included, are made under tower_0/ in an order that pairs nothing by name.
The rewritten graphs pass (exit 0), the originals fail (exit 3): moving examples between towers
changes the loss, gradients and moving statistics of per-tower statistics only.
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
from graphsync.errors import GraphsyncError
from graphsync.verification import discovery, run, sources
import tiers

tf1 = tf.compat.v1
EXPORT = os.path.join(ROOT, "tests", "scripts", "export_tensorpack.py")
TRAINERS = ("replicated", "ps")
CLASSES = 5


def _verify(path, *options):
    result = CliRunner().invoke(main, ["verify", str(path), *options])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def tensorpack_graphs(tmp_path_factory):
    """trainer → (original .meta, rewritten .meta), rewritten by `graphsync rewrite`."""
    tmp = tmp_path_factory.mktemp("tensorpack")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))
    done = subprocess.run([sys.executable, EXPORT, str(tmp), "--trainer", "replicated", "--trainer", "ps"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    graphs = {}
    for trainer in TRAINERS:
        original, rewritten = tmp / f"{trainer}.meta", tmp / f"{trainer}_sync.meta"
        result = CliRunner().invoke(main, ["rewrite", str(original), "-o", str(rewritten)])
        assert result.exit_code == 0 and result.output.startswith("11 layers × 2 towers synchronized"), result.output
        graphs[trainer] = original, rewritten
    return graphs


@pytest.mark.parametrize("trainer", TRAINERS)
@tiers.full
def test_tensorpack_rewritten_graph_passes_and_original_fails(tensorpack_graphs, trainer):
    original, rewritten = tensorpack_graphs[trainer]
    status, text = _verify(rewritten)
    assert status == 0, text
    # each tower's images, fed where its first convolution reads them, and its labels
    assert "tower*/image_preprocess/truediv:0  float32 [4, 8, 8, 3]" in text
    assert "tower0/TensorInput/random_uniform_1:0, tower0/TensorInput/random_uniform_3:0  int32 [4], classes 0..4" in text
    changes = [float(c) for c in re.findall(r"^  (?:sum of the tower losses|gradients applied|moving-statistics "
                                            r"updates)[^\d]*(?:\(\d+\))?\s+(\S+)$", text, re.M)]
    assert len(changes) == 3 and max(changes) < 1e-5, text
    status, text = _verify(original)
    assert status == 3, text
    assert re.search(r"^FAIL: layer `\S+` is not synchronized: its batch (mean|variance) changes by ", text, re.M), text
    assert "gradients applied" in text   # the end-to-end figures, as second line


# --------------------------------------------------------------------------------------------
# Hand-built: every tower's inputs made under the first tower's scope


def _first_scope_inputs(kind: str, rewrite: bool) -> tf.Graph:
    """Two towers of conv → BN → relu on two image inputs (a, b: the same shape, read by
    different convolutions) added together, a dense head and a label input; all six inputs made
    in tower_0/model/inputs/, tower 1's first, its b before its a, each scaled there from [0, 255)."""
    graph = tf.Graph()
    with graph.as_default():
        optimizer = tf1.train.GradientDescentOptimizer(0.1)
        grads, made = [], {}
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), tf1.variable_scope("model", reuse=i > 0):
                if i == 0:
                    with tf1.name_scope("inputs"):
                        for tower, what in ((1, "b"), (1, "label"), (0, "a"), (1, "a"), (0, "label"), (0, "b")):
                            made[tower, what] = _input(kind, what, seed=len(made))
                branches = []
                for what in ("a", "b"):
                    h = tf1.layers.conv2d(made[i, what], 4, 3, use_bias=False, name=f"conv_{what}",
                                          kernel_initializer=tf1.glorot_uniform_initializer(seed=ord(what)))
                    branches.append(tf.nn.relu(tf1.layers.batch_normalization(h, training=True, name=f"bn_{what}")))
                logits = tf1.layers.dense(tf.reduce_mean(branches[0] + branches[1], [1, 2]), CLASSES,
                                          kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
                loss = tf1.losses.sparse_softmax_cross_entropy(made[i, "label"], logits, loss_collection=None,
                                                               reduction=tf1.losses.Reduction.SUM)
                grads.append(optimizer.compute_gradients(loss))
        summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*grads)]
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0")):
            optimizer.apply_gradients(summed)
        if rewrite:
            graphsync.rewrite_towers(graph)
    return graph


def _input(kind: str, what: str, seed: int) -> tf.Tensor:
    if what == "label":
        if kind == "placeholder":
            return tf.identity(tf1.placeholder(tf.int32, [4]))
        return tf1.random_uniform([4], 0, CLASSES, tf.int32, seed=seed)
    drawn = tf1.placeholder(tf.float32, [4, 6, 6, 3]) if kind == "placeholder" else \
        tf1.random_uniform([4, 6, 6, 3], 0, 255, seed=seed)
    return (drawn - 127.5) / 64.0


@pytest.fixture(scope="module", params=["placeholder", "random"])
def first_scope(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    paths = {}
    for rewrite in (False, True):
        paths[rewrite] = folder / f"{'rewritten' if rewrite else 'original'}.meta"
        graph = _first_scope_inputs(request.param, rewrite)
        with graph.as_default():
            tf1.train.export_meta_graph(str(paths[rewrite]))
    return request.param, paths[False], paths[True]


def test_inputs_all_in_first_tower_scope_are_found_by_tower_and_paired_by_position(first_scope):
    kind, _, rewritten = first_scope
    _, graph, _ = sources.load(str(rewritten), None)
    working, _, _ = run.on_cpus(graph)
    subject = discovery.discover(working)
    per_tower = [i for i in subject.inputs if i.kind == "per_tower"]
    assert len(per_tower) == 3 and all(len(i.tensors) == 2 for i in per_tower)
    for item in per_tower:
        # both towers' tensors of one input reach the same layer, each its own tower's
        reached = [_layers_reading(working.get_tensor_by_name(n)) for n in item.tensors]
        assert all(ops and all(op.startswith(f"tower_{t}/") for op in ops) for t, ops in enumerate(reached)), reached
        assert {op[len("tower_0/"):] for op in reached[0]} == {op[len("tower_1/"):] for op in reached[1]}
    assert all(name.startswith("tower_0/model/inputs/") for item in per_tower for name in item.tensors)


def _layers_reading(tensor: tf.Tensor) -> set:
    """The forward ops outside tower_0/model/inputs/ first reached from `tensor`."""
    found, stack = set(), [tensor]
    while stack:
        for op in stack.pop().consumers():
            if "gradients" in op.name:
                continue
            if op.name.startswith("tower_0/model/inputs/"):
                stack.extend(op.outputs)
            else:
                found.add(op.name)
    return found


def test_inputs_all_in_first_tower_scope_rewritten_passes_and_original_fails(first_scope):
    _, original, rewritten = first_scope
    status, text = _verify(rewritten)
    assert status == 0, text
    status, text = _verify(original)
    assert status == 3, text


def test_an_input_only_one_tower_reads_is_a_one_line_error():
    graph = tf.Graph()
    with graph.as_default():
        towers = []
        for i in range(2):
            with tf1.name_scope(f"tower_{i}"), tf1.variable_scope("model", reuse=i > 0):
                x = tf1.placeholder(tf.float32, [4, 6, 6, 3])
                if i == 1:      # an extra input tower 0 lacks
                    x = x * tf1.placeholder(tf.float32, [4, 6, 6, 5])[..., :3]
                h = tf1.layers.batch_normalization(tf1.layers.conv2d(x, 4, 3, name="conv"), training=True)
                towers.append(tf.reduce_sum(h, name="loss"))
        graphsync.rewrite_towers(graph)
    with pytest.raises(GraphsyncError, match=r"^cannot pair input .* \(found in tower_1 only\): name the tensors to "
                                             r"feed with --input NAME$"):
        graphsync.verify(graph)
