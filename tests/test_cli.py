"""The `graphsync` command line: a rewritten saved graph trains like the single-device model,
checkpoints restore both ways, options behave, bad input is one line on stderr, and the installed
console script and `python -m graphsync` work from a real shell."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphsync
from fixture_paths import (CHECKPOINT, FIXTURES, FORWARD, META1, META2, META4, MOMENTS1, MOMENTS2, ROOT,
                           SAVEDMODEL)
from cli.main import main
from cli.shell import Progress

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

tf1 = tf.compat.v1
CONFIG = tf1.ConfigProto(device_count={"CPU": 4}, inter_op_parallelism_threads=2,
                         intra_op_parallelism_threads=1)
PER_TOWER = 4


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_error_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("graphsync: error: ") and "Traceback" not in result.stderr
    return lines[0]


# --------------------------------------------------------------------------------------------
# One training step of a rewritten saved graph equals the single-device step


def batch(towers: int, seed: int = 0):
    """Images whose distribution differs per tower (so per-tower statistics are wrong), labels."""
    rng = np.random.RandomState(seed)
    images = rng.randn(towers * PER_TOWER, 8, 8, 3).astype(np.float32)
    images += np.repeat(np.arange(towers, dtype=np.float32) * 1.5, PER_TOWER)[:, None, None, None]
    labels = rng.randint(0, 5, towers * PER_TOWER).astype(np.int32)
    return images, labels


def feed_towers(graph, towers, images, labels):
    feed = {}
    for i, (x, y) in enumerate(zip(np.split(images, towers), np.split(labels, towers))):
        feed[graph.get_tensor_by_name(f"tower_{i}/images:0")] = x
        feed[graph.get_tensor_by_name(f"tower_{i}/labels:0")] = y
    return feed


def train_step(meta_path, towers, images, labels, restore=CHECKPOINT, save_to=None):
    """The user's loop: import the .meta, restore, run the `train_op` collection once; returns
    every variable after the step (and the values restored before it)."""
    graph = tf.Graph()
    with graph.as_default():
        saver = tf1.train.import_meta_graph(meta_path)
        train_op = tf1.get_collection(tf1.GraphKeys.TRAIN_OP)
        variables = tf1.global_variables()
        names = [v.op.name for v in variables]
        with tf1.Session(graph=graph, config=CONFIG) as sess:
            saver.restore(sess, restore)
            restored = dict(zip(names, sess.run(variables)))
            sess.run(train_op, feed_towers(graph, towers, images, labels))
            after = dict(zip(names, sess.run(variables)))
            if save_to:
                saver.save(sess, save_to, write_meta_graph=False, write_state=False)
    return after, restored


def max_relative_error(got: dict, want: dict) -> float:
    assert sorted(got) == sorted(want)
    worst = 0.0
    for name in want:
        g, w = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
        worst = max(worst, float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-12)))
    return worst


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    """The fixtures rewritten once by the command line: name → output path."""
    out = tmp_path_factory.mktemp("rewritten")
    paths = {}
    for name, source, target in [("2", META2, "sync2.meta"), ("4", META4, "sync4.meta"),
                                 ("moments", MOMENTS2, "moments_sync.meta"), ("forward", FORWARD, "forward_sync.pb")]:
        result = invoke("rewrite", source, "-o", out / target)
        assert result.exit_code == 0, result.output
        assert result.stderr == ""
        paths[name] = str(out / target)
    return paths


@pytest.fixture(scope="module")
def reference():
    """Single-device steps (the 1-tower graph on the concatenated batch) by (model, tower count)."""
    return {(ref, towers): train_step(ref, 1, *batch(towers))[0] for ref, towers in
            [(META1, 2), (META1, 4), (MOMENTS1, 2)]}


@pytest.mark.parametrize("name, ref, towers", [("2", META1, 2), ("4", META1, 4), ("moments", MOMENTS1, 2)],
                         ids=["fused 2 towers", "fused 4 towers", "moments 2 towers"])
def test_rewritten_meta_trains_like_one_device(rewritten, reference, name, ref, towers):
    """The fused fixtures and the moments one share variable names, so one checkpoint serves all."""
    after, _ = train_step(rewritten[name], towers, *batch(towers))
    assert max_relative_error(after, reference[ref, towers]) < 2e-5
    assert after["global_step"] == 1


@pytest.mark.parametrize("original, ref", [(META2, META1), (MOMENTS2, MOMENTS1)], ids=["fused", "moments"])
def test_original_meta_does_not_train_like_one_device(reference, original, ref):
    after, _ = train_step(original, 2, *batch(2))
    assert max_relative_error(after, reference[ref, 2]) > 1e-2


def test_checkpoints_restore_both_ways(rewritten, tmp_path):
    # original → rewritten: the fixture checkpoint was written by the original graph.
    after, restored = train_step(rewritten["2"], 2, *batch(2), save_to=str(tmp_path / "synced.ckpt"))
    reader = tf.train.load_checkpoint(CHECKPOINT)
    for name, value in restored.items():
        np.testing.assert_array_equal(value, reader.get_tensor(name))
    # rewritten → original: the original graph restores what the rewritten one saved.
    _, restored_back = train_step(META2, 2, *batch(2), restore=str(tmp_path / "synced.ckpt"))
    assert sorted(restored_back) == sorted(after)
    for name in after:
        np.testing.assert_array_equal(restored_back[name], after[name])


def _logits(graph_path, towers, images, is_meta):
    graph = tf.Graph()
    with graph.as_default():
        if is_meta:
            tf1.train.import_meta_graph(graph_path)
        else:
            graph_def = tf1.GraphDef.FromString(open(graph_path, "rb").read())
            tf1.import_graph_def(graph_def, name="")
        logits = [graph.get_tensor_by_name(f"tower_{i}/logits:0") for i in range(towers)]
        with tf1.Session(graph=graph, config=CONFIG) as sess:
            sess.run("save/restore_all", {"save/Const:0": CHECKPOINT})
            feed = {graph.get_tensor_by_name(f"tower_{i}/images:0"): x
                    for i, x in enumerate(np.split(images, towers))}
            return np.concatenate(sess.run(logits, feed))


def test_rewritten_forward_graphdef_matches_one_device(rewritten):
    images, _ = batch(2)
    want = _logits(META1, 1, images, is_meta=True)
    np.testing.assert_allclose(_logits(rewritten["forward"], 2, images, is_meta=False), want, rtol=1e-4, atol=1e-5)
    assert np.abs(_logits(FORWARD, 2, images, is_meta=False) - want).max() > 1e-2


def _gradients(graph_path, towers, images, labels, is_meta):
    """Gradients of the mean loss over all towers with respect to every variable, built after
    loading (the rewritten forward-only graph differentiates through the synchronized statistics)."""
    graph = tf.Graph()
    with graph.as_default():
        if is_meta:
            tf1.train.import_meta_graph(graph_path)
        else:
            tf1.import_graph_def(tf1.GraphDef.FromString(open(graph_path, "rb").read()), name="")
        handles = [op.outputs[0] for op in graph.get_operations()
                   if op.type == "VarHandleOp" and "global_step" not in op.name]
        loss = tf.add_n([graph.get_tensor_by_name(f"tower_{i}/loss:0") for i in range(towers)]) / towers
        pairs = [(h.op.name, g) for h, g in zip(handles, tf.gradients(loss, handles)) if g is not None]
        with tf1.Session(graph=graph, config=CONFIG) as sess:
            sess.run("save/restore_all", {"save/Const:0": CHECKPOINT})
            values = sess.run([g for _, g in pairs], feed_towers(graph, towers, images, labels))
    return {name: value for (name, _), value in zip(pairs, values)}


def test_rewritten_forward_graphdef_builds_gradients_like_one_device(rewritten):
    data = batch(2)
    want = _gradients(META1, 1, *data, is_meta=True)
    got = _gradients(rewritten["forward"], 2, *data, is_meta=False)
    assert sorted(got) == sorted(want) and len(want) == 8
    assert max_relative_error(got, want) < 2e-5


def test_rewritten_savedmodel_trains_like_one_device(tmp_path, reference):
    out = tmp_path / "sm"
    result = invoke("rewrite", SAVEDMODEL, "--tags", "train", "-o", out)
    assert result.exit_code == 0, result.stderr
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph, config=CONFIG) as sess:
        meta = tf1.saved_model.loader.load(sess, ["train"], str(out))
        saver = tf1.train.Saver(saver_def=meta.saver_def)
        saver.restore(sess, CHECKPOINT)
        sess.run(tf1.get_collection(tf1.GraphKeys.TRAIN_OP), feed_towers(graph, 2, *batch(2)))
        variables = tf1.global_variables()
        after = dict(zip([v.op.name for v in variables], sess.run(variables)))
    assert max_relative_error(after, reference[META1, 2]) < 2e-5


# --------------------------------------------------------------------------------------------
# inspect


def test_inspect_shows_towers_layers_and_summary():
    result = invoke("inspect", META4)
    assert result.exit_code == 0 and result.stderr == ""
    lines = result.output.splitlines()
    assert lines[-1] == "2 layers × 4 towers, gradients present"
    assert "towers (4):" in result.output and "tower_3      /device:CPU:3" in result.output
    assert sum("  sync  " in line for line in lines) == 2


def test_inspect_verbose_lists_every_op_of_every_tower():
    result = invoke("inspect", META4, "-v")
    for i in range(4):
        for layer in ("bn1", "bn2"):
            assert f"tower_{i}/{layer}/FusedBatchNormV3" in result.output


def test_inspect_json():
    result = invoke("inspect", FORWARD, "--json")
    info = json.loads(result.stdout)
    assert info["summary"] == "2 layers × 2 towers, no gradients yet"
    assert info["format"] == "graphdef"
    assert [t["name"] for t in info["towers"]] == ["tower_0", "tower_1"]
    assert [t["device"] for t in info["towers"]] == ["/device:CPU:0", "/device:CPU:1"]
    assert all(layer["synchronize"] and not layer["gradients"] for layer in info["layers"])
    assert [s["op"] for s in info["layers"][0]["sites"]] == ["tower_0/bn1/FusedBatchNormV3",
                                                            "tower_1/bn1/FusedBatchNormV3"]


def test_inspect_one_tower_and_savedmodel():
    single = invoke("inspect", META1)
    assert single.exit_code == 0
    assert single.output.splitlines()[-1] == "1 tower (tower_0): nothing to synchronize across"
    assert "tower_0/bn1/FusedBatchNormV3 [tower_0]: single tower" in single.output
    saved = invoke("inspect", SAVEDMODEL, "--tags", "train")
    assert saved.exit_code == 0 and "savedmodel (tags train)" in saved.output
    assert saved.output.splitlines()[-1] == "2 layers × 2 towers, gradients present"


def test_inspect_already_rewritten(rewritten):
    result = invoke("inspect", rewritten["2"], "--json")
    info = json.loads(result.stdout)
    assert info["layers"] == [] and len(info["skipped"]) == 4
    assert all("already synchronized" in s["reason"] for s in info["skipped"])


def _product_over_the_batch(path):
    """Two towers whose activations are scaled by a product over their batch: refused."""
    graph = tf.Graph()
    with graph.as_default():
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
                h = tf.nn.conv2d(x, tf1.get_variable("w", [3, 3, 3, 4]), 1, "SAME")
                h = h * tf.reduce_prod(tf.sigmoid(h), [0, 1, 2])
                tf.reduce_sum(tf.nn.conv2d(h, tf1.get_variable("v", [3, 3, 4, 4]), 1, "SAME"), name="loss")
        tf1.train.export_meta_graph(str(path), graph=graph)
    return path


def test_inspect_lists_what_a_rewrite_refuses_then_fails_with_its_line(tmp_path):
    """The refusal's "(and 1 more: graphsync inspect)" leads here: every verdict is listed, the
    refused ones too, then the rewrite's own line, status 1, the input untouched."""
    source = _product_over_the_batch(tmp_path / "refused.meta")
    before = source.read_bytes()
    result = invoke("inspect", source)
    rewrite = invoke("rewrite", source, "-o", tmp_path / "out.meta")
    assert result.exit_code == rewrite.exit_code == 1 and not (tmp_path / "out.meta").exists()
    refused = [line for line in result.stdout.splitlines() if line.startswith("  refused ")]
    assert [line.split()[1] for line in refused] == ["tower_0/model/Prod", "tower_1/model/Prod"], result.stdout
    assert result.stdout.splitlines()[-1] == "a rewrite refuses this graph, for the reason below"
    one_error_line(result)
    assert result.stderr == rewrite.stderr and "tower_0/model/Prod (Prod) computes a batch statistic " \
        "graphsync cannot synchronize" in result.stderr and "(and 1 more: graphsync inspect)" in result.stderr
    assert json.loads(invoke("inspect", source, "--json").stdout)["refused"] == result.stderr[len("graphsync: error: "):-1]
    assert source.read_bytes() == before


