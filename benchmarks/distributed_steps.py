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
  (d) "ps-scaling" (issue 46): the ps exchange against the number of workers W, one tower each,
      every worker's graph using the ps as in (c)'s "ps queues". The exchange of the checkout
      (graphsync/exchange/queues.py: a star, one contribution up to the ps and one total down per
      worker) beside the all-to-all one it replaced (every worker enqueues its contribution for
      every other: W·(W − 1) queues per layer and direction), loaded from git at OLD_EXCHANGE and
      put in place of graphsync.exchange.queues.summed while its graphs are built (no copy in the
      repository; without git history that variant is skipped, with a message). First counted from
      the rewritten graphs of every worker for --ps-workers (no process started): per synchronized
      layer and step, the tensors a worker receives from the ps and the queue operations on the ps
      for the whole job. Then timed for --ps-step-workers: a ps process and W worker processes on
      127.0.0.1, each alternating the unsynchronized graph and both exchanges' graphs, every
      worker's steps cross-checked against its partition graphs (the _Recv nodes from the ps).

Graphs are built with tests/towerlib.py `build` (the CIFAR10 pattern: per-tower gradients, summed,
tower 0's updates) around tests/models.py `resnetish`, and rewritten after the gradients exist ((a) also
times both strategies rewritten before the gradients, then one tf.gradients per tower). In (a)
and (b) all variants live in one client process and are timed in alternating rounds; ratios are taken
within a round, then the median. In (c) each worker alternates an unsynchronized and a synchronized
graph of its own; one untimed synchronized step per round lines the two workers up.

    python benchmarks/distributed_steps.py [--rounds 21] [--steps 5] [--json PATH]
    python benchmarks/distributed_steps.py --setups ps-scaling --rounds 5 --steps 3   # (d) alone
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import time
import types

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


# (d) ps-scaling (issue 46) ------------------------------------------------------------------------

# The commit whose graphsync/exchange/queues.py is the all-to-all exchange the star replaced.
OLD_EXCHANGE = "e2384c9"
PS_VARIANTS = ("unsynced", "ps star", "ps all-to-all")


def worker_device(task):
    return f"/job:worker/replica:0/task:{task}/device:CPU:0"


