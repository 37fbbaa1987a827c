"""Rewrite cost: graphsync.rewrite_towers() time ÷ the time TensorFlow took to build the same
multi-tower training graph, for tf_keras ResNet-50 and DenseNet-121 at 1, 2, 4 and 8 towers.

The graph is the TensorFlow CIFAR10 multi-GPU pattern: one Keras application object (weights=None,
variables on /cpu:0), called with training=True once per tower under `tower_<i>/` on /cpu:<i % 4>,
a per-tower loss, per-tower `compute_gradients`, gradients averaged on /cpu:0, one `apply_gradients`
with tower 0's batch-norm updates as control dependencies. "Build" is everything from constructing the
Keras model to the train op; the rewrite runs right after, on the same graph. Each configuration runs
in a fresh Python process (no leftover graphs inflating the garbage collector's work); both wall-clock
and CPU time (time.process_time, less disturbed by other jobs on a shared machine) are recorded.

The CLI end to end on the saved graph is benchmarks/cli_end_to_end.py.

    python benchmarks/rewrite_cost.py                  # the recorded run (a few minutes on 2 cores)
    python benchmarks/rewrite_cost.py --models ResNet50 --towers 1 2 --profile 2
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

tf = _common.import_tf()
tf1 = tf.compat.v1
tf1.disable_eager_execution()
with _common.quiet_stderr():
    import tf_keras  # noqa: E402

import graphsync  # noqa: E402

INPUT = (32, 32, 3)
CLASSES = 10


def build(model_name: str, towers: int, scope: str = "tower_%d"):
    """The multi-tower training graph; returns (graph, {phase: (wall s, cpu s)})."""
    graph = tf.Graph()
    marks = [(time.perf_counter(), time.process_time())]
    with graph.as_default():
        with tf.device("/cpu:0"):
            model = getattr(tf_keras.applications, model_name)(weights=None, input_shape=INPUT,
                                                               classes=CLASSES)
        marks.append((time.perf_counter(), time.process_time()))
        opt = tf1.train.GradientDescentOptimizer(0.1)
        tower_grads, updates = [], []
        for i in range(towers):
            with tf.device(f"/cpu:{i % 4}"), tf.name_scope(scope % i):
                x = tf1.placeholder(tf.float32, (None,) + INPUT, name="images")
                labels = tf1.placeholder(tf.int32, (None,), name="labels")
                probs = model(x, training=True)
                loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(labels, probs))
                if i == 0:
                    updates = model.get_updates_for(x)
                tower_grads.append(opt.compute_gradients(loss, model.trainable_variables))
        with tf.device("/cpu:0"):
            averaged = [(tf.add_n([tg[k][0] for tg in tower_grads]) / towers, tower_grads[0][k][1])
                        for k in range(len(tower_grads[0]))]
            with tf.control_dependencies(updates):
                train_op = opt.apply_gradients(averaged)
        tf1.add_to_collection(tf1.GraphKeys.TRAIN_OP, train_op)
        marks.append((time.perf_counter(), time.process_time()))

    def span(a, b):
        return (marks[b][0] - marks[a][0], marks[b][1] - marks[a][1])
    return graph, {"keras": span(0, 1), "tower_loop": span(1, 2), "build": span(0, 2)}


def batch_norms_per_tower(graph, towers, scope="tower_%d"):
    """Training-mode FusedBatchNormV3 ops in tower 0, after checking every tower has as many and
    that they are all fused V3 in training mode."""
    counts = []
    for i in range(towers):
        ops = [op for op in graph.get_operations()
               if op.name.startswith(scope % i + "/") and op.type.startswith("FusedBatchNorm")
               and not op.type.startswith("FusedBatchNormGrad")]
        bad = [op.name for op in ops if op.type != "FusedBatchNormV3" or not op.get_attr("is_training")]
        if bad:
            raise SystemExit(f"not a training-mode FusedBatchNormV3: {bad[:3]}")
        counts.append(len(ops))
    if len(set(counts)) != 1:
        raise SystemExit(f"towers differ in batch-norm count: {counts}")
    return counts[0]


def measure_one(model_name: str, towers: int, profile_top: int = 0, scope: str = "tower_%d"):
    """One configuration, in this (fresh) process."""
    graph, times = build(model_name, towers, scope)
    layers = batch_norms_per_tower(graph, towers, scope)
    ops_before = len(graph.get_operations())
    profiler = cProfile.Profile() if profile_top else None
    spent = _timing_the_backward()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    report = graphsync.rewrite_towers(graph)
    if profiler:
        profiler.disable()
    rewrite = (time.perf_counter() - wall0, time.process_time() - cpu0)
    if towers > 1 and len(report.layers) != layers:
        raise SystemExit(f"{model_name} x{towers}: rewrote {len(report.layers)} of {layers} layers")
    instances = towers * layers
    row = dict(model=model_name, towers=towers, layers=layers, instances=instances, ops=ops_before,
               ops_added=len(graph.get_operations()) - ops_before, summary=report.summary)
    for key, (wall, cpu) in list(times.items()) + [("rewrite", rewrite)]:
        row[key], row[key + "_cpu"] = wall, cpu
    row.update(backward_cpu=spent["cpu"], backward_builds=spent["builds"], backward_extends=spent["extends"])
    row["ratio"] = rewrite[0] / times["build"][0]
    row["ratio_cpu"] = rewrite[1] / times["build"][1]
    row["ratio_towers_cpu"] = rewrite[1] / times["tower_loop"][1]
    row["per_instance_ms"] = 1e3 * rewrite[1] / instances
    row["ops_per_instance"] = row["ops_added"] / instances
    if profiler:
        row["profile"] = _profile_text(profiler, profile_top)
    return row


def _timing_the_backward() -> dict:
    """The CPU time of finding the backward (graphsync/graph/backward.py) during the rewrite: its
    state built for a graph (the model's, and each function body traced), and extended by the ops
    added since. Measured by wrapping the two in this benchmark's process only."""
    from graphsync.graph import backward
    spent = {"cpu": 0.0, "builds": 0, "extends": 0}
    build, extend = backward._Backward.__init__, backward._Backward.extend

    def timed(function, counter):
        def wrapper(*args):
            start = time.process_time()
            try:
                return function(*args)
            finally:
                spent["cpu"] += time.process_time() - start
                spent[counter] += 1
        return wrapper

    backward._Backward.__init__ = timed(build, "builds")
    backward._Backward.extend = timed(extend, "extends")
    return spent


def _profile_text(profiler, top):
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"graphsync", top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def run_child(model_name, towers, profile_top, scope="tower_%d"):
    """measure_one in a fresh interpreter; returns its row."""
    args = [sys.executable, os.path.abspath(__file__), "--one", model_name, str(towers),
            "--profile-top", str(profile_top), "--scope", scope]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{model_name} x{towers} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("ROW ", 1)[1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["ResNet50", "DenseNet121"])
    parser.add_argument("--towers", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--profile", type=int, default=0, metavar="TOWERS",
                        help="also cProfile the rewrite of the first model at this tower count (a separate "
                             "run) and print the top functions")
    parser.add_argument("--json")
    parser.add_argument("--scope", default="tower_%d",
                        help="the towers' name scope (gpu_%%d: towers found by structure, not by a known name)")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "TOWERS"), help=argparse.SUPPRESS)
    parser.add_argument("--profile-top", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        row = measure_one(args.one[0], int(args.one[1]), args.profile_top, args.scope)
        print("ROW " + json.dumps(row))
        return

    print(_common.header("Rewrite cost", argv))
    rows, profiles = [], []
    for model_name in args.models:
        for towers in args.towers:
            row = run_child(model_name, towers, 0, args.scope)
            rows.append(row)
            print(f"  {model_name} x{towers}: build {row['build']:.2f} s ({row['build_cpu']:.2f} CPU), rewrite "
                  f"{row['rewrite']:.2f} s ({row['rewrite_cpu']:.2f} CPU); {row['summary']}",
                  file=sys.stderr, flush=True)
    print(_common.table(rows, [("model", "model"), ("towers", "towers"), ("layers", "BN/tower"),
                               ("instances", "BN instances"), ("ops", "ops built"),
                               ("build", "build s"), ("build_cpu", "build CPU s"),
                               ("rewrite", "rewrite s"), ("rewrite_cpu", "rewrite CPU s"),
                               ("ratio", "rewrite ÷ build (wall)"), ("ratio_cpu", "rewrite ÷ build (CPU)"),
                               ("ratio_towers_cpu", "÷ build without Keras object (CPU)"),
                               ("per_instance_ms", "CPU ms / BN instance"),
                               ("backward_cpu", "of it, the backward's CPU s"),
                               ("backward_builds", "backward built (graphs)"),
                               ("ops_per_instance", "ops added / instance")]))
    print("\n'build' = constructing the Keras model object + the towers (forward, loss, compute_gradients) + "
          "averaging + apply_gradients; 'without Keras object' leaves out constructing the model object "
          "(done once, whatever the tower count). At 1 tower there is nothing to synchronize: the rewrite "
          "only plans.")
    if args.profile:  # a separate run: the profiler's overhead stays out of the table
        row = run_child(args.models[0], args.profile, 30)
        profiles.append((f"{args.models[0]} x{args.profile} (rewrite {row['rewrite_cpu']:.2f} CPU s under "
                         f"the profiler, {row['ops_added']} ops added)", row.pop("profile")))
    for label, text in profiles:
        print(f"\ncProfile of rewrite_towers, {label}:\n```\n{text.strip()}\n```")
    _common.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