# --------------------------------------------------------------------------------------------
# rewrite options


def test_rewrite_default_output(tmp_path):
    result = invoke("rewrite", META2, "-o", tmp_path / "out.meta")
    assert result.exit_code == 0 and result.stderr == ""
    summary, wrote = result.stdout.splitlines()
    assert summary == "2 layers × 2 towers synchronized on /device:CPU:0 (fused; gradients rewritten)"
    assert re.fullmatch(rf"wrote {re.escape(str(tmp_path / 'out.meta'))} \(metagraph, 454 → \d+ ops\)", wrote)


def test_rewrite_json_verbose_quiet(tmp_path):
    out = tmp_path / "out.meta"
    info = json.loads(invoke("rewrite", META2, "-o", out, "--json").stdout)
    assert info["towers"] == ["tower_0", "tower_1"] and len(info["layers"]) == 2
    assert info["output_format"] == "metagraph" and info["input_format"] == "metagraph"
    assert {layer["backward"] for layer in info["layers"]} == {"rewritten"}
    verbose = invoke("rewrite", META2, "-o", out, "-v")
    assert "bn1/FusedBatchNormV3  fused   rewritten  2" in verbose.output and "time: loading" in verbose.output
    quiet = invoke("rewrite", META2, "-o", out, "-q")
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_rewrite_dry_run_writes_nothing(tmp_path):
    result = invoke("rewrite", META2, "-o", tmp_path / "out.meta", "--dry-run", "--logdir", tmp_path / "tb")
    assert result.exit_code == 0 and "dry run: would write" in result.output
    assert os.listdir(tmp_path) == []
    assert invoke("rewrite", META2, "--dry-run").exit_code == 0


