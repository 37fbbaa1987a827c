"""An unchanged parameter-server job as users write it — tests/scripts/ps_monitored.py: 1 ps that
only joins its server, 3 workers with uneven shards (3, 5, 2 examples) building their graphs under
replica_device_setter and training in a MonitoredTrainingSession whose chief checkpoints every step
— on 127.0.0.1 under `graphsync run --heartbeat 3` (graphsync/exchange/through_ps.py) and under
plain python, against one device on the concatenated batch (ps_monitored.reference).

Measured (TF 2.21, 2 cores shared with other jobs; relative errors, the largest over the workers):

    synchronized, 4 steps    every worker's batch statistics at every step within 1.5e-6 of one
                             device, its losses within 2.9e-7, the trainable variables after the
                             last step within 2.9e-7 (tolerance 2e-5); plain python: batch
                             statistics 0.72–0.80 off (required > 1e-2), variables 0.21
    moving statistics        shared on the ps, updated by worker 0 alone
                             (graphsync/splice/shared_averages.py): within 2e-5 of one device too
                             (every worker updating them moved them 3 times a step: 0.47 off)
    a worker frozen          worker 2 stops itself (SIGSTOP) after step 2: workers 0 and 1 end
                             with status 1, their last line `graphsync: error: lost worker
                             worker:2 (…) during synchronized step 3: its server did not answer
                             for 3 s: …`, 5.6–5.8 s after the freeze (required < 30 s)
    every task restarted     ps included, fresh ports: the chief restores the checkpoint of step 2
                             (global step 6), every worker resumes at step 3, and after step 4 its
                             variables are within 2.6e-7 of one device's 4 steps, its batch
                             statistics of steps 3–4 within 1.2e-6 (tolerance 2e-5; the
                             uninterrupted run is within 2.9e-7)

Found on the way (test_a_monitored_sessions_runs_are_told_apart): MonitoredSession keys its fetches
by its hook objects, so graphsync.between_graph.steps took every run of a MonitoredTrainingSession
(a read of the global step too) for a synchronized step, and the lost worker's line named step 4
for the third.

A worker killed mid-training is tests/test_ps_modes.py's (the same heartbeat, the same line). Each
job takes 25–45 s here (four TensorFlow processes starting on 2 cores; --worker-wait 1 spares the
non-chief workers MonitoredTrainingSession's 30 s between readiness checks): the two job tests
take 62–81 s and 78–94 s (3 runs).
"""
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import behaviours
import cluster as cl
import towerlib as tl

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
SCRIPT = os.path.join(SCRIPTS, "ps_monitored.py")
sys.path.insert(0, SCRIPTS)
import ps_monitored  # noqa: E402

pytestmark = pytest.mark.full   # restarts from checkpoints: tests/test_lost_worker.py's fast case

SIZES, STEPS, FREEZE_AFTER = [3, 5, 2], 4, 2
HEARTBEAT = 3
SYNCED = [sys.executable, "-m", "graphsync", "run", "--heartbeat", str(HEARTBEAT)]
PLAIN = [sys.executable]
TOLERANCE = 2e-5


@functools.lru_cache(maxsize=None)
def reference(sizes=tuple(SIZES)):
    with behaviours.behaviour("v1"):   # as the script builds its graphs
        return ps_monitored.reference(list(sizes), STEPS)


class Task:
    """One task's process; its stdout and stderr lines with the time each arrived."""

    def __init__(self, runner, spec, job, index, out, checkpoints, args=(), sizes=SIZES):
        env = dict(cl.env_for_children(), TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
                   TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": job, "index": index}}))
        env["PYTHONPATH"] = os.pathsep.join([SCRIPTS, env["PYTHONPATH"]])   # the script imports ps_train
        self.job, self.index, self.out = job, index, out
        self.proc = subprocess.Popen(runner + [SCRIPT, str(out), str(checkpoints), "--sizes", ",".join(map(str, sizes)),
                                               "--steps", str(STEPS), "--worker-wait", "1"] + list(args),
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines, self.stderr_lines, self.ended = [], [], None
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr_lines), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines):
        for line in stream:
            lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def stderr(self):
        return "\n".join(line for _, line in self.stderr_lines)

    def when(self, line, timeout=240):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, seen in list(self.lines):
                if seen == line:
                    return at
            if self.proc.poll() is not None and not self._readers[0].is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.job} {self.index} never printed {line!r}:\n{self.stderr[-3000:]}")

    def wait(self, timeout=240):
        self.proc.wait(timeout=timeout)
        self.ended = time.monotonic()
        for reader in self._readers:
            reader.join(timeout=30)
        return self.proc.returncode

    def stop(self):
        """Killed if still there; a frozen (SIGSTOPped) process is continued too, once dead."""
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


