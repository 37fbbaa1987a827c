"""Batch norm inside a tf.function that the towers call in graph mode (a StatefulPartitionedCall
whose body holds the batch norm, or the If of a tensor training flag, or further calls that do):
graphsync inlines the calls (graphsync/splice/inline.py), then synchronizes what they held like any other
layer. One step of the rewritten graph equals one device on the concatenated batch (the
un-rewritten graph does not); with the flag False it computes exactly what the original computes.

Tolerances as in test_conditional.py: these float32 models agree with the reference to ~1e-6
(measured), TOLERANCE leaves room; with the flag False the rewritten graph runs the original ops
(measured difference 0).
"""
import functools
import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import conditional_models as cm
import graphsync
import tiers
import towerlib as tl
from test_conditional import exchange_traffic

tf1 = tf.compat.v1
TOLERANCE = 2e-5
UNSYNCED_MIN_ERROR = 1e-3
INPUT, OUTPUT = (6, 6, 3), (5,)
SIZES = (3, 5)
# tests/scripts/train_function.py's data, as test_conditional_run.py's: its first moving mean is near 0
# (the examples' offsets average out), 4.4e-5 relative there (measured), ≤ 6e-7 everywhere else
SCRIPT_TOLERANCE = 1e-4


def _build(model, batch_sizes, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
        built = tl.build(model, list(batch_sizes), input_shape=INPUT, **kw)
    built.flag = model.flag(built.graph)
    return built


def _step(built, batch_sizes, flag=True):
    return tl.run_step(built, *_data(batch_sizes), batch_sizes, extra_feed={built.flag: flag})


@functools.lru_cache(maxsize=None)
def _data(batch_sizes):
    return tl.data(list(batch_sizes), INPUT, OUTPUT)


@functools.lru_cache(maxsize=None)
def _reference(make, batch_sizes):
    """One device, the concatenated batch, flag True; per-tower losses on its slices."""
    x, t = _data(batch_sizes)
    ref = _build(make(), [sum(batch_sizes)], scope="", devices=["/cpu:0"], grad_divisor=len(batch_sizes))
    result = tl.run_step(ref, x, t, [sum(batch_sizes)], extra_feed={ref.flag: True})
    per_example = np.square(result["output"] - t.astype(np.float64)).reshape(len(x), -1).sum(1) * 0.5
    result["loss"] = np.array([p.sum() for p in np.split(per_example, np.cumsum(batch_sizes)[:-1])])
    return result


@functools.lru_cache(maxsize=None)
def _original(make, batch_sizes):
    """The un-rewritten graph's step with the flag True and False (gradients built after: the
    numbers do not depend on when)."""
    built = _build(make(), batch_sizes)
    return _step(built, batch_sizes, True), _step(built, batch_sizes, False)


def _errors(got, want, keys=("output", "loss", "grads", "moving")):
    return {k: tl.max_rel_error(got[k], want[k]) for k in keys}


def _block(training, nested):
    return functools.partial(cm.function_block, training, nested)


# (training flag, nested calls, gradients, strategy): every axis both ways, not every combination
CASES = [("flag", False, "after", "gather"), ("flag", False, "before", "allreduce"),
         ("flag", True, "after", "allreduce"), ("flag", True, "before", "gather"),
         ("python", False, "after", "allreduce"), ("python", False, "before", "gather"),
         ("python", True, "after", "gather")]


IDS = [f"{t}-{'nested' if n else 'call'}-{g}-{s}" for t, n, g, s in CASES]
FAST = {"flag-nested-before-gather", "python-call-after-allreduce"}


@pytest.mark.parametrize("training,nested,gradients,strategy", tiers.cases(CASES, IDS, FAST))
def test_batch_norm_in_a_tf_function_equals_one_device(training, nested, gradients, strategy):
    make = _block(training, nested)
    reports = []
    built = _build(make(), SIZES, gradients=gradients,
                   rewrite=lambda g: reports.append(graphsync.rewrite_towers(g, strategy=strategy)))
    report, = reports
    kind = "conditional" if training == "flag" else "fused"
    assert len(report.layers) == 2 and {layer.kind for layer in report.layers} == {kind}, report
    assert {layer.backward for layer in report.layers} == {"rewritten" if gradients == "after" else "autodiff"}
    calls = 2 * (3 if nested else 1) * (2 if gradients == "after" else 1)   # per tower: block (+ norms), backward
    assert len(report.inlined) == len(set(report.inlined)) == calls, report.inlined
    assert f"inlined {calls} tf.function calls first" in str(report)

    errors = _errors(_step(built, SIZES), _reference(make, SIZES))
    assert max(errors.values()) < TOLERANCE, errors
    original_true, original_false = _original(make, SIZES)
    unsynced = _errors(original_true, _reference(make, SIZES))
    assert min(unsynced.values()) > UNSYNCED_MIN_ERROR, unsynced
    if training == "flag":
        evaluation = _errors(_step(built, SIZES, False), original_false)
        assert max(evaluation.values()) == 0.0, evaluation


@tiers.full
def test_three_uneven_towers_and_an_evaluation_step_that_exchanges_nothing():
    sizes = (2, 3, 4)
    make = _block("flag", False)
    built = _build(make(), sizes, rewrite=graphsync.rewrite_towers)
    errors = _errors(_step(built, sizes), _reference(make, sizes))
    assert max(errors.values()) < TOLERANCE, errors
    evaluation = _errors(_step(built, sizes, False), _step(_build(make(), sizes), sizes, False))
    assert max(evaluation.values()) == 0.0, evaluation
    x, t = _data(sizes)
    assert exchange_traffic(built, x, t, sizes, False) == (0, 0)
    ops, n_bytes = exchange_traffic(built, x, t, sizes, True)
    assert ops > 0 and n_bytes > 0


@pytest.mark.parametrize("gradients", [pytest.param("after", marks=tiers.full), "before"])
def test_keras_layers_in_one_tf_function_every_tower_calls(gradients):
    """tf_keras batch norms called with training=is_training inside one tf.function (the model the
    refusal used to name). Keras updates the moving averages inside every tower's call, so they are
    left out: outputs, losses and gradients equal one device, the evaluation step the original."""
    make = cm.keras_function_block
    built = _build(make(), SIZES, gradients=gradients, rewrite=graphsync.rewrite_towers)
    keys = ("output", "loss", "grads")
    errors = _errors(_step(built, SIZES), _reference(make, SIZES), keys)
    assert max(errors.values()) < TOLERANCE, errors
    original_true, original_false = _original(make, SIZES)
    unsynced = _errors(original_true, _reference(make, SIZES), keys)
    assert min(unsynced.values()) > UNSYNCED_MIN_ERROR, unsynced
    evaluation = _errors(_step(built, SIZES, False), original_false, keys)
    assert max(evaluation.values()) == 0.0, evaluation
    old_calls = [op.name for op in built.graph.get_operations() if "_graphsync_inlined" in op.node_def.attr]
    ran = tl.executed_nodes(built, list(SIZES))   # nothing of an old call runs (its body would update again)
    assert old_calls and not [n for n in ran if any(n == c or n.startswith(c + "/") for c in old_calls)]


def test_rewriting_twice_changes_nothing_and_a_stale_call_output_still_runs():
    """A second rewrite finds nothing to inline or synchronize. A tensor held from before the
    rewrite names the old call's output: fetching it runs the old, unsynchronized body (as an old
    batch-norm output does), and the session survives it (TensorFlow names the body it inlines for
    the old call `<call>/…`, graphsync's copy `<call>_inlined/…`)."""
    built = _build(_block("flag", True)(), SIZES, rewrite=graphsync.rewrite_towers)
    before = built.graph.as_graph_def()
    report = graphsync.rewrite_towers(built.graph)
    assert not report.changed and not report.inlined and "already synchronized" in report.summary, report
    assert built.graph.as_graph_def() == before
    stale = built.graph.get_operation_by_name("tower_0/StatefulPartitionedCall").outputs[0]
    x, _ = _data(SIZES)
    with tf1.Session(graph=built.graph, config=tl.CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        assert sess.run(stale, {built.inputs[0]: x[:SIZES[0]]}).shape[0] == SIZES[0]


def test_a_graph_that_cannot_be_planned_once_inlined_is_refused_untouched():
    """Tower 0 calls its batch norm through a tf.function, tower 1 does not: the layers pair only
    once tower 0's call is inlined, and do not. The refusal comes from the rehearsal on a copy:
    one line, the graph exactly as it was (no op added, no edge moved)."""
    plain = cm.function_block("python", False)

    def model(x):
        in_call = tf1.get_default_graph().get_name_scope().startswith("tower_0")
        if in_call:
            return plain(x)
        with tf1.variable_scope("", reuse=True):
            h = tf1.nn.fused_batch_norm(tf.nn.conv2d(x, tf1.get_variable("stem/w"), 1, "SAME"),
                                        tf1.get_variable("bn0/gamma"), tf1.get_variable("bn0/beta"),
                                        epsilon=1e-3)[0]
        return tf.reduce_mean(h, [1, 2]) @ tf.ones([4, 5]), []
    model.flag = cm.is_training
    graphs = []
    with pytest.raises(graphsync.GraphsyncError) as refused:
        _build(model, SIZES, gradients="before",
               rewrite=lambda g: graphs.append((g, g.as_graph_def())) or graphsync.rewrite_towers(g))
    message = str(refused.value)
    assert "\n" not in message and "missing from tower" in message, message
    (graph, before), = graphs
    assert graph.as_graph_def() == before


def _moments_in_a_tf_function(axes):
    """Each tower calls a tf.function holding tf.nn.moments over `axes` and the normalization."""
    def model(x):
        h = tf.nn.conv2d(x, tf1.get_variable("stem/w", [3, 3, 3, 4],
                                             initializer=tf1.glorot_uniform_initializer(seed=1)), 1, "SAME")

        @tf.function
        def normalize(h):
            mean, variance = tf.nn.moments(h, axes, keepdims=True)
            return (h - mean) * tf.math.rsqrt(variance + 1e-3)
        return tf.reduce_mean(tf.nn.relu(normalize(h)), [1, 2]) @ tf.ones([4, 5]), []
    return model


@pytest.mark.parametrize("gradients", ["after", "before"])
def test_unfused_batch_statistics_in_a_tf_function_equal_one_device(gradients):
    """tf.nn.moments over the batch inside a call: the call is inlined with its gradient call
    (the gradient's ops found by structure), and the moments synchronized, forward and backward.
    The same over the other axes (layer norm) is no batch norm: left alone."""
    model, sizes = _moments_in_a_tf_function([0, 1, 2]), list(SIZES)
    reports = []
    built = tl.build(model, sizes, input_shape=INPUT, gradients=gradients,
                     rewrite=lambda g: reports.append(graphsync.rewrite_towers(g)))
    report, = reports
    assert [layer.kind for layer in report.layers] == ["moments"] and \
        len(report.inlined) == (4 if gradients == "after" else 2), report
    x, t = _data(SIZES)
    reference = tl.reference_step(model, sizes, x, t)
    got = tl.run_step(built, x, t, sizes)
    plain = tl.run_step(tl.build(model, sizes, input_shape=INPUT, gradients=gradients), x, t, sizes)
    errors = {k: tl.max_rel_error(got[k], reference[k]) for k in ("output", "grads")}
    unsynced = {k: tl.max_rel_error(plain[k], reference[k]) for k in ("output", "grads")}
    assert max(errors.values()) < TOLERANCE and min(unsynced.values()) > UNSYNCED_MIN_ERROR, (errors, unsynced)
    layer_norm = tl.build(_moments_in_a_tf_function([1, 2, 3]), sizes, input_shape=INPUT, gradients=gradients)
    report = graphsync.rewrite_towers(layer_norm.graph)   # no batch norm in sight, nothing refused
    assert not report.changed and report.summary.startswith("nothing changed: no batch norm"), report.summary


def test_saved_graph_inspect_rewrite_verify(tmp_path):
    """The command line on a saved MetaGraphDef whose towers call nested tf.functions (gradients
    built): inspect lists the calls a rewrite inlines and the layers they hold, rewrite writes the
    synchronized graph, verify passes it."""
    from click.testing import CliRunner
    from cli.main import main
    built = _build(_block("flag", True)(), SIZES)
    saved, synced = str(tmp_path / "calls.meta"), str(tmp_path / "calls_sync.meta")
    tf1.train.export_meta_graph(saved, graph=built.graph)
    runner = CliRunner()
    inspected = runner.invoke(main, ["inspect", saved])
    assert inspected.exit_code == 0, inspected.output
    assert "tf.function calls a rewrite inlines first (12):" in inspected.output, inspected.output
    layers = re.findall(r"^  (StatefulPartitionedCall_inlined/\S+/cond\S*) +conditional +sync +1$",
                        inspected.output, re.M)
    assert len(layers) == 2, inspected.output
    rewritten = runner.invoke(main, ["rewrite", saved, "-o", synced])
    assert rewritten.exit_code == 0 and "(conditional; gradients rewritten)" in rewritten.output, rewritten.output
    verified = runner.invoke(main, ["verify", synced, "--original", saved])
    assert verified.exit_code == 0 and "PASS" in verified.output, verified.output


@tiers.full
def test_graphsync_run_on_an_unchanged_script_whose_towers_call_a_tf_function(tmp_path):
    """tests/scripts/train_function.py (MonitoredTrainingSession, towers 3 + 5 calling one
    tf.function with the is_training placeholder, gradients built before the session) under
    `graphsync run`: the training step and the moving statistics equal one device's, and so does
    the evaluation pass that reads them; under plain python they do not."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "tests", "scripts", "train_function.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in sys.path if p]))
    runs = {"run": [sys.executable, "-m", "graphsync", "run", script, str(tmp_path / "run")],
            "python": [sys.executable, script, str(tmp_path / "python")],
            "one": [sys.executable, script, str(tmp_path / "one"), "--sizes", "8"]}
    started = {name: subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for name, args in runs.items()}
    saved, stderr = {}, {}
    for name, process in started.items():
        _, stderr[name] = process.communicate(timeout=600)
        assert process.returncode == 0, (name, stderr[name][-2000:])
        with np.load(str(tmp_path / name) + ".npz") as arrays:
            saved[name] = {k: arrays[k] for k in arrays.files}

    def errors(got, want):
        return {k: tl.max_rel_error(got[k], want[k]) for k in want}
    synced, unsynced = errors(saved["run"], saved["one"]), errors(saved["python"], saved["one"])
    assert max(synced.values()) < SCRIPT_TOLERANCE, synced
    assert max(unsynced.values()) > 100 * SCRIPT_TOLERANCE, unsynced
    lines = [line for line in stderr["run"].splitlines() if line.startswith("graphsync:")]
    summary = "graphsync: 2 layers × 2 towers synchronized on /device:CPU:0 (conditional; gradients rewritten)"
    assert lines == [summary], stderr["run"][-2000:]
