"""TF2 scripts unchanged: the steps `tf.function` traces under MirroredStrategy train like one device
on the whole batch under `graphsync run`, and per replica under plain python.

tests/scripts/tf2_train.py trains a small conv net for 3 steps under MirroredStrategy (tf_keras'
model.fit, or a custom loop of strategy.run over a distributed dataset), then the same steps on
one device without a strategy; it saves every weight and every replica's moving statistics. Each
case runs the script under `graphsync run` and under python at once; the first must equal the
reference within SYNCED (one vector of all weights, and every replica's moving mean and variance:
each replica holds the global statistics), the second must not.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tiers
from fixture_paths import ROOT

SCRIPT = os.path.join(ROOT, "tests", "scripts", "tf2_train.py")
SYNCED, UNSYNCED = 1e-5, 1e-3   # relative error vs one device: float rounding / per-replica statistics
MIXED_SYNCED = 5e-4             # mixed_float16: a 1e-7 change in a float32 statistic can flip a float16 rounding (4.6e-5 measured)


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]),
                TF_CPP_MIN_LOG_LEVEL="2")


def _graphsync():
    return [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def _train(tmp_path, args, runs=("graphsync", "python"), env=None):
    """Runs the script under each of `runs` at once: {run: (CompletedProcess, arrays or None)}."""
    started = {}
    for run in runs:
        out = str(tmp_path / f"{run}.npz")
        command = (_graphsync() + ["run"] if run == "graphsync" else [sys.executable]) + [SCRIPT, out] + args
        started[run] = (subprocess.Popen(command, cwd=ROOT, env=dict(_env(), **(env or {})), stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True), out)
    done = {}
    for run, (process, out) in started.items():
        stdout, stderr = process.communicate(timeout=600)
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        done[run] = (result, dict(np.load(out)) if os.path.exists(out) else None)
    return done


def error(arrays) -> tuple:
    """(relative error of all weights as one vector, largest relative error of a replica's moving
    statistic) against the one-device reference."""
    num = den = 0.0
    moving = 0.0
    for key, value in arrays.items():
        if not key.startswith("strategy/"):
            continue
        reference = key.replace("strategy/", "reference/")
        if "/replica_" in key:
            reference = reference[:reference.index("/replica_")] + "/replica_0" + \
                reference[reference.index("/", reference.index("/replica_") + 1):]
            scale = max(float(np.abs(arrays[reference]).max()), 1e-3)
            moving = max(moving, float(np.abs(value - arrays[reference]).max()) / scale)
        else:
            num += float(((value - arrays[reference]) ** 2).sum())
            den += float((arrays[reference] ** 2).sum())
    return (num / den) ** 0.5, moving


def _lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("graphsync:")]


CASES = {
    # name: script arguments. Four replicas once (loop-4-uneven): the other forms at 2, where a
    # fourth replica adds nothing but time (fit-4, keras3-4 and loop-4-decoder, until 2026-12-07)
    "fit-2": ["--api", "fit", "--devices", "2", "--examples", "20"],           # a partial last batch
    "loop-2-tensor-flag": ["--api", "loop", "--devices", "2", "--flag", "tensor", "--examples", "20"],
    "loop-4-uneven": ["--api", "loop", "--devices", "4", "--examples", "23"],    # last batch 7: 2, 2, 2, 1
    "fit-2-nested": ["--api", "fit", "--devices", "2", "--nested"],
    "fit-2-channels-first": ["--api", "fit", "--devices", "2", "--channels-first"],   # needs oneDNN on CPU
    "fit-2-mixed": ["--api", "fit", "--devices", "2", "--mixed"],
    "keras3-2": ["--api", "keras3", "--devices", "2", "--examples", "20"],      # moments: the tape's record
    # variables on the CPU, the replicas' compute on 2 devices; evaluate afterwards, under the strategy
    "fit-2-central-evaluate": ["--api", "fit", "--devices", "2", "--central", "--evaluate", "--examples", "20"],
    "loop-2-central": ["--api", "loop", "--devices", "2", "--central"],
    "fit-2-train-on-batch": ["--api", "fit", "--devices", "2", "--on-batch", "--examples", "20"],
    # a decoder: the batch norm after a transposed convolution, a Conv2DBackpropInput in the forward
    "fit-2-decoder": ["--api", "fit", "--devices", "2", "--decoder", "--examples", "20"],
    "loop-2-decoder": ["--api", "loop", "--devices", "2", "--decoder", "--examples", "20"],
    "keras3-2-decoder": ["--api", "keras3", "--devices", "2", "--decoder", "--examples", "20"],
}


@pytest.mark.parametrize("name", tiers.cases(CASES, list(CASES), fast=["fit-2", "loop-4-uneven", "keras3-2"]))
def test_a_traced_step_equals_one_device_and_plain_python_does_not(tmp_path, name):
    if "--channels-first" in CASES[name]:
        import towerlib
        if not towerlib.channels_first_conv_gradients():
            pytest.skip("this CPU's TensorFlow has no channels-first convolution gradient (oneDNN off or a CPU "
                        "without it): the script fails with plain python too")
    runs = _train(tmp_path, CASES[name])
    for run, (result, arrays) in runs.items():
        assert result.returncode == 0 and arrays is not None, (run, result.stderr[-3000:])
    synced, plain = error(runs["graphsync"][1]), error(runs["python"][1])
    lines = _lines(runs["graphsync"][0].stderr)
    assert lines and all("synchronized" in line for line in lines), lines
    tolerance = MIXED_SYNCED if "mixed" in name else SYNCED
    assert max(synced) < tolerance, (synced, lines)
    assert max(plain) > max(UNSYNCED, 10 * max(synced)), plain
    evaluated = runs["graphsync"][1]
    if "evaluation/strategy" in evaluated:   # evaluate has no batch statistic: left alone, nothing said
        assert len(lines) == 1, lines
        assert abs(evaluated["evaluation/strategy"] / evaluated["evaluation/reference"] - 1) < tolerance, evaluated


UNPAIRED = """
import numpy as np
import tensorflow as tf
import graphsync
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
def step(x, w):
    with tf.GradientTape() as tape:
        tape.watch(w)
        h = tf.matmul(x, w)
        mean, variance = tf.nn.moments(h, [0])
        loss = tf.reduce_sum(tf.square((h - mean) * tf.math.rsqrt(variance + 1e-3)) * tf.range(1.0, 5.0))
    return tape.gradient(loss, w)
