"""`graphsync run` and SyncBatchNormHook: unchanged training scripts (tests/scripts/) train like one
device on the concatenated batch — a plain Session loop, MonitoredTrainingSession, Supervisor,
tf_slim's learning.train, tensorpack's multi-GPU trainers and a tf_keras application called per
tower — and the same scripts under plain python do not; the script sees what python would give
it; graphs are rewritten once, only when they have towers; failures are one line.

The TensorFlow subprocesses start together in a module fixture (the frameworks' in a second, the full tier's) (each costs seconds to import
TensorFlow); the one-device references run in this process, except tensorpack's (its
SimpleTrainer) and the tf_keras application's, which the scripts themselves train under python.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphsync
from cli.main import main
from fixture_paths import ROOT
import tiers
from towerlib import max_rel_error

tf1 = tf.compat.v1
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
TRAIN, SLIM = os.path.join(SCRIPTS, "train.py"), os.path.join(SCRIPTS, "train_slim.py")
TENSORPACK, KERAS_APP = os.path.join(SCRIPTS, "train_tensorpack.py"), os.path.join(SCRIPTS, "train_keras_app.py")
BEHAVIOUR, SEVERAL = os.path.join(SCRIPTS, "behaviour.py"), os.path.join(SCRIPTS, "several_graphs.py")
sys.path.insert(0, SCRIPTS)
import tower_model  # noqa: E402  (the scripts' own model module)

SYNCED, UNSYNCED = 1e-4, 1e-2   # relative error vs one device: float rounding / per-tower statistics


def _env():
    """This checkout first on the path, in the children too (the editable install may point elsewhere)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))


def _graphsync():
    """The installed console script, else what it runs."""
    path = shutil.which("graphsync")
    return [path] if path else [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def _start(args, cwd=ROOT, stdin=None):
    return subprocess.Popen(args, cwd=cwd, env=_env(), stdin=subprocess.PIPE if stdin is not None else None,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process, stdin=None):
    stdout, stderr = process.communicate(stdin, timeout=600)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _graphsync_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("graphsync:")]


def _run_all(tmp, commands):
    """Runs `commands` (name: arguments) at once; name → CompletedProcess, each checked."""
    started = {name: _start(args) for name, args in commands.items()}
    done = {name: _finish(process) for name, process in started.items()}
    for name, result in done.items():
        assert result.returncode == 0, f"{name}:\n{result.stderr[-3000:]}"
    return tmp, done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The session script's subprocesses, started at once."""
    tmp = tmp_path_factory.mktemp("runs")
    return _run_all(tmp, {
        "graphsync run": _graphsync() + ["run", TRAIN, str(tmp / "run.npz"),
                                         "--loop", "session", "--loop", "monitored", "--loop", "supervisor"],
        "python -m graphsync run": [sys.executable, "-m", "graphsync", "run", TRAIN, str(tmp / "m.npz")],
        "python": [sys.executable, TRAIN, str(tmp / "plain.npz"), "--loop", "session", "--loop", "monitored",
                   "--hook"],
    })


@pytest.fixture(scope="module")
def framework_runs(tmp_path_factory):
    """The frameworks' scripts (tf_slim, tensorpack, a tf_keras application): the full tier."""
    tmp = tmp_path_factory.mktemp("framework_runs")
    return _run_all(tmp, {
        "slim": _graphsync() + ["run", "--report", str(tmp / "slim.json"), SLIM, str(tmp / "slim")],
        "tensorpack": _graphsync() + ["run", "--report", str(tmp / "tensorpack.json"), TENSORPACK,
                                      str(tmp / "tensorpack"), "--trainer", "replicated", "--trainer", "ps"],
        "tensorpack under python": [sys.executable, TENSORPACK, str(tmp / "tensorpack_python"),
                                    "--trainer", "replicated", "--trainer", "simple"],
        "keras app": _graphsync() + ["run", KERAS_APP, str(tmp / "app.npz")],
        "keras app under python": [sys.executable, KERAS_APP, str(tmp / "app_python.npz"), "--sizes", "8", "--sizes", "3,5"],
    })


def _loops(path) -> dict:
    """loop → {variable: value} from a train.py output file."""
    loops = {}
    with np.load(path) as saved:
        for key in saved.files:
            loop, name = key.split("/", 1)
            loops.setdefault(loop, {})[name] = saved[key]
    return loops


@pytest.fixture(scope="module")
def one_device():
    """train.py's model on one device with the concatenated batch (3 + 5 = 8 examples)."""
    return tower_model.one_device_variables(8)


