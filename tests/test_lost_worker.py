"""A lost between-graph worker under `graphsync run` (graphsync.between_graph.heartbeat, graphsync.between_graph.steps):
tests/scripts/between_graph_steps.py trains a few steps in 3 workers on 127.0.0.1 with a checkpoint
after each. One worker exits, or is frozen with SIGSTOP, after step k: every survivor stops with
status 1 within a few heartbeat intervals, its last stderr line naming the lost task; then all
workers restart from their checkpoints and end with every variable equal to a run never
interrupted. A worker that pauses between two steps for several intervals, its server up, is
waited for and changes nothing. A worker restarted alone into the running group never joins it.

The "library" cases run the same script under plain python, calling rewrite_towers itself with
ProcessGroup(3, index, heartbeat=3) (graphsync.between_graph.watched_steps): the same faults, the same lines."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import cluster as cl
from test_between_graph import GRAPHSYNC_RUN, tf_config
import tiers

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "between_graph_steps.py")
HEARTBEAT = 3.0
STEPS = 4
FAULT_AFTER = 2
RUN = GRAPHSYNC_RUN + ["--heartbeat", f"{HEARTBEAT:g}", "--peer-timeout", "120"]
LIBRARY = ["--library", f"{HEARTBEAT:g}"]   # between_graph_steps.py calls rewrite_towers itself
PATHS = {"graphsync run": (RUN, []),   # runner, arguments every worker's script gets
         "library": ([sys.executable], LIBRARY),
         "library, cluster=server": ([sys.executable], LIBRARY + ["--cluster-from", "server"])}


class Worker:
    """One worker process; its stdout lines with the time each arrived."""

    def __init__(self, spec, index, out, checkpoints, args=(), runner=RUN):
        env = dict(cl.env_for_children(), TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
                   TF_CONFIG=tf_config(spec, index))
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(SCRIPT), env["PYTHONPATH"]])
        self.index, self.out, self.began = index, out, time.monotonic()
        self.proc = subprocess.Popen(runner + [SCRIPT, str(out), str(checkpoints), "--steps", str(STEPS)] + list(args),
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines, self.stderr_lines, self.ended = [], [], None
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.strip()))

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def stderr(self):
        return "\n".join(line for _, line in self.stderr_lines)

    def said(self, start):
        """When the first line starting with `start` reached stderr (None: never)."""
        return next((at for at, line in self.stderr_lines if line.startswith(start)), None)

    def when(self, line, timeout=180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, seen in list(self.lines):
                if seen == line:
                    return at
            if self.proc.poll() is not None and not self._readers[0].is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"worker {self.index} never printed {line!r}:\n{self.stderr[-3000:]}")

    def wait(self, timeout=180):
        self.proc.wait(timeout=timeout)
        self.ended = time.monotonic()
        for reader in self._readers:
            reader.join(timeout=30)
        return self.proc.returncode

    def variables(self):
        return dict(np.load(self.out))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def run_group(spec, tmp, checkpoints, per_worker=None, fault=None, path="graphsync run"):
    """All workers of `spec`, along `path` (PATHS); `fault(workers)` runs while they train. Returns
    the workers, ended."""
    tmp.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    runner, common = PATHS[path]
    workers = [Worker(spec, i, tmp / f"worker{i}.npz", checkpoints, common + list((per_worker or {}).get(i, ())),
                      runner=runner) for i in range(len(spec["worker"]))]
    try:
        if fault is not None:
            fault(workers)
        for worker in workers:
            if worker.proc.poll() is None or worker.ended is None:
                worker.wait()
    finally:
        for worker in workers:
            worker.kill()
    print(f"group of {len(workers)} ran {time.monotonic() - began:.1f} s")
    return workers


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    workers = run_group(cl.cluster_spec({"worker": 3}), tmp, tmp / "checkpoints")
    for worker in workers:
        assert worker.proc.returncode == 0, worker.stderr[-3000:]
    return [worker.variables() for worker in workers]


def max_difference(got, want):
    assert sorted(got) == sorted(want)
    return max(float(np.max(np.abs(got[name] - want[name]))) for name in want)


def assert_survivors_name(workers, lost, started_fault, fault_name):
    lost_task = f"worker:{lost}"
    for worker in workers:
        if worker.index == lost:
            continue
        assert worker.stderr.strip(), f"worker {worker.index} said nothing, exit {worker.proc.returncode}"
        last = worker.stderr.strip().splitlines()[-1]
        seconds = worker.ended - started_fault
        said = worker.said("graphsync: error: lost worker")
        assert said is not None, f"worker {worker.index}, exit {worker.proc.returncode}:\n{worker.stderr[-3000:]}"
        named = said - started_fault
        print(f"{fault_name}: worker {worker.index} named the lost worker {named:.1f} s and exited "
              f"{worker.proc.returncode} {seconds:.1f} s after the fault: {last!r}")
        assert worker.proc.returncode == 1, worker.stderr[-3000:]
        assert last.startswith(f"graphsync: error: lost worker {lost_task} (/job:worker/replica:0/task:{lost}, "), last
        assert f"during synchronized step {FAULT_AFTER + 1}" in last or "before synchronized step" in last, last
        assert last.endswith("restart every worker to resume from its last checkpoint"), last
        assert seconds < 3 * HEARTBEAT + 15, seconds


def run_faulty_group(fault_name, tmp, checkpoints, path="graphsync run"):
    """3 workers; worker 2 exits, or freezes with SIGSTOP (sent to itself: one sent from here could
    come after its next step began), after step FAULT_AFTER. Returns the workers, ended, and when
    the fault happened."""
    started = {}

    def fault(workers):
        started["at"] = workers[2].when(f"step {FAULT_AFTER} done")
        if fault_name == "sigstop":   # frozen until the survivors are gone
            for worker in workers[:2]:
                worker.wait()
            workers[2].kill()
            workers[2].ended = time.monotonic()

    per_worker = {2: [{"exit": "--exit-after", "sigstop": "--freeze-after"}[fault_name], str(FAULT_AFTER)]}
    workers = run_group(cl.cluster_spec({"worker": 3}), tmp, checkpoints, per_worker, fault, path)
    return workers, started["at"]


@pytest.mark.parametrize("fault_name", ["exit", "sigstop"])
@tiers.full
def test_a_lost_worker_stops_every_survivor_and_all_resume_exactly(tmp_path, uninterrupted, fault_name):
    checkpoints = tmp_path / "checkpoints"
    faulty, started = run_faulty_group(fault_name, tmp_path / "faulty", checkpoints)
    assert_survivors_name(faulty, 2, started, fault_name)

    resumed = run_group(cl.cluster_spec({"worker": 3}), tmp_path / "resumed", checkpoints)
    errors = []
    for worker, want in zip(resumed, uninterrupted):
        assert worker.proc.returncode == 0, worker.stderr[-3000:]
        assert [line for _, line in worker.lines][0] == f"step {FAULT_AFTER + 1} done"   # resumed, not restarted
        errors.append(max_difference(worker.variables(), want))
    print(f"{fault_name}: resumed run vs uninterrupted, max |Δ| over every variable of each worker: {errors}")
    assert max(errors) == 0.0, errors


@pytest.mark.parametrize("fault_name,path", [("exit", "library"),
                                                pytest.param("sigstop", "library, cluster=server", marks=tiers.full)])
def test_rewrite_towers_with_a_heartbeat_stops_every_survivor_of_a_lost_worker(tmp_path, fault_name, path):
    """The library path: a script of one's own, ProcessGroup(3, i, heartbeat=3), the workers'
    addresses from TF_CONFIG or from the script's server; the same stop and the same line."""
    faulty, started = run_faulty_group(fault_name, tmp_path, tmp_path / "checkpoints", path)
    assert_survivors_name(faulty, 2, started, f"{path}, {fault_name}")


