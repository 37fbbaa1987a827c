"""tf_cnn_benchmarks' distributed modes, reproduced by tests/scripts/ps_train.py (TF1 behaviour,
tf.train.Supervisor, replica_device_setter, sync queues, the global step) in 3 processes on
loopback — 1 ps that only joins its server, 2 workers — each launched the same way, under
`graphsync run` and under plain python; plus the refusal itself in-process.

collective_all_reduce (every op of the step on its worker) trains synchronized: each worker's
batch-norm batch statistics at every step, its losses and its variables after the last step equal
one device on the concatenated batch (2e-5 relative; measured ~1.5e-7), where plain python is off
by more than 1e-2. parameter_server and distributed_replicated (the step runs ops on the ps) are
refused on every worker in one line before the first step: see graphsync/plan/shared_tasks.py for why
they cannot be synchronized (TensorFlow aborted them mid-run with `AbortedError … Cleanup`).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import behaviours
import cluster as cl
import graphsync
import towerlib as tl

tf1 = tf.compat.v1
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
SCRIPT = os.path.join(SCRIPTS, "ps_train.py")
sys.path.insert(0, SCRIPTS)
import ps_train  # noqa: E402

GRAPHSYNC_RUN = [sys.executable, "-m", "graphsync", "run"]
SIZES, STEPS = [3, 5], 3
TOLERANCE = 2e-5


def run_job(tmp_path, mode, runner, timeout=240):
    """1 ps + 2 workers of ps_train.py --mode MODE; per worker (return code, stdout, stderr, saved
    arrays or None). The ps (which never exits, as in tf_cnn_benchmarks) is killed afterwards."""
    spec = cl.cluster_spec({"ps": 1, "worker": 2})
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = dict(cl.env_for_children(), TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    args = ["--mode", mode, "--sizes", ",".join(map(str, SIZES)), "--steps", str(STEPS)]
    procs = []
    try:
        for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
            config = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
            out = tmp_path / f"{job}{index}.npz"
            procs.append((subprocess.Popen(runner + [SCRIPT, str(out)] + args, env=dict(env, TF_CONFIG=config),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out))
        results = []
        for proc, out in procs[1:]:
            stdout, stderr = proc.communicate(timeout=timeout)
            results.append((proc.returncode, stdout, stderr, dict(np.load(out)) if out.exists() else None))
        return results
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def errors_against_one_device(results):
    with behaviours.behaviour("v1"):   # as the script builds its graphs
        ref = ps_train.reference(SIZES, STEPS)
    errors = []
    for i, (code, _, err, got) in enumerate(results):
        assert code == 0, f"worker {i}:\n{err[-3000:]}"
        errors.append({"stats": tl.max_rel_error(got["stats"], ref["stats"]),
                       "loss": tl.max_rel_error(got["loss"], ref["loss"][:, i]),
                       "variables": tl.max_rel_error(got["variables"], ref["variables"])})
    return errors


def test_collective_all_reduce_workers_equal_one_device(tmp_path):
    results = run_job(tmp_path / "synced", "collective_all_reduce", GRAPHSYNC_RUN)
    for i, (_, _, err, _) in enumerate(results):
        assert "graphsync: 2 layers × 1 tower synchronized by all-reduce on the towers' devices across 2 worker " \
               "processes" in err, err
    errors = errors_against_one_device(results)
    print("collective_all_reduce, 2 workers [3, 5], 3 steps, synchronized:", errors)
    assert max(max(e.values()) for e in errors) < TOLERANCE, errors
    unsynced = errors_against_one_device(run_job(tmp_path / "plain", "collective_all_reduce", [sys.executable]))
    print("collective_all_reduce, plain python:", unsynced)
    assert min(e["stats"] for e in unsynced) > 1e-2, unsynced


@pytest.mark.parametrize("mode", ["parameter_server", "distributed_replicated"])
def test_parameter_server_modes_are_refused_before_the_first_step(tmp_path, mode):
    for code, stdout, err, saved in run_job(tmp_path, mode, GRAPHSYNC_RUN):
        lines = [line for line in err.splitlines() if line.startswith("graphsync: ")]
        assert code == 1 and len(lines) == 1, err
        assert lines[0].startswith("graphsync: error: parameter-server training cannot be synchronized: ") \
               and "/job:ps/replica:0/task:0" in lines[0], lines
        assert "Traceback" not in err and "internal error" not in err and "trained" not in stdout and saved is None


def test_a_step_on_its_own_worker_is_rewritten():
    graph = _ps_graph(on_the_worker=True)
    report = graphsync.rewrite_towers(graph, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 1))
    assert len(report.layers) == 1


def _ps_graph(global_step_only=False, on_the_worker=False):
    """One worker's graph of a ps job: task 1 of 2, a conv and a batch norm; the variables (or only
    the global step, incremented after every step) on the ps."""
    graph = tf.Graph()
    here = "/job:worker/replica:0/task:1/device:CPU:0"
    setter = here if on_the_worker else tf1.train.replica_device_setter(worker_device=here, ps_tasks=1)
    with graph.as_default():
        with tf1.device(setter):
            global_step = tf1.train.get_or_create_global_step()
        with tf1.device(here if global_step_only else setter):
            x = tf1.placeholder(tf.float32, [None, 6, 6, 3])
            h = tf1.layers.batch_normalization(tf1.layers.conv2d(x, 4, 3), training=True)
            train = tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(h))
        with tf1.device(setter), tf.control_dependencies([train]):
            global_step.assign_add(1)
    return graph


@pytest.mark.parametrize("behaviour", ["v1", "v2"])
@pytest.mark.parametrize("global_step_only", [False, True], ids=["variables-on-ps", "global-step-on-ps"])
def test_rewrite_refuses_a_step_on_a_shared_task_and_leaves_the_graph_alone(behaviour, global_step_only):
    with behaviours.behaviour(behaviour):
        graph = _ps_graph(global_step_only)
        before = graph.as_graph_def()
        with pytest.raises(graphsync.GraphsyncError, match=r"parameter-server training cannot be synchronized: "
                                                           r"the step of /job:worker/replica:0/task:1 runs .* on "
                                                           r"/job:ps/replica:0/task:0"):
            graphsync.rewrite_towers(graph, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 1))
        assert graph.as_graph_def() == before