def test_unchanged_session_script_under_graphsync_run_trains_like_one_device(runs, one_device):
    tmp, done = runs
    for command, path in (("graphsync run", "run.npz"), ("python -m graphsync run", "m.npz")):
        session = _loops(tmp / path)["session"]
        assert sorted(session) == sorted(one_device) and len(session) == 12   # weights, γ, β, moving stats
        assert max_rel_error(session, one_device) < SYNCED, command
    summary = "2 layers × 2 towers synchronized on /device:CPU:0 (fused, moments; gradients rewritten)"
    assert _graphsync_lines(done["python -m graphsync run"].stderr) == [f"graphsync: {summary}"]
    assert done["python -m graphsync run"].stdout == "trained 1 loop(s) on towers of [3, 5]\n"


def test_the_same_script_under_plain_python_does_not(runs, one_device):
    tmp, done = runs
    assert max_rel_error(_loops(tmp / "plain.npz")["session"], one_device) > UNSYNCED
    assert _graphsync_lines(done["python"].stderr) == []


def test_monitored_training_session_and_supervisor_under_graphsync_run(runs, one_device):
    """Both finalize the graph before the first session: the rewrite happens at finalize()."""
    tmp, done = runs
    loops = _loops(tmp / "run.npz")
    for loop in ("monitored", "supervisor"):
        assert max_rel_error(loops[loop], one_device) < SYNCED, loop
    assert len(_graphsync_lines(done["graphsync run"].stderr)) == 3   # one line per graph


def test_sync_batch_norm_hook_under_plain_python(runs, one_device):
    tmp, _ = runs
    assert max_rel_error(_loops(tmp / "plain.npz")["monitored"], one_device) < SYNCED


def test_hook_with_singular_monitored_session_reports(one_device):
    hook = graphsync.SyncBatchNormHook()
    with tf.Graph().as_default():
        train_op, feed = tower_model.build([3, 5])
        variables = tower_model.model_variables()
        assert hook.report is None
        with tf1.train.SingularMonitoredSession(hooks=[hook], config=tower_model.CONFIG) as sess:
            sess.run(train_op, feed)
            after = sess.run(variables)
    assert hook.report.summary.startswith("2 layers × 2 towers synchronized")
    assert max_rel_error(after, one_device) < SYNCED


def test_a_graph_with_nothing_yet_is_looked_at_again_when_it_grew(one_device):
    """A session opened before the towers exist leaves the graph undecided: the next session on
    the grown graph synchronizes it, and an unchanged graph is not scanned again."""
    import io
    said = io.StringIO()
    with graphsync.AutoSync(verbose=True, stream=said), tf.Graph().as_default():
        tf1.Session(config=tower_model.CONFIG).close()
        tf1.Session(config=tower_model.CONFIG).close()
        train_op, feed = tower_model.build([3, 5])
        variables = tower_model.model_variables()
        with tf1.Session(config=tower_model.CONFIG) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train_op, feed)
            after = sess.run(variables)
    lines = said.getvalue().splitlines()
    assert lines[0] == "graphsync: graph 1 left alone: nothing changed: no batch norm to synchronize (0 towers)"
    assert lines[1].startswith("graphsync: 2 layers × 2 towers synchronized") and len(lines) == 5   # -v: + table
    assert max_rel_error(after, one_device) < SYNCED


def test_options_for_decides_per_graph():
    """The seam for subclasses: options_for(graph) → rewrite_towers' options, or None to leave it."""
    class OnlyMarked(graphsync.AutoSync):
        def options_for(self, graph):
            return {"group_size": 2} if graph.get_collection("sync_me") else None

    import io
    with OnlyMarked(stream=io.StringIO()) as chooser:
        graphs = []
        for mark in (False, True):
            with tf.Graph().as_default() as graph:
                tower_model.build([2, 2])
                if mark:
                    graph.add_to_collection("sync_me", 1)
                graph.finalize()
                graphs.append(graph)
    assert [r.groups for r in chooser.reports] == [[["tower_0", "tower_1"]]]
    assert not any(op.name.startswith("graphsync/") for op in graphs[0].get_operations())


def test_importing_graphsync_imports_no_tensorflow():
    code = ("import sys, graphsync, graphsync.autosync.patching, cli.main; graphsync.AutoSync().install(); "
            "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)")
    done = _finish(_start([sys.executable, "-c", code]))
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------------------------
# A third-party trainer from the package index: tf_slim's learning.train over model_deploy clones