w = np.random.RandomState(1).normal(size=(3, 4)).astype("float32")
traced = tf.function(lambda x: strategy.run(step, args=(x, tf.constant(w)))).get_concrete_function(
    tf.TensorSpec([4, 3]))   # each replica its half: the script traces its own step
graph = traced.graph
try:
    print(graphsync.rewrite_towers(graph).summary)
except graphsync.GraphsyncError as exc:
    print("refused:", exc)
"""


@tiers.full
def test_an_empty_replica_gets_the_global_moving_statistics(tmp_path):
    """A last batch of 3 on 4 replicas: one replica is traced with no examples; Keras writes its
    copy of the moving averages back unchanged, graphsync gives it the global ones. Without oneDNN:
    with it, TensorFlow's own step fails on the empty convolution output (plain python too)."""
    runs = _train(tmp_path, ["--api", "loop", "--devices", "4", "--examples", "19"],
                  env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    for run, (result, arrays) in runs.items():
        assert result.returncode == 0 and arrays is not None, (run, result.stderr[-3000:])
    synced, plain = error(runs["graphsync"][1]), error(runs["python"][1])
    assert max(synced) < SYNCED and max(plain) > UNSYNCED, (synced, plain)


@tiers.full
def test_a_tape_step_rewritten_by_hand_is_paired_as_under_graphsync_run(tmp_path):
    """rewrite_towers() called on a step the script traced itself, without graphsync run or
    autosync(): importing graphsync records what the tape differentiated (graph/tape.py), so the
    moments' backward is paired and synchronized, not refused. (That a tape's record pairs it
    right is proven numerically under graphsync run: the keras3 cases above, moments on a tape.)"""
    result = subprocess.run([sys.executable, "-c", UNPAIRED], cwd=ROOT, env=_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0 and "refused" not in result.stdout, (result.stdout, result.stderr[-2000:])
    assert "1 layer × 2 towers synchronized" in result.stdout, (result.stdout, result.stderr[-2000:])


@tiers.plumbing
@pytest.mark.parametrize("on_error", tiers.cases(["fail", "warn"], ["fail", "warn"], fast=()))
def test_parameter_server_strategy_is_said_before_the_first_step(tmp_path, on_error):
    """ParameterServerStrategy as its tutorial runs it (tests/scripts/ps_strategy_train.py: a chief
    scheduling steps through a ClusterCoordinator onto 2 workers, 1 ps): workers step on their own,
    there is no shared step to synchronize; one line before the first step, said once for the
    step's traces, and --on-error decides whether training goes on."""
    import json

    import cluster
    spec = cluster.cluster_spec({"chief": 1, "worker": 2, "ps": 1})
    with cluster.servers(spec, jobs=("worker", "ps"), timeout=240):
        env = dict(_env(), TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "chief", "index": 0}}))
        result = subprocess.run(_graphsync() + ["run", "--on-error", on_error,
                                                os.path.join(ROOT, "tests", "scripts", "ps_strategy_train.py")],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = _lines(result.stderr)
    assert len(lines) == 1 and "train_step runs under ParameterServerStrategy" in lines[0] and \
        "its batch norms would use each replica's statistics" in lines[0], (lines, result.stderr[-2000:])
    trained = "trained" in result.stdout
    assert (result.returncode, trained) == ((1, False) if on_error == "fail" else (0, True)), result.stderr[-2000:]


LET_THROUGH = """
import sys
import numpy as np
import tensorflow as tf
import graphsync
from graphsync.autosync.worker import BetweenGraphSync


class LetThrough(BetweenGraphSync):   # a decision with a hole: every traced step left to the guard
    def decide_function(self, graph, label, replicated, options=None):
        pass


LetThrough(on_error=sys.argv[1]).install()
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    w = tf.Variable(np.ones((3, 4), "float32"))
    norm = tf.keras.layers.BatchNormalization()


@tf.function
def train_step(x):
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(norm(tf.matmul(x, w), training=True)) * tf.range(1.0, 5.0))
        w.assign_sub(0.1 * tape.gradient(loss, w))
    strategy.run(step, args=(x,))


for batch in strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(tf.ones((4, 3))).repeat(2)):
    train_step(batch)
print("trained")
"""


@tiers.plumbing
@pytest.mark.parametrize("on_error", tiers.cases(["fail", "warn"], ["fail", "warn"], fast={"fail"}))
def test_a_replicated_step_no_decision_synchronized_gets_the_guards_line(tmp_path, on_error):
    """Below the decision, a guard: a traced step with batch norms in several replicas that
    graphsync neither rewrote nor said (here a decision made to let every graph through, under
    graphsync.autosync()'s BetweenGraphSync) gets one line; --on-error decides what follows."""
    result = subprocess.run([sys.executable, "-c", LET_THROUGH, on_error], cwd=ROOT, env=_env(), capture_output=True,
                            text=True, timeout=600)
    lines = _lines(result.stderr)
    assert len(lines) == 1 and "trains batch norms in 2 replicas that graphsync leaves unsynchronized" in lines[0], \
        (lines, result.stderr[-2000:])
    if on_error == "fail":
        assert result.returncode == 1 and lines[0].startswith("graphsync: error: ") and "trained" not in result.stdout
    else:
        assert result.returncode == 0 and lines[0].startswith("graphsync: warning: ") and "trained" in result.stdout


def test_the_one_line_api_synchronizes_a_script_run_by_python(tmp_path):
    runs = _train(tmp_path, ["--api", "loop", "--devices", "2", "--autosync"], runs=("python",))
    result, arrays = runs["python"]
    assert result.returncode == 0 and arrays is not None, result.stderr[-3000:]
    assert any("synchronized" in line for line in _lines(result.stderr)), result.stderr[-2000:]
    assert max(error(arrays)) < SYNCED, error(arrays)


@tiers.plumbing
@pytest.mark.parametrize("api", tiers.cases(["fit", "keras3"], ["fit", "keras3"], fast=["fit"]))
def test_layers_keras_synchronizes_are_left_alone_and_said(tmp_path, api):
    """synchronized=True (tf_keras, Keras 3): Keras all-reduces its own sums; graphsync adds
    nothing, says so, and the step still equals one device."""
    runs = _train(tmp_path, ["--api", api, "--devices", "2", "--synchronized"], runs=("graphsync",))
    result, arrays = runs["graphsync"]
    assert result.returncode == 0 and arrays is not None, result.stderr[-3000:]
    lines = _lines(result.stderr)
    assert lines and all("merged across replicas by the model itself" in line for line in lines), lines
    assert max(error(arrays)) < SYNCED, error(arrays)


@tiers.plumbing
@pytest.mark.parametrize("strategy", tiers.cases(["MirroredStrategy", "OneDeviceStrategy"],
                                                  ["mirrored", "one-device"], fast={"mirrored"}))
def test_one_replica_is_said(tmp_path, strategy):
    """One replica: its batch norms already see the whole batch. One line, the step one device's."""
    runs = _train(tmp_path, ["--api", "fit", "--devices", "1"] + (["--one-device"] if strategy != "MirroredStrategy"
                                                                   else []), runs=("graphsync",))
    result, arrays = runs["graphsync"]
    assert result.returncode == 0 and arrays is not None, result.stderr[-2000:]
    lines = _lines(result.stderr)
    assert len(lines) == 1 and f"one replica under {strategy}" in lines[0], result.stderr[-2000:]
    assert max(error(arrays)) < SYNCED, error(arrays)


MULTI_WORKER = {
    # name: (api, workers, replicas per worker, the loop's dataset, examples per worker beyond a multiple of the batch)
    "fit-2": ("fit", 2, 1, "function", 0),
    "tutorial-loop-3": ("loop", 3, 1, "function", 0),
    # uneven: each worker's last batch 4 + 1 (of 16); no replica empty (with oneDNN
    # TensorFlow's own kernels fail on one, with or without graphsync: test_an_empty_replica_… above)
    "tutorial-loop-2x2-uneven": ("loop", 2, 2, "function", -3),
    "experimental-loop-2x2-uneven": ("loop", 2, 2, "experimental", -3),
}


@pytest.mark.parametrize("api,workers,local,dataset,short", tiers.cases(
    list(MULTI_WORKER.values()), list(MULTI_WORKER), fast={"tutorial-loop-2x2-uneven"}))
def test_multi_worker_processes_equal_one_device_and_plain_python_does_not(tmp_path, api, workers, local, dataset,
                                                                           short):
    """MultiWorkerMirroredStrategy, worker processes on loopback (TF_CONFIG), 1 or 2 replicas each
    (the script gives a CPU worker logical CPUs, as a machine has GPUs): tf_keras model.fit, and
    TensorFlow's own multi-worker custom loop (its step a tf.function defined and called outside
    the strategy's scope, which once trained per replica in silence), its dataset from
    distribute_datasets_from_function or experimental_distribute_dataset, the last batch partial:
    every replica synchronizes with the others, local and remote, through collectives."""
    import json

    import cluster
    started = []
    batch = 4 * workers * local
    for run in ("graphsync", "python"):
        spec = cluster.cluster_spec({"worker": workers})
        for index in range(workers):
            out = str(tmp_path / f"{run}_{index}.npz")
            env = dict(_env(), TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "worker", "index": index}}))
            command = (_graphsync() + ["run"] if run == "graphsync" else [sys.executable]) + \
                [SCRIPT, out, "--api", api, "--multiworker", "--local", str(local), "--dataset", dataset,
                 "--batch", str(batch), "--examples", str(3 * batch + short * workers)]
            started.append((run, index, out, subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                              stderr=subprocess.PIPE, text=True)))
    for run, index, out, process in started:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0 and os.path.exists(out), (run, index, stderr[-3000:])
        synced, plain = run == "graphsync", dict(np.load(out))
        if synced:
            lines = _lines(stderr)
            towers = f"× {local} tower{'s' if local > 1 else ''} synchronized"
            assert any(towers in line and f"across {workers} worker processes" in line
                       for line in lines), lines
            assert all("synchronized" in line or "collectives" in line for line in lines), lines
            assert max(error(plain)) < SYNCED, (index, error(plain))
        else:
            assert max(error(plain)) > UNSYNCED, (index, error(plain))


