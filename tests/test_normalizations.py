"""Reports count batch-norm layers, not their reductions (graphsync/plan/normalizations.py, issue 45):
a batch norm written by hand with a mean and `tf.math.reduce_variance` is synchronized as three
reduction layers, and reported as one layer listing them: RewriteReport's summary and table,
`graphsync inspect` (text and JSON), `rewrite --json` and the TensorBoard export count the same.
Batch norms by hand on one residual stream stay apart, and a fused one beside one by hand is two
layers, in towers and in one between-graph worker. The steps equal one device's on the concatenated
batch (float64: measured ≤ 2e-15; float32 ≤ 2e-6), and the un-rewritten ones do not (outputs and
gradients off by 0.1 and more).
"""
from __future__ import annotations

import functools
import json
import warnings

import tensorflow as tf
from click.testing import CliRunner

import graphsync
import towerlib as tl
from cli.main import main
from graphsync.io.tensorboard import listed_layers

tf1 = tf.compat.v1
BATCHES = (2, 3, 4)
SHAPE, WIDTH = (6, 6, 3), 5
BY_HAND = "reductions: mean + mean + mean of squares"   # the mean, and reduce_variance's mean and mean of squares
TOLERANCE = {tf.float64: 1e-12, tf.float32: 5e-5}


def _conv(h, name, channels=4):
    w = tf1.get_variable(name, [3, 3, h.shape[-1], channels], h.dtype,
                         tf1.random_normal_initializer(stddev=0.3, seed=len(name)))
    return tf.nn.conv2d(h, w, 1, "SAME")


def _by_hand(h, scope):
    """A batch norm by hand: a mean and tf.math.reduce_variance (three reductions over the batch)."""
    with tf1.name_scope(scope):
        mean = tf.reduce_mean(h, [0, 1, 2])
        variance = tf.math.reduce_variance(h, [0, 1, 2])
        return (h - mean) * tf.math.rsqrt(variance + 1e-3)


def _head(h):
    w = tf1.get_variable("head", [h.shape[-1], WIDTH], h.dtype, tf1.random_normal_initializer(stddev=0.5, seed=1))
    return tf.reduce_mean(h, [1, 2]) @ w


def three_by_hand(x):
    """Three pre-activation residual blocks, each normalizing the residual stream by hand."""
    h = _conv(x, "stem")
    for i in range(3):
        h = h + _conv(tf.nn.relu(_by_hand(h, f"bn{i}")), f"conv{i}")
    return _head(h), []


def fused_and_by_hand(x):
    """A fused batch norm, then one by hand."""
    h = tf1.layers.batch_normalization(_conv(x, "c1"), training=True, fused=True, name="bn")
    h = _by_hand(_conv(tf.nn.relu(h), "c2"), "by_hand")
    return _head(_conv(tf.nn.relu(h), "c3")), []


@functools.lru_cache(maxsize=None)
def _step(model, batches, dtype, rewrite=True):
    """(report, errors against one device's step on the concatenated batch)."""
    x, t = tl.data(list(batches), SHAPE, (WIDTH,), dtype=dtype.as_numpy_dtype)
    reports = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphsync.GraphsyncWarning)   # nothing left per tower
        built = tl.build(model, list(batches), dtype=dtype, input_shape=SHAPE,
                         rewrite=(lambda g: reports.append(graphsync.rewrite_towers(g))) if rewrite else None)
    got = tl.run_step(built, x, t, list(batches))
    ref = tl.reference_step(model, list(batches), x, t, dtype=dtype, input_shape=SHAPE)
    return (reports[0] if reports else None), {k: tl.max_rel_error(got[k], ref[k]) for k in ref}


def test_three_batch_norms_by_hand_are_three_layers():
    report, errors = _step(three_by_hand, BATCHES, tf.float64)
    _, unsynchronized = _step(three_by_hand, BATCHES, tf.float64, rewrite=False)
    assert report.summary.startswith("3 layers × 3 towers synchronized on "), report.summary
    assert [(l.name, l.kind, l.found_as, l.backward) for l in report.layers] == \
        [(f"bn{i}", "reduction", BY_HAND, "rewritten") for i in range(3)], str(report)
    assert [l.reductions for l in report.layers] == \
        [(f"bn{i}/Mean", f"bn{i}/reduce_variance/Mean", f"bn{i}/reduce_variance/Mean_1") for i in range(3)]
    assert [l.tower_ops for l in report.layers] == [tuple(f"tower_{t}/bn{i}/Mean" for t in range(3)) for i in range(3)]
    table = str(report).splitlines()
    row = table.index(next(line for line in table if line.startswith("  bn1 ")))
    assert table[row].endswith(BY_HAND) and table[row + 1:row + 4] == \
        ["    bn1/Mean", "    bn1/reduce_variance/Mean", "    bn1/reduce_variance/Mean_1"], str(report)
    assert json.loads(json.dumps(report.to_dict()))["layers"][2]["reductions"] == list(report.layers[2].reductions)
    assert max(errors.values()) < TOLERANCE[tf.float64], errors
    assert min(unsynchronized["output"], unsynchronized["grads"]) > 1e-2, unsynchronized