def _slim_step(clones: int) -> dict:
    import train_slim
    with tf.Graph().as_default():
        train_tensor = train_slim.build(clones)
        variables = {v.op.name: v for v in tf1.global_variables() if "global_step" not in v.op.name}
        with tf1.Session(config=train_slim.CONFIG) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train_tensor)
            return sess.run(variables)


@tiers.full
def test_tf_slim_learning_train_under_graphsync_run_trains_like_one_clone(framework_runs):
    tmp, done = framework_runs
    checkpoint = tf.train.load_checkpoint(str(tmp / "slim"))
    trained = {name: checkpoint.get_tensor(name) for name in checkpoint.get_variable_to_shape_map()
               if "global_step" not in name}
    one_clone = _slim_step(1)
    assert sorted(trained) == sorted(one_clone) and sum("BatchNorm" in name for name in trained) == 8
    assert max_rel_error(trained, one_clone) < SYNCED
    assert max_rel_error(_slim_step(2), one_clone) > UNSYNCED        # the same clones, unsynchronized
    report = json.loads((tmp / "slim.json").read_text())
    assert [g["towers"] for g in report["graphs"]] == [["clone_0", "clone_1"]]
    assert len(report["graphs"][0]["layers"]) == 2
    assert _graphsync_lines(done["slim"].stderr) == [f"graphsync: {report['graphs'][0]['summary']}"]


# --------------------------------------------------------------------------------------------
# A third-party trainer that builds the towers, owns the session and runs the loop: tensorpack


def _checkpoint(directory) -> dict:
    checkpoint = tf.train.load_checkpoint(str(directory))
    return {name: checkpoint.get_tensor(name) for name in checkpoint.get_variable_to_shape_map()
            if "global_step" not in name}


def _validation_cost(directory) -> float:
    """The InferenceRunner's cost after the step (moving statistics in inference mode), from stats.json."""
    return json.loads((directory / "stats.json").read_text())[-1]["validation_cost"]


@tiers.full
def test_tensorpack_trainers_under_graphsync_run_train_like_one_device(framework_runs):
    """SyncMultiGPUTrainerReplicated (one copy of every variable per tower, tower 1's local) and
    …ParameterServer (shared variables), towers on /gpu:k soft-placed on this machine, against
    tensorpack's SimpleTrainer on the whole batch (under plain python): tensorpack's BatchNorm with
    its updates run by a callback or inside the forward pass (fused) and a tf.layers batch norm
    (moments); the inference tower the InferenceRunner adds is left alone and sees the same model."""
    tmp, done = framework_runs
    one_device = _checkpoint(tmp / "tensorpack_python" / "simple")
    assert sum("EMA" in name or "moving" in name for name in one_device) == 6 and len(one_device) == 17
    for trainer in ("replicated", "ps"):
        trained = _checkpoint(tmp / "tensorpack" / trainer)
        assert sorted(trained) == sorted(one_device), trainer
        assert max_rel_error(trained, one_device) < SYNCED, trainer
        assert _validation_cost(tmp / "tensorpack" / trainer) == \
            pytest.approx(_validation_cost(tmp / "tensorpack_python" / "simple"), rel=SYNCED)
    report = json.loads((tmp / "tensorpack.json").read_text())
    assert [g["towers"] for g in report["graphs"]] == [["tower0", "tower1"]] * 2
    assert [len(g["layers"]) for g in report["graphs"]] == [3, 3]
    for graph in report["graphs"]:   # the inference tower's two fused batch norms (bn2 is moments there)
        assert [s["reason"].split(" (")[0] for s in graph["skipped"]] == ["inference mode"] * 2
    assert _graphsync_lines(done["tensorpack"].stderr) == [f"graphsync: {g['summary']}" for g in report["graphs"]]


@tiers.full
def test_the_tensorpack_script_under_plain_python_does_not(framework_runs):
    tmp, done = framework_runs
    one_device = _checkpoint(tmp / "tensorpack_python" / "simple")
    assert max_rel_error(_checkpoint(tmp / "tensorpack_python" / "replicated"), one_device) > UNSYNCED
    assert _validation_cost(tmp / "tensorpack_python" / "replicated") != \
        pytest.approx(_validation_cost(tmp / "tensorpack_python" / "simple"), rel=UNSYNCED)
    assert _graphsync_lines(done["tensorpack under python"].stderr) == []


# --------------------------------------------------------------------------------------------
# A tf_keras application (MobileNetV2, 52 batch norms) called on every tower, MonitoredTrainingSession

APP_TRAINABLE = 5e-2   # global relative error of one step's update of the trainable weights (see below)


