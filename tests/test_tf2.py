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
MIXED_SYNCED = 2e-3             # mixed_float16: the reference rounds differently to float16


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]),
                TF_CPP_MIN_LOG_LEVEL="2")


def _graphsync():
    return [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def _train(tmp_path, args, runs=("graphsync", "python")):
    """Runs the script under each of `runs` at once: {run: (CompletedProcess, arrays or None)}."""
    started = {}
    for run in runs:
        out = str(tmp_path / f"{run}.npz")
        command = (_graphsync() + ["run"] if run == "graphsync" else [sys.executable]) + [SCRIPT, out] + args
        started[run] = (subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
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
    # name: script arguments
    "fit-2": ["--api", "fit", "--devices", "2", "--examples", "20"],           # a partial last batch
    "fit-4": ["--api", "fit", "--devices", "4", "--examples", "24"],
    "loop-2-tensor-flag": ["--api", "loop", "--devices", "2", "--flag", "tensor", "--examples", "20"],
    "loop-4-uneven": ["--api", "loop", "--devices", "4", "--examples", "23"],    # last batch 7: 2, 2, 2, 1
    "fit-2-nested": ["--api", "fit", "--devices", "2", "--nested"],
    "fit-2-channels-first": ["--api", "fit", "--devices", "2", "--channels-first"],
    "fit-2-mixed": ["--api", "fit", "--devices", "2", "--mixed"],
}


@pytest.mark.parametrize("name", tiers.cases(CASES, list(CASES), fast=["fit-2", "loop-4-uneven"],
                                             kernel_ids=["fit-2-channels-first"]))
def test_a_traced_step_equals_one_device_and_plain_python_does_not(tmp_path, name):
    runs = _train(tmp_path, CASES[name])
    for run, (result, arrays) in runs.items():
        assert result.returncode == 0 and arrays is not None, (run, result.stderr[-3000:])
    synced, plain = error(runs["graphsync"][1]), error(runs["python"][1])
    lines = _lines(runs["graphsync"][0].stderr)
    assert lines and all("synchronized" in line for line in lines), lines
    tolerance = MIXED_SYNCED if "mixed" in name else SYNCED
    assert max(synced) < tolerance, (synced, lines)
    assert max(plain) > max(UNSYNCED, 10 * max(synced)), plain


@tiers.full
def test_keras_3_steps_are_refused_in_one_line(tmp_path):
    """Keras 3's batch norm is tf.nn.moments-like and its tape's gradient is not paired yet: the
    step is refused before it runs, in one line, and --on-error=warn trains per replica."""
    runs = _train(tmp_path, ["--api", "keras3", "--devices", "2"], runs=("graphsync",))
    result, arrays = runs["graphsync"]
    assert result.returncode == 1 and arrays is None
    lines = _lines(result.stderr)
    assert len(lines) == 1 and "gradient is already built" in lines[0] and "Traceback" not in result.stderr, \
        result.stderr[-2000:]


def test_the_one_line_api_synchronizes_a_script_run_by_python(tmp_path):
    runs = _train(tmp_path, ["--api", "loop", "--devices", "2", "--autosync"], runs=("python",))
    result, arrays = runs["python"]
    assert result.returncode == 0 and arrays is not None, result.stderr[-3000:]
    assert any("synchronized" in line for line in _lines(result.stderr)), result.stderr[-2000:]
    assert max(error(arrays)) < SYNCED, error(arrays)


def test_one_replica_is_said(tmp_path):
    runs = _train(tmp_path, ["--api", "fit", "--devices", "1"], runs=("graphsync",))
    result, arrays = runs["graphsync"]
    assert result.returncode == 0 and arrays is not None, result.stderr[-2000:]
    assert any("one replica" in line for line in _lines(result.stderr)), result.stderr[-2000:]