def test_rewrite_logdir_writes_an_event_file(tmp_path):
    result = invoke("rewrite", META2, "-o", tmp_path / "out.meta", "--logdir", tmp_path / "tb")
    assert result.exit_code == 0
    events = os.listdir(tmp_path / "tb")
    assert len(events) == 1 and events[0].startswith("events.out.tfevents.")
    assert f"tensorboard --logdir {tmp_path / 'tb'}" in result.output


def test_rewrite_towers_device_and_format(tmp_path):
    result = invoke("rewrite", META4, "-o", tmp_path / "out.pbtxt", "--towers", r"tower_[02]/",
                    "--device", "/cpu:1", "--json", "--format", "graphdef-text")
    info = json.loads(result.stdout)
    assert info["towers"] == ["tower_0", "tower_2"] and info["output_format"] == "graphdef-text"
    assert "cpu:1" in info["device"].lower()
    assert (tmp_path / "out.pbtxt").read_text().startswith("node {")


def test_help_version_and_no_arguments():
    top = invoke("--help")
    assert top.exit_code == 0 and "Examples:" in top.output and "rewrite" in top.output
    assert "import_meta_graph" in invoke("rewrite", "--help").output
    assert "--json" in invoke("inspect", "-h").output
    assert invoke("--version").output.strip() == f"graphsync {graphsync.__version__}"
    bare = invoke()
    assert bare.exit_code == 0 and "Commands:" in bare.output


