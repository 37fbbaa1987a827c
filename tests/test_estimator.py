"""tf.estimator, as its users write it up to TensorFlow 2.15 (2.16 removed it): an unchanged script
training with RunConfig(train_distribute=MirroredStrategy) trains like one device on the whole batch
under `graphsync run`, and per replica under plain python.

tests/scripts/estimator_train.py: Estimator.train builds the replicas of its model_fn in one TF1
graph (replica_1/…) and runs them in a MonitoredTrainingSession; graphsync run rewrites that graph
before the session finalizes it. Measured on TensorFlow 2.12.1, 2 replicas × 3 examples, 3 steps:
every variable within 3.5e-7 of one device synchronized, 9e-2 plain.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tiers
from fixture_paths import ROOT

SCRIPT = os.path.join(ROOT, "tests", "scripts", "estimator_train.py")
SYNCED, UNSYNCED = 1e-5, 1e-3   # relative error against one device: rounding / per-replica statistics

pytestmark = [tiers.plumbing, tiers.environment,   # processes; runs where the TensorFlow has tf.estimator
              pytest.mark.skipif(not hasattr(tf, "estimator"), reason="tf.estimator was removed in TensorFlow 2.16")]


def _errors(arrays) -> dict:
    """Variable → relative error of the strategy's run against the reference's."""
    return {key[len("strategy/"):]: float(np.abs(value - arrays[key.replace("strategy/", "reference/")]).max()
                                          / max(float(np.abs(arrays[key.replace("strategy/", "reference/")]).max()), 1e-3))
            for key, value in arrays.items() if key.startswith("strategy/")}


def test_an_estimator_under_mirrored_strategy_equals_one_device_under_graphsync_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]), TF_CPP_MIN_LOG_LEVEL="3")
    runs = {}
    for name, command in (("graphsync", [sys.executable, "-m", "graphsync", "run"]), ("python", [sys.executable])):
        out = tmp_path / f"{name}.npz"
        runs[name] = (subprocess.Popen(command + [SCRIPT, str(out)], cwd=ROOT, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE), out)
    results = {}
    for name, (process, out) in runs.items():
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        results[name] = (stderr, _errors(dict(np.load(out))))

    said = [line for line in results["graphsync"][0].splitlines() if line.startswith("graphsync:")]
    assert said == ["graphsync: 1 layer × 2 towers synchronized on /job:localhost/replica:0/task:0/device:CPU:0 "
                    "(fused; gradients rewritten)"], results["graphsync"][0][-3000:]
    synced, plain = results["graphsync"][1], results["python"][1]
    assert len(synced) == 7 and max(synced.values()) < SYNCED, synced   # kernels, gamma, beta, moving statistics
    assert max(plain.values()) > UNSYNCED, plain
