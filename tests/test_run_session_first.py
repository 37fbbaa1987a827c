"""`graphsync run` on unchanged scripts that open their session before they build the model
(tests/scripts/train_session_first.py): an InteractiveSession on the first line, `with
tf.Graph().as_default(), tf.compat.v1.Session()` around the whole script, a session that ran an
unrelated part of the graph first — each step equals one device on the concatenated batch (uneven
towers of 3 and 5), and the same scripts under plain python do not. A script that ran tower 0's
forward pass before building the other towers is refused in one line: it stops before the
unsynchronized step (--on-error=fail) or says so and trains unsynchronized (warn).

The four TensorFlow subprocesses start together in one module fixture; the one-device reference
runs in this process.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import graphsync
from fixture_paths import ROOT
from test_run import SCRIPTS, SYNCED, UNSYNCED, _env, _graphsync, _graphsync_lines, _loops
from towerlib import max_rel_error

import tower_model  # noqa: E402  (tests/scripts is on sys.path through test_run)

pytestmark = pytest.mark.full   # sessions opened before the model

tf1 = tf.compat.v1
SCRIPT = os.path.join(SCRIPTS, "train_session_first.py")
MODES = ["interactive", "with", "unrelated"]
SUMMARY = "graphsync: 2 layers × 2 towers synchronized on /device:CPU:0 (fused, moments; gradients rewritten)"
REFUSAL = ("graph 1: tower_0/bn1/FusedBatchNormV3 was part of a Session.run before the other towers were built, "
           "and that session (still open) would ignore the rewrite: build every tower before the first run, "
           "or call graphsync.rewrite_towers() once they are built and run them in a new session")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("session_first")
    modes = [arg for mode in MODES for arg in ("--mode", mode)]
    commands = {
        "graphsync run": _graphsync() + ["run", SCRIPT, str(tmp / "run.npz")] + modes,
        "python": [sys.executable, SCRIPT, str(tmp / "plain.npz"), "--mode", "tower0-first"] + modes,
        "fail": _graphsync() + ["run", SCRIPT, str(tmp / "fail.npz"), "--mode", "tower0-first"],
        "warn": _graphsync() + ["run", "--on-error", "warn", SCRIPT, str(tmp / "warn.npz"), "--mode", "tower0-first"],
    }
    started = {name: subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for name, args in commands.items()}
    done = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=600)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return tmp, done


@pytest.fixture(scope="module")
def one_device():
    return tower_model.one_device_variables(8)


def test_sessions_opened_before_the_model_train_like_one_device(runs, one_device):
    tmp, done = runs
    assert done["graphsync run"].returncode == 0, done["graphsync run"].stderr[-3000:]
    loops = _loops(tmp / "run.npz")
    for mode in MODES:
        assert sorted(loops[mode]) == sorted(one_device) and len(one_device) == 12
        assert max_rel_error(loops[mode], one_device) < SYNCED, mode
    assert _graphsync_lines(done["graphsync run"].stderr) == [SUMMARY] * 3     # one line per graph


def test_the_same_scripts_under_plain_python_do_not(runs, one_device):
    tmp, done = runs
    assert done["python"].returncode == 0, done["python"].stderr[-3000:]
    loops = _loops(tmp / "plain.npz")
    for mode in MODES:
        assert max_rel_error(loops[mode], one_device) > UNSYNCED, mode
    assert _graphsync_lines(done["python"].stderr) == []


def test_a_tower_run_before_the_others_were_built_stops_the_script_in_one_line(runs):
    tmp, done = runs
    result = done["fail"]
    assert result.returncode == 1
    assert _graphsync_lines(result.stderr) == [f"graphsync: error: {REFUSAL}"]
    assert "Traceback" not in result.stderr
    assert result.stdout.startswith("tower 0 loss before training") and "trained" not in result.stdout
    assert not (tmp / "fail.npz").exists()


def test_with_on_error_warn_it_says_so_and_trains_unsynchronized(runs, one_device):
    tmp, done = runs
    result = done["warn"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert _graphsync_lines(result.stderr) == [f"graphsync: warning: {REFUSAL} (running unsynchronized)"]
    trained, plain = _loops(tmp / "warn.npz")["tower0-first"], _loops(tmp / "plain.npz")["tower0-first"]
    assert max_rel_error(trained, plain) < SYNCED                   # exactly what python trains, graph untouched
    assert max_rel_error(trained, one_device) > UNSYNCED


# --------------------------------------------------------------------------------------------
# In this process: which runs look at the graph, partial_run and make_callable, closed sessions


@pytest.mark.parametrize("first_run", ["run", "partial_run_setup", "make_callable"])
def test_every_way_into_the_runtime_rewrites_first(first_run, one_device):
    """partial_run_setup and make_callable copy the graph into the session as run does."""
    said = io.StringIO()
    with graphsync.AutoSync(stream=said), tf.Graph().as_default():
        sess = tf1.Session(config=tower_model.CONFIG)
        train_op, feed = tower_model.build([3, 5])
        variables = tower_model.model_variables()
        with sess:
            init = tf1.global_variables_initializer()
            if first_run == "run":
                sess.run(init)
            elif first_run == "partial_run_setup":
                sess.partial_run_setup([tf.constant(0.0)], [])
            else:
                initialize = sess.make_callable(init)
            assert said.getvalue().splitlines() == [SUMMARY]       # rewritten by that first call
            if first_run == "partial_run_setup":
                sess.run(init)
            elif first_run == "make_callable":
                initialize()
            sess.run(train_op, feed)
            after = sess.run(variables)
    assert said.getvalue().splitlines() == [SUMMARY]
    assert max_rel_error(after, one_device) < SYNCED


def test_a_closed_session_that_ran_tower_0_does_not_stop_the_rewrite(one_device):
    """Only an open session's copy of the graph would be stale: a sanity check in a session closed
    before the towers are built is harmless."""
    said = io.StringIO()
    with graphsync.AutoSync(stream=said), tf.Graph().as_default():
        def sanity_check(i, loss, feed):
            if i == 0:
                with tf1.Session(config=tower_model.CONFIG) as check:
                    check.run(tf1.global_variables_initializer())
                    check.run(loss, feed)
        train_op, feed = tower_model.build([3, 5], after_tower=sanity_check)
        variables = tower_model.model_variables()
        with tf1.Session(config=tower_model.CONFIG) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train_op, feed)
            after = sess.run(variables)
    assert said.getvalue().splitlines() == [SUMMARY]
    assert max_rel_error(after, one_device) < SYNCED


def test_a_new_session_while_the_one_that_ran_tower_0_is_open_is_refused_too():
    said = io.StringIO()
    with graphsync.AutoSync(on_error="warn", stream=said), tf.Graph().as_default() as graph:
        first = tf1.Session(config=tower_model.CONFIG)

        def sanity_check(i, loss, feed):
            if i == 0:
                first.run(tf1.global_variables_initializer())
                first.run(loss, feed)
        tower_model.build([3, 5], after_tower=sanity_check)
        before = len(graph.get_operations())
        tf1.Session(config=tower_model.CONFIG).close()
        first.close()
    assert said.getvalue().splitlines() == [f"graphsync: warning: {REFUSAL} (running unsynchronized)"]
    assert len(graph.get_operations()) == before                                  # untouched


def test_a_graph_is_looked_at_again_only_when_it_gained_ops_that_may_be_batch_norm():
    """The per-run check is a version comparison; a graph that grew is looked at again only if the
    ops added include a type some batch-norm form starts from (one pass over those ops)."""
    looks = []

    class Counting(graphsync.AutoSync):
        def options_for(self, graph):
            looks.append(graph.version)
            return super().options_for(graph)

    with Counting(stream=io.StringIO()), tf.Graph().as_default():
        sess = tf1.Session(config=tower_model.CONFIG)
        x = tf.ones([2, 1, 1, 3])
        for _ in range(3):
            sess.run(x)
        y = x + 1
        sess.run(y)
        sess.run(y)
        version = tf1.get_default_graph().version
        z, _, _ = tf1.nn.fused_batch_norm(y, tf.ones([3]), tf.zeros([3]))
        sess.run(z)
        sess.run(z)
        sess.close()
    assert len(looks) == 2 and looks[0] == 0 and looks[1] > version   # at the session's creation; after the batch norm


def _late_layer(sizes):
    """A fused batch norm added to every tower of the default graph: its outputs, and their feed."""
    images, _ = tower_model.data(sum(sizes))
    outputs, feed, start = [], {}, 0
    for i, size in enumerate(sizes):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}/"):       # back into the tower's scope
            x = tf1.placeholder(tf.float32, (None,) + tower_model.IMAGE, name="late_images")
            y, _, _ = tf1.nn.fused_batch_norm(x, tf.ones([3]), tf.zeros([3]), name="late_bn")
            outputs.append(tf.nn.relu(y))
            feed[x] = images[start:start + size]
            start += size
    return outputs, feed


@pytest.mark.parametrize("on_error", ["warn", "fail"])
def test_batch_norm_added_to_the_towers_after_the_rewrite_is_not_silent(on_error):
    said = io.StringIO()
    with graphsync.AutoSync(on_error=on_error, stream=said), tf.Graph().as_default():
        train_op, feed = tower_model.build([3, 5])
        with tf1.Session(config=tower_model.CONFIG) as sess:        # rewritten here
            sess.run(tf1.global_variables_initializer())
            sess.run(train_op, feed)
            tf1.train.Saver()                                       # grows, no batch norm: nothing said
            sess.run(train_op, feed)
            outputs, late_feed = _late_layer([3, 5])
            if on_error == "fail":
                with pytest.raises(SystemExit):
                    sess.run(outputs, late_feed)
            else:
                sess.run(outputs, late_feed)
                sess.run(outputs, late_feed)
    late = ("graphsync: {}: graph 1: 1 batch-norm layer added to its towers after it was synchronized "
            "(first: tower_0/late_bn) would run unsynchronized: build the whole model before its first session "
            "or run, or call graphsync.rewrite_towers() after its last layer")
    kind = {"warn": "warning", "fail": "error"}[on_error]
    suffix = " (running unsynchronized)" if on_error == "warn" else ""
    assert said.getvalue().splitlines() == [SUMMARY, late.format(kind) + suffix]