def old_exchange_source():
    """(text of queues.py at OLD_EXCHANGE, None) from the repository's git history, or (None, why)."""
    try:
        out = subprocess.run(["git", "-C", _common.REPO, "show", f"{OLD_EXCHANGE}:graphsync/exchange/queues.py"],
                             capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"git is not available ({e})"
    if out.returncode != 0:
        return None, f"git show {OLD_EXCHANGE}:graphsync/exchange/queues.py failed: {out.stderr.strip()[:200]}"
    return out.stdout, None


@contextlib.contextmanager
def exchange(source):
    """graphsync.exchange.queues.summed as the queues.py text `source` defines it (None: the
    installed one), for the graphs built inside. through_ps.py and views.py call `queues.summed`
    by attribute; the old module keeps its own helpers (its queue_name(base, writer, reader),
    _queue, _marked), so its summed is the only name replaced."""
    if source is None:
        yield
        return
    from graphsync.exchange import queues
    module = types.ModuleType(f"graphsync_queues_{OLD_EXCHANGE}")
    module.__file__ = f"{OLD_EXCHANGE}:graphsync/exchange/queues.py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    saved = queues.summed
    queues.summed = module.summed
    try:
        yield
    finally:
        queues.summed = saved


def installed_is_old(source) -> bool:
    """Whether the graphsync measured still has the all-to-all exchange (e.g. GRAPHSYNC_SRC of an
    older commit): then both variants are the same code."""
    import inspect
    from graphsync.exchange import queues
    return source is not None and inspect.getsource(queues).strip() == source.strip()


def ps_variants(args, workers, task, source):
    """Worker `task`'s graphs of (d): name -> (built, report); every synchronized one through the ps."""
    device = [worker_device(task)]
    group = graphsync.ProcessGroup(workers, task)
    variants = {"unsynced": build(args, [args.batch], device, None, scope=""),
                "ps star": build(args, [args.batch], device, "allreduce", scope="", touch_ps=True,
                                 process_group=group)}
    if source is not None:
        with exchange(source):
            variants["ps all-to-all"] = build(args, [args.batch], device, "allreduce", scope="", touch_ps=True,
                                              process_group=group)
    for name, (_, report) in variants.items():
        assert name == "unsynced" or report.strategy == "ps", (name, report)
    return variants


def exchange_counts(graph, task):
    """What graphsync's exchange puts on the ps in worker `task`'s graph: its ops there (every op on
    the ps but touch_ps's Identity), by type; the tensors they hand to ops on this worker's device
    (received from the ps: one _Recv each, whatever the number of readers) and the bytes of those
    whose shape is known; the tensors of this worker's they read (sent to the ps); the queues'
    shared names."""
    mine = worker_device(task)
    on_ps = [op for op in graph.get_operations() if op.device == PS and op.name != "read_on_the_ps"]
    assert all("_sync/" in op.name for op in on_ps), [op.name for op in on_ps if "_sync/" not in op.name]
    names = {op.name for op in on_ps}
    down = {t for op in graph.get_operations() if op.device == mine for t in op.inputs if t.op.name in names}
    up = {t for op in on_ps for t in op.inputs if t.op.device == mine}
    return {"types": collections.Counter(op.type for op in on_ps),
            "down": len(down), "up": len(up),
            "down_bytes": sum(t.shape.num_elements() * t.dtype.size for t in down if t.shape.is_fully_defined()),
            "queues": {op.get_attr("shared_name").decode() for op in on_ps if op.type == "FIFOQueueV2"}}


def count_ps_exchange(args, source):
    """(d), counted: every worker's rewritten graph for each W of --ps-workers, no process started.
    Per synchronized layer and step (forward and backward together)."""
    rows = []
    for workers in args.ps_workers:
        per_variant = {}
        for task in range(workers):
            for name, (built, report) in ps_variants(args, workers, task, source).items():
                if name != "unsynced":
                    per_variant.setdefault(name, []).append((exchange_counts(built.graph, task), len(report.layers)))
        for name, counted in per_variant.items():
            layers = {n for _, n in counted}
            assert len(layers) == 1, layers
            n = layers.pop()
            job = sum((c["types"] for c, _ in counted), collections.Counter())
            queue_ops = job["QueueEnqueueV2"] + job["QueueDequeueV2"]
            rows.append({"W": workers, "exchange": name.replace("ps ", ""), "layers": n,
                         "down": max(c["down"] for c, _ in counted) / n,
                         "down_min": min(c["down"] for c, _ in counted) / n,
                         "up": max(c["up"] for c, _ in counted) / n,
                         "down_bytes": max(c["down_bytes"] for c, _ in counted) / n,
                         "enqueues": job["QueueEnqueueV2"] / n, "dequeues": job["QueueDequeueV2"] / n,
                         "queue_ops": queue_ops / n, "queue_ops_per_worker": queue_ops / n / workers,
                         "handles": job["FIFOQueueV2"] / n,
                         "queues": len(set().union(*(c["queues"] for c, _ in counted))) / n,
                         "other_ps_ops": sum(v for k, v in job.items() if not k.startswith(("Queue", "FIFOQueue"))) / n,
                         "worker0_ps_ops": sum(counted[0][0]["types"].values()) / n,
                         "worker1_ps_ops": sum(counted[1][0]["types"].values()) / n})
        print(f"  counted W = {workers}", file=sys.stderr, flush=True)
    return rows


def received_from_ps(metadata, task):
    """_Recv nodes of a step's partition graphs that bring a tensor from the ps to worker `task`."""
    mine = worker_device(task)
    return sum(1 for g in metadata.partition_graphs for node in g.node if node.op == "_Recv"
               and node.attr["send_device"].s.decode() == PS and node.attr["recv_device"].s.decode() == mine)


def ps_worker_main(payload):
    """One worker process of (d): its own server; the unsynchronized graph and each exchange's graph,
    timed in rounds, every worker running the same variant at the same time (same order)."""
    cluster, task, a, source = json.loads(payload)
    args = argparse.Namespace(**a)
    workers = len(cluster["worker"])
    config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task}"])
    server = TF.distribute.Server(TF.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=config)
    variants = ps_variants(args, workers, task, source)
    x, t = tl.data([args.batch], shape(args), (5,), seed=task)
    sessions, recvs = {}, {}
    per_round = {n: [] for n in variants}
    try:
        for name, (built, _) in variants.items():
            sessions[name] = tf1.Session(server.target, graph=built.graph, config=config)
            with built.graph.as_default():
                sessions[name].run(tf1.global_variables_initializer())
        feeds = {n: feed_for(v[0], x, t, [args.batch]) for n, v in variants.items()}
        for name, (built, _) in variants.items():   # the first warm-up step traced: what crosses
            metadata = tf1.RunMetadata()
            sessions[name].run(built.train_op, feeds[name], options=tf1.RunOptions(output_partition_graphs=True),
                               run_metadata=metadata)
            recvs[name] = received_from_ps(metadata, task)
            time_steps(sessions[name], built, feeds[name], args.warmup - 1)
        for r in range(args.rounds):
            for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
                if name != "unsynced":  # untimed: waits for the other workers, so all start together
                    time_steps(sessions[name], variants[name][0], feeds[name], 1)
                per_round[name].append(_common.median(time_steps(sessions[name], variants[name][0],
                                                                 feeds[name], args.steps)))
    finally:
        for sess in sessions.values():
            sess.close()
    out = summarize(per_round, {n: len(v[0].graph.get_operations()) for n, v in variants.items()},
                    {n: v[1] for n, v in variants.items()})
    for name, row in out.items():
        row["recvs_from_ps"] = recvs[name]
    if "ps all-to-all" in per_round:
        ratios = [a / b for a, b in zip(per_round["ps star"], per_round["ps all-to-all"])]
        out["ps star"].update(vs_all=_common.median(ratios), vs_all_min=min(ratios), vs_all_max=max(ratios))
    print("RESULT " + json.dumps(out), flush=True)