def _app_step(path, sizes: str) -> tuple:
    """(before, after) weights of train_keras_app.py's step on towers of `sizes`."""
    with np.load(path) as saved:
        return tuple({key.split("/", 2)[2]: saved[key] for key in saved.files if key.startswith(f"{sizes}/{when}/")}
                     for when in ("before", "after"))


def _update_errors(step, one_device_step) -> dict:
    """‖Δ − Δ₁‖ / ‖Δ₁‖ over all weights of each kind at once, Δ the step's change of the weights."""
    (before, after), (before_1, after_1) = step, one_device_step
    errors = {}
    for kind in ("moving_mean", "moving_variance", "trainable"):
        names = [n for n in after_1 if kind in n or (kind == "trainable" and "moving" not in n)]
        change = np.concatenate([(after[n] - before[n]).ravel() for n in names]).astype(np.float64)
        change_1 = np.concatenate([(after_1[n] - before_1[n]).ravel() for n in names]).astype(np.float64)
        errors[kind] = float(np.linalg.norm(change - change_1) / np.linalg.norm(change_1))
    return errors


@tiers.full
def test_keras_application_per_tower_under_graphsync_run_trains_like_one_device(framework_runs):
    """The moving statistics come from the forward pass alone: within float rounding (measured
    9e-6 for the means, 2e-5 for the variances). The trainable weights' update is compared as one
    vector: at random init the pre-activations of a deep ReLU6 net come within rounding of 0, and
    one that changes sign with rounding (measured: one in block_5_expand_relu, at 2.3e-6) flips a
    mask and moves every earlier gradient by about 0.6 % (the whole update by 0.6 %, the layers
    after it by 4e-4); unsynchronized towers move the update by about 1000 %."""
    tmp, done = framework_runs
    one_device = _app_step(tmp / "app_python.npz", "8")
    synced = _app_step(tmp / "app.npz", "3,5")
    assert len(one_device[0]) == 262 and sum("moving" in n for n in one_device[0]) == 2 * 52
    for before in (synced[0], _app_step(tmp / "app_python.npz", "3,5")[0]):       # the same initial weights
        assert sorted(before) == sorted(one_device[0])
        assert all(np.array_equal(before[n], one_device[0][n]) for n in before)
    errors = _update_errors(synced, one_device)
    assert errors["moving_mean"] < SYNCED and errors["moving_variance"] < SYNCED, errors
    assert errors["trainable"] < APP_TRAINABLE, errors
    assert _graphsync_lines(done["keras app"].stderr) == [
        "graphsync: 52 layers × 2 towers synchronized on /device:CPU:0 (fused; gradients rewritten)"]


@tiers.full
def test_the_keras_application_under_plain_python_does_not(framework_runs):
    tmp, done = framework_runs
    errors = _update_errors(_app_step(tmp / "app_python.npz", "3,5"), _app_step(tmp / "app_python.npz", "8"))
    assert min(errors.values()) > UNSYNCED and errors["trainable"] > 20 * APP_TRAINABLE, errors
    assert _graphsync_lines(done["keras app under python"].stderr) == []


# --------------------------------------------------------------------------------------------
# The script sees what python gives it


@pytest.mark.parametrize("args", [["plain", "--towers", "x", "-v", "--", "y"], ["exit", "3"], ["raise"]],
                         ids=["argv", "exit status", "exception"])
def test_script_sees_what_python_gives_it(args, tmp_path):
    relative = os.path.relpath(BEHAVIOUR, ROOT)
    python = _finish(_start([sys.executable, relative] + args, stdin=""), "from stdin\n")
    ours = _finish(_start(_graphsync() + ["run", relative] + args, stdin=""), "from stdin\n")
    assert (ours.returncode, ours.stdout, ours.stderr) == (python.returncode, python.stdout, python.stderr)
    seen = json.loads(ours.stdout)
    assert seen["argv"] == [relative] + args and seen["file"] == BEHAVIOUR and seen["path0"] == SCRIPTS
    assert seen["name"] == "__main__" and seen["main_is_this"] and seen["stdin"] == "from stdin\n"
    assert not seen["tensorflow_imported"]                       # graphsync run imports no TensorFlow itself
    assert ours.returncode == {"plain": 0, "exit": 3, "raise": 1}[args[0]]
    if args == ["raise"]:
        assert ours.stderr.splitlines()[-1] == "ValueError: raised by the script"
        assert 'File "' + BEHAVIOUR + '", line' in ours.stderr and "runpy" not in ours.stderr


