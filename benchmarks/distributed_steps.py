"""Training-step time of a small ResNet-style model on TensorFlow's distributed runtimes: graphsync's
"gather" and "allreduce" strategies against the unsynchronized graph.

  (a) 4 towers on 4 logical CPU devices of one process (ConfigProto(device_count={'CPU': 4}))
  (b) in-graph replication across 2 tf.distribute.Server processes on 127.0.0.1: tower 0 on
      /job:worker/task:0, tower 1 on /job:worker/task:1; gather on /job:worker/task:0/cpu:0
  (c) between-graph replication: 2 worker processes, each with its own server and one one-tower graph,
      rewritten with strategy="allreduce", process_group=ProcessGroup(2, i); and with
      ProcessGroup(2, i, timeout=300), the graph `graphsync run` builds on such a worker; and, with
      a ps task in the cluster (a server process that only joins), a graph whose step reads a batch
      norm's output on the ps, which graphsync then synchronizes through queues on the ps
      (graphsync/exchange/through_ps.py) instead of collectives: "ps queues"

Graphs are built with tests/towerlib.py `build` (the CIFAR10 pattern: per-tower gradients, summed,
tower 0's updates) around tests/models.py `resnetish`, and rewritten after the gradients exist ((a) also
times both strategies rewritten before the gradients, then one tf.gradients per tower). In (a)
and (b) all variants live in one client process and are timed in alternating rounds; ratios are taken
within a round, then the median. In (c) each worker alternates an unsynchronized and a synchronized
graph of its own; one untimed synchronized step per round lines the two workers up.

    python benchmarks/distributed_steps.py [--rounds 21] [--steps 5] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _common

sys.path.insert(0, os.path.join(_common.REPO, "tests"))
TF = _common.import_tf()

import numpy as np  # noqa: E402

import cluster as cl  # noqa: E402
import graphsync  # noqa: E402
import models  # noqa: E402
import towerlib as tl  # noqa: E402

tf1 = TF.compat.v1
LEADER = "/job:worker/replica:0/task:0"
VARIANTS = ("unsynced", "gather", "allreduce")


def model_fn(args):
    return models.resnetish(depth=args.depth, channels=args.channels)


def shape(args):
    return (args.size, args.size, 3)


PS = "/job:ps/replica:0/task:0/device:CPU:0"


def build(args, batch_sizes, devices, strategy, *, device=None, process_group=None, scope="tower_%d",
          gradients="after", touch_ps=False):
    """touch_ps: an Identity on the ps reads the first batch norm's mean (never fetched): the step
    uses a ps, and graphsync synchronizes it through queues there."""
    reports = []

    def rewrite(graph):
        if touch_ps:
            first = next(op for op in graph.get_operations() if op.type.startswith("FusedBatchNorm"))
            with graph.as_default(), graph.device(PS):
                TF.identity(first.outputs[1], name="read_on_the_ps")
        reports.append(graphsync.rewrite_towers(graph, strategy=strategy, device=device,
                                                process_group=process_group))
    built = tl.build(model_fn(args), batch_sizes, devices=devices, scope=scope, input_shape=shape(args),
                     rewrite=rewrite if strategy else None, gradients=gradients)
    return built, (reports[0] if reports else None)


def feed_for(built, x, t, batch_sizes):
    splits = np.cumsum(batch_sizes)[:-1]
    feed = dict(zip(built.inputs, np.split(x, splits)))
    feed.update(zip(built.targets, np.split(t, splits)))
    return feed


def time_steps(sess, built, feed, steps):
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        sess.run(built.train_op, feed)
        times.append(time.perf_counter() - start)
    return times


def alternate(args, variants, target, config, cpu=False):
    """variants: name -> (built, report); every variant in its own session, timed in alternating rounds.
    cpu: also this process's CPU time per step (all devices in-process: the work a step costs,
    less disturbed than wall-clock time by other jobs on a shared machine)."""
    sizes = None
    sessions, feeds, ops = {}, {}, {}
    try:
        for name, (built, _) in variants.items():
            sizes = [args.batch] * len(built.inputs)
            x, t = tl.data(sizes, shape(args), (5,))
            sess = tf1.Session(target, graph=built.graph, config=config)
            with built.graph.as_default():
                sess.run(tf1.global_variables_initializer())
            sessions[name], feeds[name] = sess, feed_for(built, x, t, sizes)
            ops[name] = len(built.graph.get_operations())
            time_steps(sess, built, feeds[name], args.warmup)
        per_round = {name: [] for name in variants}
        cpu_round = {name: [] for name in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                start = time.process_time()
                per_round[name].append(_common.median(time_steps(sessions[name], variants[name][0],
                                                                 feeds[name], args.steps)))
                cpu_round[name].append((time.process_time() - start) / args.steps)
    finally:
        for sess in sessions.values():
            sess.close()
    return summarize(per_round, ops, {n: v[1] for n, v in variants.items()}, cpu_round if cpu else None)


def summarize(per_round, ops, reports, cpu_round=None):
    """Per variant: step times, the median of its per-round ratios to the unsynchronized graph and,
    for all-reduce variants, to the gather variant of the same rewrite order (likewise for CPU
    time per step when measured)."""
    out = {}
    for name, times in per_round.items():
        ratios = [a / b for a, b in zip(times, per_round["unsynced"])]
        out[name] = {"step_ms": 1e3 * _common.median(times), "min_ms": 1e3 * min(times),
                     "max_ms": 1e3 * max(times), "ratio": _common.median(ratios),
                     "ratio_min": min(ratios), "ratio_max": max(ratios), "ops": ops.get(name, ""),
                     "layers": len(reports[name].layers) if reports.get(name) else ""}
        gather = per_round.get(name.replace("allreduce", "gather"))
        if name.startswith("allreduce") and gather:
            vs_gather = [a / b for a, b in zip(times, gather)]
            out[name].update(vs_gather=_common.median(vs_gather), vs_gather_min=min(vs_gather),
                             vs_gather_max=max(vs_gather))
        if cpu_round:
            cpu = cpu_round[name]
            out[name].update(cpu_ms=1e3 * _common.median(cpu),
                             cpu_ratio=_common.median([a / b for a, b in zip(cpu, cpu_round["unsynced"])]))
            if name.startswith("allreduce") and gather:
                base = cpu_round[name.replace("allreduce", "gather")]
                out[name]["cpu_vs_gather"] = _common.median([a / b for a, b in zip(cpu, base)])
    return out


def setup_local(args):
    """(a), plus both strategies rewritten before the gradients, then one tf.gradients per tower."""
    devices = [f"/cpu:{i}" for i in range(4)]
    variants = {v: build(args, [args.batch] * 4, devices, None if v == "unsynced" else v) for v in VARIANTS}
    for v in VARIANTS[1:]:
        variants[f"{v}, before gradients"] = build(args, [args.batch] * 4, devices, v, gradients="before")
    return alternate(args, variants, "", tl.CONFIG, cpu=True)


def setup_in_graph(args):
    spec = cl.cluster_spec({"worker": 2})
    devices = ["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"]
    variants = {}
    for v in VARIANTS:
        variants[v] = build(args, [args.batch] * 2, devices, None if v == "unsynced" else v,
                            device="/job:worker/task:0/cpu:0" if v == "gather" else None)
    config = tf1.ConfigProto()
    config.experimental.collective_group_leader = LEADER
    with cl.servers(spec, leader=LEADER):
        return alternate(args, variants, "grpc://" + spec["worker"][0], config)


def worker_main(payload):
    """One process of setup (c): its own server, an unsynced and a synchronized one-tower graph."""
    cluster, task, a = json.loads(payload)
    args = argparse.Namespace(**a)
    config = tf1.ConfigProto()
    config.experimental.collective_group_leader = LEADER
    server = TF.distribute.Server(TF.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=config)
    device = [f"/job:worker/replica:0/task:{task}/device:CPU:0"]
    variants = {"unsynced": build(args, [args.batch], device, None, scope=""),
                "allreduce": build(args, [args.batch], device, "allreduce", scope="",
                                   process_group=graphsync.ProcessGroup(2, task)),
                # what `graphsync run` builds: every collective with its peer timeout (default 300 s)
                "allreduce, timeout": build(args, [args.batch], device, "allreduce", scope="",
                                            process_group=graphsync.ProcessGroup(2, task, timeout=args.peer_timeout)),
                "ps queues": build(args, [args.batch], device, "allreduce", scope="", touch_ps=True,
                                   process_group=graphsync.ProcessGroup(2, task))}
    assert variants["ps queues"][1].strategy == "ps", variants["ps queues"][1]
    x, t = tl.data([args.batch], shape(args), (5,), seed=task)
    sessions = {}
    per_round = {n: [] for n in variants}
    try:
        for name, (built, _) in variants.items():
            sessions[name] = tf1.Session(server.target, graph=built.graph, config=config)
            with built.graph.as_default():
                sessions[name].run(tf1.global_variables_initializer())
        feeds = {n: feed_for(v[0], x, t, [args.batch]) for n, v in variants.items()}
        for name in variants:
            time_steps(sessions[name], variants[name][0], feeds[name], args.warmup)
        for _ in range(args.rounds):
            for name in variants:
                if name != "unsynced":  # untimed: waits for the other worker, so both start together
                    time_steps(sessions[name], variants[name][0], feeds[name], 1)
                per_round[name].append(_common.median(time_steps(sessions[name], variants[name][0],
                                                                 feeds[name], args.steps)))
    finally:
        for sess in sessions.values():
            sess.close()
    ops = {n: len(v[0].graph.get_operations()) for n, v in variants.items()}
    print("RESULT " + json.dumps(summarize(per_round, ops, {n: v[1] for n, v in variants.items()})), flush=True)


def setup_between_graph(args):
    spec = cl.cluster_spec({"ps": 1, "worker": 2})
    procs, results = [], []
    env = cl.env_for_children()
    env["PYTHONPATH"] = os.pathsep.join([_common.SOURCE, os.path.dirname(__file__), env["PYTHONPATH"]])
    ps = subprocess.Popen([sys.executable, "-c", cl.SERVER, json.dumps([spec, "ps", 0, None])],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for i in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", json.dumps([spec, i, vars(args)])],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for proc in procs:
            out, err = proc.communicate(timeout=args.timeout)
            lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"between-graph worker failed:\n{err[-3000:]}")
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for proc in procs + [ps]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return results


COLUMNS = [("variant", "variant"), ("step_ms", "step ms (median)"), ("min_ms", "min"), ("max_ms", "max"),
           ("ratio", "÷ unsynced (median of rounds)"), ("ratio_min", "min"), ("ratio_max", "max"),
           ("vs_gather", "allreduce ÷ gather (median of rounds)"), ("vs_gather_min", "min"), ("vs_gather_max", "max"),
           ("cpu_ms", "CPU ms / step"), ("cpu_ratio", "CPU ÷ unsynced"), ("cpu_vs_gather", "CPU allreduce ÷ gather"),
           ("ops", "graph ops"), ("layers", "synced layers")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="examples per tower")
    parser.add_argument("--size", type=int, default=32, help="input height = width")
    parser.add_argument("--depth", type=int, default=4, help="batch norms per tower")
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--setups", nargs="+", default=["local", "in-graph", "between-graph"])
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--peer-timeout", type=float, default=300,
                        help="(c): the collectives' timeout of the 'allreduce, timeout' variant, as graphsync run sets")
    parser.add_argument("--json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    print(_common.header("Training-step time on distributed runtimes", argv))
    print(f"Model: tests/models.py resnetish(depth={args.depth}, channels={args.channels}) — {args.depth} raw "
          f"FusedBatchNormV3 per tower — on {args.size}×{args.size}×3 inputs, {args.batch} examples per tower, "
          f"fed from numpy; SGD on the summed per-tower gradients (tests/towerlib.py build, rewrite after the "
          f"gradients). {args.rounds} alternating rounds × {args.steps} timed steps after {args.warmup} warm-up "
          f"steps; a round's figure is the median of its steps.\n")
    results = {}
    titles = {"local": "(a) 4 towers on 4 logical CPU devices, one process (inter-op 2, intra-op 1 threads); "
                       "also rewritten before the gradients, then one tf.gradients per tower",
              "in-graph": "(b) in-graph replication over 2 server processes (tower i on /job:worker/task:i; "
                          "gather on /job:worker/task:0/cpu:0; client session on task 0)",
              "between-graph": "(c) between-graph replication: 2 worker processes, one tower each, "
                               "allreduce with ProcessGroup(2, i) and ProcessGroup(2, i, timeout=--peer-timeout); "
                               "ps queues: a step that uses the ps task, synchronized through queues there"}
    for setup in args.setups:
        start = time.perf_counter()
        if setup == "local":
            res = setup_local(args)
        elif setup == "in-graph":
            res = setup_in_graph(args)
        elif setup == "between-graph":
            res = setup_between_graph(args)
        else:
            raise SystemExit(f"unknown setup {setup}")
        results[setup] = res
        print(f"**{titles[setup]}** — {time.perf_counter() - start:.0f} s\n")
        if setup == "between-graph":
            rows = [dict(v, variant=f"worker {i}: {name}") for i, r in enumerate(res) for name, v in r.items()]
        else:
            rows = [dict(v, variant=name) for name, v in res.items()]
        print(_common.table(rows, COLUMNS) + "\n", flush=True)
    _common.write_json(args.json, {"args": {k: v for k, v in vars(args).items() if k != "worker"},
                                   "results": results})


if __name__ == "__main__":
    main()