def time_ps_exchange(args, source, workers):
    """(d), timed: one ps process and `workers` worker processes on 127.0.0.1."""
    spec = cl.cluster_spec({"ps": 1, "worker": workers})
    procs, results = [], []
    env = cl.env_for_children()
    env["PYTHONPATH"] = os.pathsep.join([_common.SOURCE, os.path.dirname(__file__), env["PYTHONPATH"]])
    ps = subprocess.Popen([sys.executable, "-c", cl.SERVER, json.dumps([spec, "ps", 0, None])],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for i in range(workers):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--ps-worker", json.dumps([spec, i, vars(args), source])],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.time() + args.timeout
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.time()))
            lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"ps-scaling worker failed:\n{err[-3000:]}")
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for proc in procs + [ps]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return results


def setup_ps_scaling(args):
    source, why = old_exchange_source()
    if source is None:
        print(f"(d): the all-to-all variant is skipped: {why}\n")
    elif installed_is_old(source):
        print(f"(d): note: the graphsync measured ({_common.SOURCE}) has the all-to-all exchange itself: "
              f"both variants are the same code\n")
    counts = count_ps_exchange(args, source)
    timed = {}
    for workers in args.ps_step_workers:
        start = time.perf_counter()
        timed[workers] = time_ps_exchange(args, source, workers)
        print(f"  timed W = {workers}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return {"counts": counts, "steps": timed, "old_exchange": OLD_EXCHANGE if source else None}


def ps_step_rows(timed):
    """Per W and variant, over the workers: the median and range of their medians and ratios."""
    rows = []
    for workers, results in timed.items():
        for name in PS_VARIANTS:
            per = [r[name] for r in results if name in r]
            if not per:
                continue
            row = {"W": workers, "variant": name, "step_ms": _common.median([p["step_ms"] for p in per]),
                   "step_lo": min(p["step_ms"] for p in per), "step_hi": max(p["step_ms"] for p in per),
                   "ratio": _common.median([p["ratio"] for p in per]),
                   "ratio_lo": min(p["ratio"] for p in per), "ratio_hi": max(p["ratio"] for p in per),
                   "recvs": max(p["recvs_from_ps"] for p in per), "ops": max(p["ops"] for p in per)}
            if "vs_all" in per[0]:
                row.update(vs_all=_common.median([p["vs_all"] for p in per]),
                           vs_all_lo=min(p["vs_all"] for p in per), vs_all_hi=max(p["vs_all"] for p in per))
            rows.append(row)
    return rows


COUNT_COLUMNS = [("W", "workers W"), ("exchange", "exchange"),
                 ("down", "tensors a worker receives from the ps (max over workers)"),
                 ("down_min", "(min)"), ("down_bytes", "their bytes (max)"),
                 ("up", "tensors a worker sends to the ps (max)"),
                 ("enqueues", "QueueEnqueueV2 on the ps, whole job"), ("dequeues", "QueueDequeueV2"),
                 ("queue_ops", "enqueues + dequeues"), ("queue_ops_per_worker", "÷ W"),
                 ("handles", "FIFOQueueV2 handle ops, whole job"), ("queues", "distinct queues (shared names)"),
                 ("other_ps_ops", "other ops on the ps (sums), whole job"),
                 ("worker0_ps_ops", "worker 0's ops on the ps"), ("worker1_ps_ops", "worker 1's")]
STEP_COLUMNS = [("W", "workers W"), ("variant", "variant"),
                ("step_ms", "step ms (median over workers of their medians)"), ("step_lo", "min worker"),
                ("step_hi", "max worker"), ("ratio", "÷ unsynced (median over workers)"), ("ratio_lo", "min"),
                ("ratio_hi", "max"), ("vs_all", "star ÷ all-to-all (median over workers)"), ("vs_all_lo", "min"),
                ("vs_all_hi", "max"), ("recvs", "_Recv from the ps per step (max over workers)"),
                ("ops", "graph ops")]


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
    parser.add_argument("--ps-workers", type=int, nargs="+", default=[2, 4, 8, 16],
                        help="(d) ps-scaling: the numbers of workers whose graphs are counted")
    parser.add_argument("--ps-step-workers", type=int, nargs="*", default=[2, 4, 8, 16],
                        help="(d) ps-scaling: the numbers of worker processes timed (each with a ps process); none: counts only")
    parser.add_argument("--json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ps-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    if args.ps_worker:
        return ps_worker_main(args.ps_worker)
    if min(args.ps_workers + args.ps_step_workers, default=2) < 2:
        parser.error("--ps-workers and --ps-step-workers: 2 workers or more")
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
                               "ps queues: a step that uses the ps task, synchronized through queues there",
              "ps-scaling": "(d) the ps exchange against the number of workers W (one tower each, one ps): "
                            f"the star of the checkout's graphsync/exchange/queues.py and the all-to-all exchange "
                            f"of {OLD_EXCHANGE} (loaded from git)"}
    for setup in args.setups:
        start = time.perf_counter()
        if setup == "local":
            res = setup_local(args)
        elif setup == "in-graph":
            res = setup_in_graph(args)
        elif setup == "between-graph":
            res = setup_between_graph(args)
        elif setup == "ps-scaling":
            res = setup_ps_scaling(args)
        else:
            raise SystemExit(f"unknown setup {setup}")
        results[setup] = res
        print(f"**{titles[setup]}** — {time.perf_counter() - start:.0f} s\n")
        if setup == "ps-scaling":
            print(f"Counted from every worker's rewritten graph (no process), per synchronized layer and step, "
                  f"forward and backward together ({res['counts'][0]['layers'] if res['counts'] else '?'} layers "
                  f"per graph): a tensor an op on the ps hands to ops on a worker's device is one _Recv there "
                  f"however many read it; 'whole job' sums the ops on the ps over the W worker graphs.\n")
            print(_common.table(res["counts"], COUNT_COLUMNS) + "\n")
            if res["steps"]:
                print(f"Timed: a ps process and W worker processes on 127.0.0.1 (device_filters: the ps and the "
                      f"worker itself), each alternating the variants in the same order ({args.rounds} rounds × "
                      f"{args.steps} timed steps, one untimed synchronized step first to line the workers up; "
                      f"{args.warmup} warm-up steps, the first traced for its partition graphs).\n")
                print(_common.table(ps_step_rows(res["steps"]), STEP_COLUMNS) + "\n", flush=True)
            continue
        if setup == "between-graph":
            rows = [dict(v, variant=f"worker {i}: {name}") for i, r in enumerate(res) for name, v in r.items()]
        else:
            rows = [dict(v, variant=name) for name, v in res.items()]
        print(_common.table(rows, COLUMNS) + "\n", flush=True)
    _common.write_json(args.json, {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "ps_worker")},
                                   "results": results})


if __name__ == "__main__":
    main()