@pytest.mark.parametrize("args, message", [
    (["rewrite", META2], "missing option '-o'"),
    (["rewrite"], "Missing argument 'INPUT'"),
    (["rewrite", META2, "-o", "x.meta", "--bogus"], "No such option"),
    (["rewrite", META2, "-o", "x.meta", "-q", "-v"], "choose -q or -v"),
    (["rewrite", META2, "-o", "x.meta", "--towers", "tower_("], "not a valid regular expression"),
    (["rewrite", META2, "-o", "x.meta", "--device", "cpu:x:y"], "Invalid value for '--device'"),
    (["rewrite", META2, "-o", "x.meta", "--format", "onnx"], "Invalid value for '--format'"),
    (["frobnicate"], "No such command"),
])
def test_usage_errors_exit_2_with_one_line(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in one_error_line(result)
    assert result.stdout == ""


def _digest(path):
    if os.path.isdir(path):
        return sorted((name, _digest(os.path.join(path, name))) for name in os.listdir(path))
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _file(directory, name, data):
    (directory / name).write_bytes(data)
    return directory / name


BAD_RUNS = [  # (id, args from tmp_path, exit status, words in the message)
    ("missing input", lambda t: [t / "nope.meta", "-o", t / "out.meta"], 2, "no such file"),
    ("empty file", lambda t: [_file(t, "empty.meta", b""), "-o", t / "out.meta"], 1, "is empty"),
    ("truncated", lambda t: [_file(t, "cut.meta", open(META2, "rb").read()[:40000]), "-o", t / "out.meta"],
     1, "truncated"),
    ("random bytes", lambda t: [_file(t, "random.pb", np.random.RandomState(3).bytes(2048)), "-o", t / "out.meta"],
     1, "not a"),
    ("image", lambda t: [_file(t, "x.png", b"\x89PNG\r\n\x1a\n" + bytes(64)), "-o", t / "out.meta"], 1, "PNG image"),
    ("checkpoint", lambda t: [CHECKPOINT + ".index", "-o", t / "out.meta"], 1, "checkpoint index"),
    ("not a SavedModel", lambda t: [t, "-o", t / "out.meta"], 1, "not a SavedModel"),
    ("SavedModel without tags", lambda t: [SAVEDMODEL, "-o", t / "sm"], 2, "choose one with --tags"),
    ("output in missing directory", lambda t: [META2, "-o", t / "no" / "out.meta"], 2, "does not exist"),
    ("output is input", lambda t: [META2, "-o", META2], 2, "is the input"),
    ("one tower", lambda t: [META1, "-o", t / "out.meta"], 1, "single tower"),
    ("no towers found", lambda t: [META2, "-o", t / "out.meta", "--towers", r"gpu_\d+/"], 1, "no towers"),
]


@pytest.mark.parametrize("make_args, status, words", [b[1:] for b in BAD_RUNS], ids=[b[0] for b in BAD_RUNS])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, make_args, status, words):
    args = make_args(tmp_path)
    before_fixtures, before_tmp = _digest(FIXTURES), sorted(os.listdir(tmp_path))
    result = invoke("rewrite", *args)
    assert result.exit_code == status, result.stderr
    assert words in one_error_line(result)
    assert result.stdout == ""
    assert _digest(FIXTURES) == before_fixtures
    assert sorted(os.listdir(tmp_path)) == before_tmp