@pytest.mark.parametrize("path", ["graphsync run", "library"])
@tiers.full
def test_a_worker_pausing_for_several_intervals_is_waited_for(tmp_path, uninterrupted, path):
    """Worker 1 sleeps 4 heartbeat intervals between steps 2 and 3, its server up: the others wait
    in step 3's collectives, and the run ends as if nothing happened (the library path's too: it
    equals graphsync run's undisturbed run to the bit)."""
    pause = 4 * HEARTBEAT
    workers = run_group(cl.cluster_spec({"worker": 3}), tmp_path, tmp_path / "checkpoints",
                        {1: ["--pause-after", str(FAULT_AFTER), "--pause", str(pause)]}, path=path)
    for worker, want in zip(workers, uninterrupted):
        assert worker.proc.returncode == 0, worker.stderr[-3000:]
        assert "lost worker" not in worker.stderr
        assert max_difference(worker.variables(), want) == 0.0
    waited = workers[0].when(f"step {FAULT_AFTER + 1} done") - workers[0].when(f"step {FAULT_AFTER} done")
    print(f"{path}: straggler paused {pause:g} s (heartbeat {HEARTBEAT:g} s): worker 0's step {FAULT_AFTER + 1} took "
          f"{waited:.1f} s; every variable equal to the undisturbed run")
    assert waited >= pause - 1


