"""`verify` runs the graph, so a graph that reaches outside the process (files, connections, Python)
is refused in one line before anything runs, initializers included, unless --allow-side-effects;
inputs verify feeds cut the walk, so a pipeline reading files into the fed examples is no refusal.

Each graph is two small towers (tests/towerlib.py) with the side effect on the step's path: the file a
refused graph would write must not exist afterwards; allowed, it is written and the verdict is the
graph's own (PASS rewritten, FAIL not).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from tensorflow.python.framework import op_def_registry

import graphsync
import models
import towerlib as tl
from cli.main import main
from graphsync.verification import discovery, side_effects

tf1 = tf.compat.v1
REFUSAL = re.compile(r"^(the|the original) graph reaches outside this process: .+; verify runs (the graph|it): "
                     r"pass --allow-side-effects if you trust it$")


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _built(effect, rewrite=True, sizes=(3, 3)):
    """Two towers of conv → batch norm → dense whose output passes through `effect(y) -> y`."""
    model = models.layers_bn(depth=1)

    def with_effect(x):
        y, updates = model(x)
        return effect(y), updates

    return tl.build(with_effect, list(sizes), rewrite=graphsync.rewrite_towers if rewrite else None).graph


def _writing(path):
    def effect(y):
        written = tf.io.write_file(path, tf.strings.as_string(tf.reduce_sum(y)))
        with tf.control_dependencies([written]):
            return tf.identity(y)
    return effect


def _saved(graph, path):
    tf1.train.export_meta_graph(filename=str(path), graph=graph)
    return path


# --------------------------------------------------------------------------------------------
# Refused before anything runs


def test_a_file_written_on_the_step_is_refused_before_anything_runs(tmp_path):
    written = tmp_path / "written.txt"
    graph = _built(_writing(str(written)))
    with pytest.raises(graphsync.GraphsyncError) as refused:
        graphsync.verify(graph)
    message = str(refused.value)
    assert REFUSAL.match(message) and "\n" not in message, message
    assert "tower_0/WriteFile (writes a file), tower_1/WriteFile (writes a file)" in message
    assert not written.exists()

    result = _invoke("verify", _saved(graph, tmp_path / "writes.meta"))
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("graphsync: error: the graph reaches outside this process: tower_0/WriteFile")
    assert not written.exists()


def test_an_initializer_writing_a_file_is_refused_before_the_initializers_run(tmp_path):
    written = tmp_path / "initialized.txt"

    def effect(y):
        with tf1.variable_scope("scaled", reuse=tf1.AUTO_REUSE):
            with tf.control_dependencies([tf.io.write_file(str(written), "initialized")]):
                start = tf.ones([], name="start")
            scale = tf1.get_variable("scale", initializer=start, trainable=False)
        return y * scale

    with pytest.raises(graphsync.GraphsyncError, match=r"scaled/WriteFile \(writes a file\)"):
        graphsync.verify(_built(effect))
    assert not written.exists()


def test_a_file_read_outside_the_examples_is_refused(tmp_path):
    scale_file = tmp_path / "scale.txt"
    scale_file.write_text("2.0")

    def effect(y):
        return y * tf.strings.to_number(tf.io.read_file(str(scale_file)))

    with pytest.raises(graphsync.GraphsyncError, match=r"tower_0/ReadFile \(reads a file\)") as refused:
        graphsync.verify(_built(effect))
    assert REFUSAL.match(str(refused.value))


@pytest.mark.parametrize("callback", ["py_function", "py_func"])
def test_python_callbacks_on_the_step_are_refused(tmp_path, callback):
    def effect(y):
        if callback == "py_function":   # differentiable: on the gradients' path
            called = tf.py_function(lambda a: a, [y], tf.float32)
            called.set_shape(y.shape)
            return called
        scale = tf1.py_func(lambda: np.float32(1.0), [], tf.float32, stateful=False)
        scale.set_shape([])
        return y * scale

    with pytest.raises(graphsync.GraphsyncError) as refused:
        graphsync.verify(_built(effect))
    op_type = "EagerPyFunc" if callback == "py_function" else "PyFuncStateless"   # py_function's gradient: 1 more
    assert f"tower_0/{op_type} (calls Python), " in str(refused.value)
    assert f"tower_1/{op_type} (calls Python)" in str(refused.value)


def test_the_refusal_names_three_ops_and_counts_the_rest(tmp_path):
    def effect(y):
        scale = tf1.py_func(lambda: np.float32(1.0), [], tf.float32)
        scale.set_shape([])
        return _writing(str(tmp_path / "both.txt"))(y) * scale

    with pytest.raises(graphsync.GraphsyncError) as refused:
        graphsync.verify(_built(effect))
    assert "tower_0/PyFunc (calls Python), tower_0/WriteFile (writes a file), tower_1/PyFunc (calls Python) " \
           "and 1 more;" in str(refused.value)
    assert not (tmp_path / "both.txt").exists()


def test_a_side_effect_inside_a_tf_function_the_tower_calls_is_refused(tmp_path):
    written = tmp_path / "in_function.txt"

    @tf.function
    def passed_through(y):
        tf.io.write_file(str(written), tf.strings.as_string(tf.reduce_sum(y)))
        return tf.identity(y)

    with pytest.raises(graphsync.GraphsyncError) as refused:
        graphsync.verify(_built(passed_through))
    assert re.search(r"WriteFile in tower_0/StatefulPartitionedCall \(writes a file\)", str(refused.value)), \
        str(refused.value)
    assert not written.exists()


def test_an_original_graph_with_side_effects_is_refused_before_it_runs(tmp_path, monkeypatch):
    """Before either graph runs: no session is made for the rewritten graph either."""
    from graphsync.verification import run

    sessions = []
    monkeypatch.setattr(run.Runner, "__init__", lambda self, *a, **k: sessions.append(a) or 1 / 0)
    written = tmp_path / "original.txt"
    with pytest.raises(graphsync.GraphsyncError, match="^the original graph reaches outside this process: .*; "
                                                       "verify runs it: pass --allow-side-effects"):
        graphsync.verify(_built(lambda y: y), original=_built(_writing(str(written)), rewrite=False))
    assert not written.exists() and not sessions


# --------------------------------------------------------------------------------------------
# Allowed: run and judged as the graph deserves


def test_allowed_the_graph_runs_and_is_judged_on_its_merits(tmp_path):
    written = tmp_path / "allowed.txt"
    report = graphsync.verify(_built(_writing(str(written))), allow_side_effects=True)
    assert report.passed, report.format()
    assert written.exists()
    assert "note: the graph ran 2 ops that reach outside the process: tower_0/WriteFile (writes a file), " \
           "tower_1/WriteFile (writes a file)" in report.format()
    written.unlink()
    unsynchronized = graphsync.verify(_built(_writing(str(written)), rewrite=False), allow_side_effects=True)
    assert not unsynchronized.passed and "not synchronized" in unsynchronized.reason
    assert written.exists()


def test_the_command_runs_it_with_allow_side_effects(tmp_path):
    written = tmp_path / "command.txt"
    path = _saved(_built(_writing(str(written))), tmp_path / "writes.meta")
    result = _invoke("verify", path, "--allow-side-effects")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("PASS: synchronized")
    assert "ran 2 ops that reach outside the process" in result.stdout
    assert written.exists()


# --------------------------------------------------------------------------------------------
# What verify feeds cuts the walk: pipelines reading files into the examples are no refusal


def _decoded(record):
    return tf.reshape(tf.io.decode_raw(record, tf.float32), [6, 6, 3])


def _from_files(kind, directory):
    """Two towers whose examples come from a TFRecord file, through a tf.data iterator split into
    the towers or through a queue a reader fills: verify feeds the iterator's or the queue's output."""
    path = str(directory / "examples.tfrecord")
    rng = np.random.RandomState(0)
    with tf.io.TFRecordWriter(path) as writer:
        for _ in range(8):
            writer.write(rng.randn(6, 6, 3).astype(np.float32).tobytes())
    graph = tf.Graph()
    with graph.as_default():
        if kind == "tf.data":
            dataset = tf.data.TFRecordDataset([path]).map(_decoded)
            images = tf1.data.make_one_shot_iterator(dataset.repeat().batch(8)).get_next()
            pieces = tf.split(tf.ensure_shape(images, [None, 6, 6, 3]), 2)
        else:
            _, record = tf1.TFRecordReader().read(tf1.train.string_input_producer([path]))
            queue = tf1.FIFOQueue(16, [tf.float32], shapes=[[6, 6, 3]])
            tf1.train.add_queue_runner(tf1.train.QueueRunner(queue, [queue.enqueue(_decoded(record))]))
            pieces = [queue.dequeue_many(4) for _ in range(2)]
        losses = []
        for i, part in enumerate(pieces):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), tf1.variable_scope("m", reuse=tf1.AUTO_REUSE):
                h = tf1.layers.batch_normalization(tf1.layers.conv2d(part, 4, 3, name="conv"), training=True, name="bn")
                losses.append(tf.reduce_sum(tf.square(h), name="loss"))
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.add_n(losses))
        graphsync.rewrite_towers(graph)
    return graph


@pytest.mark.parametrize("kind", ["tf.data", "queue"])
def test_files_read_into_the_fed_examples_are_no_refusal(tmp_path, kind):
    graph = _from_files(kind, tmp_path)
    report = graphsync.verify(graph)
    assert report.passed, report.format()
    assert "reach outside" not in report.format()
    if kind == "tf.data":   # what the feed cuts: run unfed, the iterator's dataset would read the file
        subject = discovery.discover(graph)
        assert [str(r) for r in side_effects.find(dataclasses.replace(subject, inputs=[]))] == \
            ["TFRecordDataset in OneShotIterator (reads a file)"]
    else:   # the reader fills the queue in a queue runner's thread, which verify never starts
        assert "TFRecordReaderV2" in {op.type for op in graph.get_operations()}


# --------------------------------------------------------------------------------------------
# The table


# Ops whose names suggest files, connections or Python but that stay in the process: TF1 summaries
# (protos in memory; the FileWriter is Python's), reader state and counters, file-name formatting,
# in-memory caches, debug ops without URLs, TPU-only embedding loads, Print (stderr), Snapshot (a
# tensor's copy), the reader of a snapshot's datasets already read.
IN_PROCESS = re.compile(r"^((Audio|Histogram|Image|Merge|Scalar|Tensor|StatsAggregator|ExperimentalStatsAggregator|"
                        r"BoostedTreesMakeStats)Summary(V2)?|Reader(NumRecordsProduced|NumWorkUnitsCompleted|Reset|"
                        r"RestoreState|SerializeState)(V2)?|Sharded(Filename|Filespec)|"
                        r"(Anonymous|Delete|Dummy)MemoryCache|Debug(GradientIdentity|GradientRefIdentity|"
                        r"NumericSummaryV2)|BoostedTreesExampleDebugOutputs|LoadTPUEmbedding\w+|"
                        r"(Configure|Shutdown)DistributedTPU|DecodeCSV|Print|Snapshot|SnapshotNestedDatasetReader)$")
LOOKS_OUTSIDE = re.compile(r"File|Reader|Record|Save|Restore|Checkpoint|Summary|Rpc|Py|Snapshot|DataService|Sql|CSV|"
                           r"LMDB|TextLine|Dump|Cache|Debug|Print|Remote|Load|Immutable|Register|Distributed")


def test_every_op_that_looks_outside_is_in_the_table_or_reviewed():
    """Fails when a TensorFlow upgrade adds such an op: put it in side_effects.OP_TYPES or here."""
    conditional = side_effects.PRINT_TYPES + side_effects.CACHE_TYPES + side_effects.DEBUG_TYPES
    unreviewed = [name for name in dir(tf.raw_ops) if LOOKS_OUTSIDE.search(name) and not name.startswith("_")
                  and name not in side_effects.CATEGORY and name not in conditional and not IN_PROCESS.match(name)]
    assert not unreviewed, unreviewed


# ops the table names that TensorFlow registers only from a version above the declared minimum
# (setup.cfg: tensorflow>=2.12): CalibrationStatisticsSaver seen missing in 2.16.1, registered in
# 2.18.1; the others missing in 2.12.1, registered in 2.16.1
_REGISTERED_FROM = {"CalibrationStatisticsSaver": (2, 18), "DumpTensor": (2, 16), "TFRecordDatasetV2": (2, 16),
                    "SnapshotChunkDataset": (2, 16), "ListSnapshotChunksDataset": (2, 16)}


def test_the_table_names_registered_ops():
    unregistered = {name for name in side_effects.CATEGORY if op_def_registry.get(name) is None}
    version = tuple(int(p) for p in tf.__version__.split(".")[:2])
    newer = {name for name, since in _REGISTERED_FROM.items() if version < since}
    assert unregistered - newer == {"Rpc", "TryRpc"}   # tf.contrib's, for graphs whose process loads them