LOAD_AND_PREDICT = """
import os, sys, numpy as np
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf   # tf.keras: Keras 2, TensorFlow's own up to 2.15, tf_keras from 2.16
x = np.load(sys.argv[1])
for saved, out in zip(sys.argv[2::2], sys.argv[3::2]):
    np.save(out, tf.keras.models.load_model(saved).predict(x, batch_size=8, verbose=0))
"""


@tiers.plumbing
def test_saving_under_the_strategy_works_and_loads_without_graphsync(tmp_path):
    """fit with ModelCheckpoints (SavedModel and h5), then model.save inside strategy.scope(): the functions
    traced for saving hold one layer's call and no training step, so graphsync leaves them alone
    (it once stopped the run after the first epoch); the step is still one device's, and the saved
    model loads and predicts in a process without graphsync as the trained one did."""
    saved = tmp_path / "saved"
    runs = _train(tmp_path, ["--api", "fit", "--devices", "2", "--examples", "16", "--save", str(saved)],
                  runs=("graphsync",))
    result, arrays = runs["graphsync"]
    assert result.returncode == 0 and arrays is not None, result.stderr[-3000:]
    lines = _lines(result.stderr)
    assert lines and all("synchronized" in line for line in lines), lines
    assert max(error(arrays)) < SYNCED, error(arrays)
    assert (saved / "checkpoint" / "saved_model.pb").exists() and (saved / "checkpoint.h5").exists()
    rng = np.random.RandomState(0)
    x = rng.normal(1.0, 2.0, (16, 8, 8, 3)).astype("float32")   # the script's examples
    np.save(tmp_path / "x.npy", x)
    names = ("model", "checkpoint", "checkpoint.h5")   # loaded in one process: TensorFlow imported once
    pairs = [str(p) for name in names for p in (saved / name, tmp_path / f"{name}_predictions.npy")]
    plain = subprocess.run([sys.executable, "-c", LOAD_AND_PREDICT, str(tmp_path / "x.npy")] + pairs,
                           cwd=str(tmp_path), env=dict(_env(), PYTHONPATH=""), capture_output=True, text=True,
                           timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    for name in names:
        out = tmp_path / f"{name}_predictions.npy"
        np.testing.assert_allclose(np.load(out), np.load(saved / "predictions.npy"), rtol=1e-5, atol=1e-5)