@pytest.mark.parametrize("path,paused", [("graphsync run", 45), ("library", 20)])
@tiers.full
def test_a_worker_restarted_alone_into_a_running_group_never_joins_it(tmp_path, path, paused):
    """Worker 2 exits after step 2 and is restarted at once, from its checkpoint, while workers 0
    and 1 pause before step 3: they refuse step 3 (worker 2 was lost), and the newcomer is refused
    at its first meeting by the group leader, which knows its earlier server: one line, at once."""
    spec = cl.cluster_spec({"worker": 3})
    checkpoints = tmp_path / "checkpoints"
    runner, common = PATHS[path]
    pause = ["--pause-after", str(FAULT_AFTER), "--pause", str(paused)]
    workers = [Worker(spec, i, tmp_path / f"worker{i}.npz", checkpoints, common + args, runner)
               for i, args in enumerate([pause, pause, ["--exit-after", str(FAULT_AFTER)]])]
    newcomer = None
    try:
        assert workers[2].wait() == 3
        newcomer = Worker(spec, 2, tmp_path / "newcomer.npz", checkpoints, common, runner)
        code = newcomer.wait()
        for worker in workers[:2]:
            assert worker.wait() == 1, worker.stderr[-3000:]
            last = worker.stderr.strip().splitlines()[-1]
            assert last.startswith("graphsync: error: lost worker worker:2 ") and \
                f"before synchronized step {FAULT_AFTER + 1}" in last, last
    finally:
        for worker in workers + [newcomer]:
            if worker is not None:
                worker.kill()
    last = newcomer.stderr.strip().splitlines()[-1]
    print(f"{path}: restarted alone: exit {code} {newcomer.ended - newcomer.began:.1f} s after it started: {last!r}")
    assert code == 1 and newcomer.lines == [] and not newcomer.out.exists()
    assert last == ("graphsync: error: worker:2 cannot join a group that is already running: the group leader "
                    "(/job:worker/replica:0/task:0) knows an earlier server of worker:2 (restarted alone?): restart "
                    "every worker to resume from its last checkpoint"), last


@tiers.full
def test_the_heartbeat_finds_a_frozen_server_within_its_interval_and_spares_a_live_one():
    """graphsync.between_graph.heartbeat.PeerWatch in this process against two real servers: one is frozen with
    SIGSTOP, and is lost within the interval (plus a poll); the other, idle, never is."""
    import json

    from graphsync.between_graph.cluster import ClusterTask
    from graphsync.between_graph.heartbeat import PeerWatch
    spec = cl.cluster_spec({"worker": 3})
    servers = [subprocess.Popen([sys.executable, "-c", cl.SERVER, json.dumps([spec, "worker", i, None])],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in (1, 2)]
    lost = []
    try:
        assert all("ready" in server.stdout.readline() for server in servers)
        watch = PeerWatch(ClusterTask(spec, "worker", 0), interval=2.0, on_lost=lost.append).start()
        time.sleep(3)
        assert watch.lost is None and lost == []
        servers[1].send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        while not lost and time.monotonic() - frozen < 10:
            time.sleep(0.05)
        found = time.monotonic() - frozen
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=30)
    print(f"heartbeat 2 s: frozen server lost after {found:.1f} s: {lost[0].line() if lost else None}")
    assert [(w.job, w.index) for w in lost] == [("worker", 2)] and 1.0 <= found < 4.0
    assert lost[0].reason.startswith("its server did not answer for ")


def test_a_step_failing_as_a_peer_exits_names_it_though_the_peer_answered_during_the_step(monkeypatch):
    """graphsync.between_graph.lost_worker.LostWorkerGuard with a fake server: the peer answers the
    heartbeat during the step, then exits, and the step fails on it. Only an answer to a question
    asked after the failure proves the peer alive: the guard waits, finds it lost and names it
    (it once took the answer from inside the step for one, let TensorFlow's error through, and a
    survivor ended without the lost worker's line: CI, under load)."""
    import tensorflow as tf

    from graphsync.between_graph.cluster import ClusterTask
    from graphsync.between_graph.lost_worker import LostWorkerGuard
    from graphsync.between_graph import health_probe
    alive = threading.Event()
    alive.set()
    monkeypatch.setattr(health_probe, "worker_incarnations",
                        lambda address, timeout, channels: [7] if alive.is_set() else None)
    guard = LostWorkerGuard(say=lambda line: None)
    guard.start_watch(ClusterTask(cl.cluster_spec({"worker": 2}), "worker", 0), interval=1.0)

    def step():
        time.sleep(0.6)             # the peer answers meanwhile (polls every 0.25 s)
        alive.clear()               # and exits: the step's collective fails
        raise tf.errors.UnavailableError(None, None, "peer gone")

    began = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError):
        guard.step(step, 3)
    guard.watch.stop()
    assert guard.lost is not None and guard.lost.during == "during synchronized step 3", guard.lost
    assert (guard.lost.job, guard.lost.index) == ("worker", 1) and time.monotonic() - began < 5