def start_job(tmp, runner, checkpoints, per_worker=None, ps=1, sizes=SIZES):
    """`ps` ps tasks + one worker per shard of `sizes` running ps_monitored.py: [Task], ps first."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = cl.cluster_spec({"ps": ps, "worker": len(sizes)})
    return [Task(runner, spec, job, index, tmp / f"{job}{index}.npz", checkpoints, (per_worker or {}).get(index, ()),
                 sizes) for job, index in [("ps", i) for i in range(ps)] + [("worker", i) for i in range(len(sizes))]]


def run_job(tmp, runner, checkpoints, ps=1, sizes=SIZES):
    """A whole job, every worker to the end (the ps tasks, which never exit, killed after): the workers."""
    began = time.monotonic()
    tasks = start_job(tmp, runner, checkpoints, ps=ps, sizes=sizes)
    try:
        for task in tasks[ps:]:
            assert task.wait() == 0, f"worker {task.index}:\n{task.stderr[-3000:]}"
    finally:
        for task in tasks:
            task.stop()
    print(f"{' '.join(runner[1:]) or 'plain python'}: the job took {time.monotonic() - began:.1f} s")
    return tasks[ps:]


def errors(workers, first_step=0, sizes=SIZES):
    """Per worker: the largest relative error of its steps from `first_step` on, against one device."""
    ref, found = reference(tuple(sizes)), []
    for worker in workers:
        got = dict(np.load(worker.out))
        begun, ended = got["global_steps"]   # a worker that starts late may see others' first increments
        assert begun // len(sizes) == first_step and ended == STEPS * len(sizes), got["global_steps"]
        found.append({"stats": tl.max_rel_error(got["stats"], ref["stats"][first_step:]),
                      "loss": tl.max_rel_error(got["loss"], ref["loss"][first_step:, worker.index]),
                      "variables": tl.max_rel_error(got["variables"], ref["variables"]),
                      "moving": tl.max_rel_error(got["moving"], ref["moving"])})
    return found


def worst(found, keys=("stats", "loss", "variables", "moving")):
    return max(e[k] for e in found for k in keys)


def test_a_monitored_training_session_job_equals_one_device(tmp_path):
    synced = run_job(tmp_path / "synced", SYNCED, tmp_path / "synced" / "checkpoints")
    for worker in synced:
        assert ("graphsync: 2 layers × 1 tower synchronized through queues on /job:ps/replica:0/task:0 across 3 "
                "worker processes") in worker.stderr, worker.stderr[-3000:]
        assert "Traceback" not in worker.stderr and "Aborted" not in worker.stderr, worker.stderr[-3000:]
    found = errors(synced)
    print(f"graphsync run, 1 ps + 3 workers {SIZES}, {STEPS} steps:", found)
    assert worst(found) < TOLERANCE, found
    plain = errors(run_job(tmp_path / "plain", PLAIN, tmp_path / "plain" / "checkpoints"))
    print("plain python:", plain)
    assert min(e["stats"] for e in plain) > 1e-2, plain


def test_a_two_ps_four_worker_job_equals_one_device(tmp_path):
    """2 ps tasks (replica_device_setter spreads the variables, graphsync the layers' queues by size)
    and 4 workers of uneven shards: every worker within tolerance of one device; plain python is not."""
    sizes = (3, 5, 2, 4)
    synced = run_job(tmp_path / "synced", SYNCED, tmp_path / "synced" / "checkpoints", ps=2, sizes=sizes)
    for worker in synced:
        assert re.search(r"graphsync: 2 layers × 1 tower synchronized through queues on /job:ps/replica:0/task:0, "
                         r"/job:ps/replica:0/task:1 across 4 worker processes", worker.stderr), worker.stderr[-3000:]
        assert "Traceback" not in worker.stderr and "Aborted" not in worker.stderr, worker.stderr[-3000:]
    found = errors(synced, sizes=sizes)
    print(f"graphsync run, 2 ps + 4 workers {sizes}, {STEPS} steps:", found)
    assert worst(found) < TOLERANCE, found
    plain = errors(run_job(tmp_path / "plain", PLAIN, tmp_path / "plain" / "checkpoints", ps=2, sizes=sizes),
                   sizes=sizes)
    print("plain python:", plain)
    assert min(e["stats"] for e in plain) > 1e-2, plain


def test_a_frozen_worker_stops_the_others_and_every_task_resumes_from_the_checkpoints(tmp_path):
    """Worker 2 freezes itself after step FREEZE_AFTER; then every task, ps included, restarts
    from the chief's checkpoints and trains to the end, as if nothing happened."""
    checkpoints = tmp_path / "checkpoints"
    tasks = start_job(tmp_path / "frozen", SYNCED, checkpoints, {2: ["--freeze-after", str(FREEZE_AFTER)]})
    try:
        frozen = tasks[3].when(f"step {FREEZE_AFTER} done")
        for survivor in tasks[1:3]:
            code = survivor.wait(timeout=120)
            last = survivor.stderr.strip().splitlines()[-1]
            took = survivor.ended - frozen
            print(f"worker {survivor.index} ended {code} {took:.1f} s after worker 2 froze: {last!r}")
            assert code == 1, survivor.stderr[-3000:]
            assert last.startswith("graphsync: error: lost worker worker:2 (/job:worker/replica:0/task:2, "), last
            assert f"synchronized step {FREEZE_AFTER + 1}:" in last, last
            assert last.endswith("restart every worker to resume from its last checkpoint"), last
            assert took < 30, took
        assert tasks[3].proc.poll() is None   # still frozen
    finally:
        for task in tasks:
            task.stop()
    saved = tf.train.latest_checkpoint(str(checkpoints))
    assert saved is not None and saved.endswith(f"-{FREEZE_AFTER * len(SIZES)}"), saved

    resumed = run_job(tmp_path / "resumed", SYNCED, checkpoints)
    for worker in resumed:
        assert worker.lines[0][1] == f"step {FREEZE_AFTER + 1} done", worker.lines   # resumed, not restarted
    found = errors(resumed, first_step=FREEZE_AFTER)
    print(f"restarted from the checkpoint of step {FREEZE_AFTER}, to step {STEPS}, against one device:", found)
    assert worst(found) < TOLERANCE, found


def test_a_monitored_sessions_runs_are_told_apart():
    """MonitoredSession fetches {"caller": the script's fetches, hook: the hook's, …}, keys that do
    not sort: graphsync.between_graph.steps once took every such run for a synchronized step (the
    lost worker's line then named step 4 for the third). A read of the global step is none."""
    from graphsync.between_graph.steps import Steps
    tf1 = tf.compat.v1

    class Hook:
        pass

    class Session:
        def __init__(self, graph):
            self.graph = graph

    with behaviours.behaviour("v1"):
        graph = tf.Graph()
        here = "/job:worker/replica:0/task:1/device:CPU:0"
        with graph.as_default(), tf1.device(tf1.train.replica_device_setter(worker_device=here, ps_tasks=1)):
            global_step = tf1.train.get_or_create_global_step()
            x = tf1.placeholder(tf.float32, [None, 6, 6, 3])
            h = tf1.layers.batch_normalization(tf1.layers.conv2d(x, 4, 3), training=True)
            train = tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(h), global_step=global_step)
            import graphsync
            report = graphsync.rewrite_towers(graph, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 1))
        assert report.strategy == "ps", report
        steps, session = Steps(), Session(graph)
        steps.graphs.add(graph)
        assert steps.is_step(session, {"caller": {"train": train}, Hook(): global_step})
        assert not steps.is_step(session, {"caller": global_step, Hook(): [global_step], Hook(): global_step.op})