def test_inspect_bad_input():
    result = invoke("inspect", CHECKPOINT + ".data-00000-of-00001")
    assert result.exit_code == 1 and "checkpoint data" in one_error_line(result)


def test_unexpected_exception_is_one_line(monkeypatch, tmp_path):
    import graphsync.io

    def explode(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(graphsync.io, "rewrite_file", explode)
    monkeypatch.delenv("GRAPHSYNC_DEBUG", raising=False)
    result = invoke("rewrite", META2, "-o", tmp_path / "out.meta")
    assert result.exit_code == 1
    assert "internal error: RuntimeError: boom second line" in one_error_line(result)


def test_graphsync_warnings_are_one_line_each(monkeypatch, tmp_path):
    import warnings

    import graphsync.io
    real = graphsync.io.rewrite_file

    def warn_then_rewrite(*args, **kwargs):
        warnings.warn("something to know\nabout", graphsync.GraphsyncWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(graphsync.io, "rewrite_file", warn_then_rewrite)
    result = invoke("rewrite", META2, "-o", tmp_path / "out.meta")
    assert result.exit_code == 0
    assert result.stderr == "graphsync: warning: something to know about\n"
    assert invoke("rewrite", META2, "-o", tmp_path / "out.meta", "-q").stderr == ""


# --------------------------------------------------------------------------------------------
# Progress


def test_progress_appears_only_for_slow_runs():
    slow = io.StringIO()
    with Progress(["loading", "saving"], enabled=True, file=slow, delay=0.0, interval=0.01) as progress:
        progress.stage("loading")
        time.sleep(0.1)
        progress.stage("saving")
    assert "graphsync" in slow.getvalue()
    fast = io.StringIO()
    with Progress(["loading"], enabled=True, file=fast, delay=5.0) as progress:
        progress.stage("loading")
    assert fast.getvalue() == ""
    off = io.StringIO()
    with Progress(["loading"], enabled=False, file=off, delay=0.0) as progress:
        progress.stage("loading")
        time.sleep(0.05)
    assert off.getvalue() == ""


# --------------------------------------------------------------------------------------------
# Real processes: the installed console script and `python -m graphsync`


def start(args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}  # TensorFlow's defaults
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process):
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run(args):
    return finish(start(args))


@pytest.fixture(scope="module")
def console_script():
    path = shutil.which("graphsync")
    if path is None:
        pytest.skip("the graphsync console script is not installed (pip install -e .)")
    return path


def test_console_script_rewrites_and_stays_quiet(console_script, tmp_path, reference):
    out = tmp_path / "out.meta"
    result = run([console_script, "rewrite", META2, "-o", str(out), "--json"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no TensorFlow start-up lines, no progress bar when piped
    assert json.loads(result.stdout)["summary"].startswith("2 layers × 2 towers synchronized")
    after, _ = train_step(str(out), 2, *batch(2))
    assert max_relative_error(after, reference[META1, 2]) < 2e-5


@pytest.mark.parametrize("args, status, message", [
    (["rewrite", "{tmp}/missing.meta", "-o", "{tmp}/o.meta"], 2, "{tmp}/missing.meta: no such file or directory"),
    (["rewrite", CHECKPOINT + ".index", "-o", "{tmp}/o.meta"], 1,
     f"{CHECKPOINT}.index is a checkpoint index, not a graph: pass the .meta file written next to the checkpoint"),
], ids=["before importing TensorFlow", "after importing TensorFlow"])
def test_console_script_error_is_one_line(console_script, tmp_path, args, status, message):
    result = run([console_script] + [a.format(tmp=tmp_path) for a in args])
    assert result.returncode == status
    assert result.stderr.splitlines() == [f"graphsync: error: {message.format(tmp=tmp_path)}"]
    assert result.stdout == ""


@pytest.fixture(scope="module")
def python_m_run():
    return run([sys.executable, "-m", "graphsync", "inspect", META4])


def test_python_m_graphsync_works_like_the_console_script(python_m_run):
    assert python_m_run.returncode == 0, python_m_run.stderr
    assert python_m_run.stdout.splitlines()[-1] == "2 layers × 4 towers, gradients present"
    assert "Traceback" not in python_m_run.stderr


def test_python_m_graphsync_keeps_stderr_clean(python_m_run):
    assert python_m_run.stderr == ""


def test_rewrite_with_allreduce_trains_like_one_device(tmp_path, reference):
    out = tmp_path / "allreduce.meta"
    result = invoke("rewrite", META4, "-o", out, "--strategy", "allreduce")
    assert result.exit_code == 0 and "by all-reduce" in result.output, result.output
    after, _ = train_step(str(out), 4, *batch(4))
    assert max_relative_error(after, reference[META1, 4]) < 2e-5


def test_sync_groups_from_the_command_line(tmp_path):
    """Two groups of two: each group's half of the batch trains like its own single device."""
    out = tmp_path / "groups.meta"
    result = invoke("rewrite", META4, "-o", out, "--group-size", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["groups"] == [["tower_0", "tower_1"], ["tower_2", "tower_3"]]
    images, labels = batch(4)
    half = len(images) // 2
    first = train_step(META1, 1, images[:half], labels[:half])[0]
    grouped = train_step(str(out), 4, images, labels)[0]
    moving = [k for k in first if "moving" in k]   # tower 0's updates: group 0's statistics
    assert len(moving) == 4
    assert max_relative_error({k: grouped[k] for k in moving}, {k: first[k] for k in moving}) < 2e-5
    whole = train_step(META1, 1, images, labels)[0]
    assert max_relative_error({k: grouped[k] for k in moving}, {k: whole[k] for k in moving}) > 1e-2
    assert "in 2 groups of 2" in invoke("rewrite", META4, "--dry-run", "--group-size", "2").output
    assert "sync groups (2)" in invoke("inspect", META4, "--group-size", "2").output
    assert invoke("rewrite", META4, "--dry-run", "--group-size", "3").exit_code != 0