def test_a_script_that_does_not_compile_fails_as_under_python(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text('print("unclosed"\n')
    python = _finish(_start([sys.executable, str(script)]))
    ours = _finish(_start(_graphsync() + ["run", str(script)]))
    assert (ours.returncode, ours.stdout, ours.stderr) == (python.returncode, python.stdout, python.stderr)
    assert ours.returncode == 1 and ours.stderr.splitlines()[-1].startswith("SyntaxError:")


def test_module_runs_like_python_m():
    args = ["-m", "behaviour", "--towers", "x"]
    python = _finish(_start([sys.executable] + args, cwd=SCRIPTS, stdin=""), "")
    ours = _finish(_start([sys.executable, "-m", "graphsync", "run"] + args, cwd=SCRIPTS, stdin=""), "")
    assert (ours.returncode, ours.stdout, ours.stderr) == (python.returncode, python.stdout, python.stderr)
    assert json.loads(ours.stdout)["argv"] == [BEHAVIOUR, "--towers", "x"]


# --------------------------------------------------------------------------------------------
# Which graphs, how often, and failures (in this process: TensorFlow is imported already)


def invoke_run(*args):
    """`graphsync run …` here, with the interpreter state the command changes put back."""
    saved = sys.argv[:], sys.path[:], sys.modules["__main__"]
    try:
        return CliRunner().invoke(main, ["run", *map(str, args)], catch_exceptions=False)
    finally:
        sys.argv[:], sys.path[:], sys.modules["__main__"] = saved[0], saved[1], saved[2]


def test_only_the_multi_tower_graph_is_rewritten_once():
    session_class = tf1.Session.__mro__[1]
    init, finalize = session_class.__init__, tf.Graph.finalize
    result = invoke_run("-v", SEVERAL)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    counts = dict(line.split(": ") for line in result.stdout.splitlines())
    before_after = {name: [int(n) for n in text.replace(" ops", "").split(" -> ")] for name, text in counts.items()}
    assert before_after["no towers"][0] == before_after["no towers"][1]                 # left alone
    assert before_after["rewritten by the script"][0] == before_after["rewritten by the script"][1]   # not twice
    assert before_after["left to graphsync"][1] > before_after["left to graphsync"][0]
    said = result.stderr.splitlines()
    assert said[0].startswith("graphsync: graph 1 left alone: no towers found among 2 batch-norm ops")
    assert said[1] == "graphsync: graph 2: already rewritten by the script"
    assert said[2] == "graphsync: 2 layers × 2 towers synchronized on /device:CPU:0 (fused, moments; gradients rewritten)"
    assert len(said) == 6 and said[-1].startswith("graphsync:   bn2/moments/mean  ")   # -v: the layer table
    assert session_class.__init__ is init and tf.Graph.finalize is finalize   # patches undone


def test_a_graph_that_cannot_be_rewritten_stops_the_script_untouched(tmp_path):
    result = invoke_run("--report", tmp_path / "report.json", SEVERAL, "broken")
    assert result.exit_code == 1
    error = result.stderr.splitlines()[-1]
    assert error.startswith("graphsync: error: layer 'model/extra/") and "missing from tower(s) tower_0" in error
    assert "Traceback" not in result.stderr and "went on" not in result.stdout
    assert len(json.loads((tmp_path / "report.json").read_text())["graphs"]) == 1   # the graph before it


def test_on_error_warn_runs_on_unsynchronized():
    result = invoke_run("--on-error", "warn", "-q", SEVERAL, "broken")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-2:] == ["broken: 142 -> 142 ops", "the script went on"]
    [warning] = result.stderr.splitlines()                       # -q: only the failure
    assert warning.startswith("graphsync: warning: layer 'model/extra/") and warning.endswith("(running unsynchronized)")


@pytest.mark.parametrize("args, message", [
    ([], "missing SCRIPT (or -m MODULE)"),
    (["{tmp}/missing.py"], "{tmp}/missing.py: no such file or directory"),
    (["--report", "{tmp}/no/dir/r.json", BEHAVIOUR], "cannot write {tmp}/no/dir/r.json: directory {tmp}/no/dir does not exist"),
    (["-q", "-v", BEHAVIOUR], "choose -q or -v, not both"),
], ids=["no script", "missing script", "report directory", "quiet and verbose"])
def test_usage_errors_are_one_line(args, message, tmp_path):
    result = invoke_run(*[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"graphsync: error: {message.format(tmp=tmp_path)}"
                                          + (" (see 'graphsync run --help')" if "missing SCRIPT" in message
                                             or "choose" in message else "")]
