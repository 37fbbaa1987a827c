"""`graphsync run` on an unchanged MonitoredTrainingSession script whose batch norms sit behind an
`is_training` placeholder, fed True in training and False in an evaluation pass
(tests/scripts/train_flag.py): the step's moving statistics, and the evaluation that reads them,
equal one device's on the whole batch; under plain python they do not."""
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.full   # graphsync run behind a flag: test_conditional.py and test_run.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "train_flag.py")
SYNCED, UNSYNCED = 1e-4, 1e-2


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in sys.path if p]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All runs started at once: {name: (completed process, saved arrays)}."""
    tmp = tmp_path_factory.mktemp("flag")
    commands = {}
    for version in ("v2", "v1"):
        extra = ["--v1"] if version == "v1" else []
        commands[f"{version} graphsync run"] = [sys.executable, "-m", "graphsync", "run", SCRIPT,
                                                str(tmp / f"{version}_run.npz")] + extra
        commands[f"{version} python"] = [sys.executable, SCRIPT, str(tmp / f"{version}_python.npz")] + extra
        commands[f"{version} one device"] = [sys.executable, SCRIPT, str(tmp / f"{version}_one.npz"),
                                             "--sizes", "8"] + extra
    started = {name: subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for name, args in commands.items()}
    done = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, (name, stderr[-2000:])
        out = commands[name][-2] if commands[name][-1] == "--v1" else commands[name][-1]
        if name.endswith("one device"):
            out = commands[name][commands[name].index("--sizes") - 1]
        with np.load(out) as saved:
            done[name] = (stderr, {k: saved[k] for k in saved.files})
    return done


def _error(got, want):
    return max(float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want)


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_training_and_evaluation_under_graphsync_run_equal_one_device(runs, version):
    stderr, synced = runs[f"{version} graphsync run"]
    _, one = runs[f"{version} one device"]
    _, plain = runs[f"{version} python"]
    assert _error(synced, one) < SYNCED
    assert _error(plain, one) > UNSYNCED
    lines = [line for line in stderr.splitlines() if line.startswith("graphsync:")]
    assert lines == ["graphsync: 2 layers × 2 towers synchronized on /device:CPU:0 (conditional; gradients rewritten)"]