def test_a_fused_batch_norm_and_one_by_hand_are_two_layers():
    report, errors = _step(fused_and_by_hand, (3, 5), tf.float32)
    _, unsynchronized = _step(fused_and_by_hand, (3, 5), tf.float32, rewrite=False)
    assert report.summary.startswith("2 layers × 2 towers synchronized on "), report.summary
    assert [(l.name, l.kind, l.found_as, len(l.reductions)) for l in report.layers] == \
        [("bn/FusedBatchNormV3", "fused", "fused", 0), ("by_hand", "reduction", BY_HAND, 3)], str(report)
    assert max(errors.values()) < TOLERANCE[tf.float32], errors
    assert min(unsynchronized["output"], unsynchronized["grads"]) > 1e-2, unsynchronized
    # one between-graph worker of one tower: 2 layers; the workers' fingerprints stay one per reduction
    worker = tl.build(fused_and_by_hand, [3], scope="").graph
    report = graphsync.rewrite_towers(worker, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 0))
    assert report.summary.startswith("2 layers × 1 tower synchronized by all-reduce"), report.summary
    assert [l.split()[0] for l in report.fingerprints] == \
        ["bn/FusedBatchNormV3", "by_hand/Mean", "by_hand/reduce_variance/Mean", "by_hand/reduce_variance/Mean_1"]


def test_inspect_rewrite_and_tensorboard_count_as_the_report(tmp_path):
    original, rewritten, logdir = tmp_path / "towers.meta", tmp_path / "synced.meta", tmp_path / "logs"
    tf1.train.export_meta_graph(str(original), graph=tl.build(three_by_hand, list(BATCHES), input_shape=SHAPE).graph)
    report, _ = _step(three_by_hand, BATCHES, tf.float64)
    listed = [(l.name, l.reductions) for l in report.layers]
    runner = CliRunner()

    text = runner.invoke(main, ["inspect", str(original)])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert "batch-norm layers (3), one op in each tower:" in lines
    assert lines[-1] == "3 layers × 3 towers, gradients present", text.output
    row = lines.index(next(line for line in lines if line.startswith("  bn0 ")))
    assert lines[row].endswith(BY_HAND) and lines[row + 1:row + 4] == \
        ["    bn0/Mean", "    bn0/reduce_variance/Mean", "    bn0/reduce_variance/Mean_1"], text.output
    info = json.loads(runner.invoke(main, ["inspect", str(original), "--json"]).output)
    assert [(l["name"], tuple(r["name"] for r in l["reductions"])) for l in info["layers"]] == listed
    assert [len(r["sites"]) for l in info["layers"] for r in l["reductions"]] == [3] * 9

    done = runner.invoke(main, ["rewrite", str(original), "-o", str(rewritten), "--logdir", str(logdir), "--json"])
    assert done.exit_code == 0, done.output
    details = json.loads(done.output)
    assert details["summary"].startswith("3 layers × 3 towers synchronized")
    assert [(l["name"], tuple(l["reductions"])) for l in details["layers"]] == listed
    # TensorBoard: the Text dashboard's table, and each layer's reductions boxed in its scope
    assert [(row["layer"], row["reductions"]) for row in listed_layers(details["event_file"])] == listed
    graph = next(e.graph_def for e in tf1.train.summary_iterator(details["event_file"]) if e.graph_def)
    nodes = tf1.GraphDef.FromString(graph).node
    boxes = {n.name.split("/")[1] for n in nodes if n.name.startswith("graphsync/")} - {"constants"}
    assert boxes == {"bn0", "bn1", "bn2"}, boxes
    for _, reductions in listed:
        assert all(any(n.name.startswith(f"graphsync/{r}/forward") for n in nodes) for r in reductions)
