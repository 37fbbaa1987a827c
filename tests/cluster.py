"""Real tf.distribute.Server processes on 127.0.0.1 for the distributed tests, always shut down."""
from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time

SERVER = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
cluster, job, task, leader = json.loads(sys.argv[1])
config = tf.compat.v1.ConfigProto()
if leader:
    config.experimental.collective_group_leader = leader
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=task, config=config)
print("ready", flush=True)
server.join()
"""


def free_ports(n: int) -> list[int]:
    """n ports free now, drawn at random below the kernel's ephemeral range.

    A port bound to 0 and released is an ephemeral one: until the server binds it, seconds later
    (TensorFlow's import), any outgoing connection may take it, such as the gRPC clients of a test
    run beside this one (.ci/run's two passes). The server then fails to start and its peers wait
    for it forever. Below the ephemeral range only another listener can take a port, and two runs
    drawing at random from 8,000 ports rarely meet."""
    low = _ephemeral_low()
    if low < 10_000:   # no room below it: ephemeral ports it is
        return _ephemeral_ports(n)
    draw, ports = random.Random(os.getpid() ^ time.time_ns()), []
    while len(ports) < n:
        port = draw.randrange(low - 8_000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768   # Linux's default; other systems' ranges start higher


def _ephemeral_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_spec(jobs: dict[str, int]) -> dict:
    ports = iter(free_ports(sum(jobs.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in jobs.items()}


@contextlib.contextmanager
def servers(cluster: dict, leader: str | None = None, timeout: float = 60.0, jobs=None):
    """Starts one server process per task of `cluster` (of its `jobs`, all by default); yields
    when they listen; kills them after."""
    procs = []
    try:
        for job, addresses in cluster.items():
            if jobs is not None and job not in jobs:
                continue
            for task in range(len(addresses)):
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", SERVER, json.dumps([cluster, job, task, leader])],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        deadline = time.time() + timeout
        for proc in procs:
            line = proc.stdout.readline()
            if "ready" not in line or time.time() > deadline:
                raise RuntimeError("a tf.distribute.Server did not start")
        for address in (a for job, addresses in cluster.items() if jobs is None or job in jobs for a in addresses):
            _wait_listening(address, deadline)
        yield cluster
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


def _wait_listening(address: str, deadline: float):
    host, port = address.rsplit(":", 1)
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def env_for_children() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(__file__)), os.path.dirname(__file__),
                                         env.get("PYTHONPATH", "")])
    return env


def between_graph_step(cluster: dict, batch_sizes: list, out_dir, saved: list | None = None,
                       timeout: float = 240, options: dict | None = None) -> list:
    """Runs tests/between_graph_worker.py once per worker of `cluster` (one training step each, see
    there; `options`: its model, the same for every worker); returns each worker's saved arrays.
    The workers are always stopped."""
    import numpy as np
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "between_graph_worker.py")
    os.makedirs(out_dir, exist_ok=True)
    procs, outs = [], [os.path.join(str(out_dir), f"worker{i}.npz") for i in range(len(cluster["worker"]))]
    try:
        for i, out in enumerate(outs):
            payload = [cluster, i, batch_sizes, out] + ([saved[i]] if saved else [options] if options else [])
            procs.append(subprocess.Popen([sys.executable, worker, json.dumps(payload)], env=env_for_children(),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"a between-graph worker failed:\n{err[-3000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return [dict(np.load(out)) for out in outs]
