"""Rewrite cost: graphsync.rewrite_towers() time ÷ the time TensorFlow took to build the same
multi-tower training graph, for tf_keras ResNet-50 and DenseNet-121 at 1, 2, 4 and 8 towers.

The graph is the TensorFlow CIFAR10 multi-GPU pattern: one Keras application object (weights=None,
variables on /cpu:0), called with training=True once per tower under `tower_<i>/` on /cpu:<i % 4>,
a per-tower loss, per-tower `compute_gradients`, gradients averaged on /cpu:0, one `apply_gradients`
with tower 0's batch-norm updates as control dependencies. "Build" is everything from constructing the
Keras model to the train op; the rewrite runs right after, on the same graph. Each configuration runs
in a fresh Python process (no leftover graphs inflating the garbage collector's work); both wall-clock
and CPU time (time.process_time, less disturbed by other jobs on a shared machine) are recorded.

CLI end to end: the 4-tower ResNet-50 graph saved as .meta; `graphsync rewrite IN -o OUT` vs. merely
reading and writing it (graphsync.io.load + save, and tf.compat.v1.train.import_meta_graph +
export_meta_graph), each a fresh process, alternating, median of 3.

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
import tempfile
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


def build(model_name: str, towers: int):
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
            with tf.device(f"/cpu:{i % 4}"), tf.name_scope(f"tower_{i}"):
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


def batch_norms_per_tower(graph, towers):
    """Training-mode FusedBatchNormV3 ops in tower 0, after checking every tower has as many and
    that they are all fused V3 in training mode."""
    counts = []
    for i in range(towers):
        ops = [op for op in graph.get_operations()
               if op.name.startswith(f"tower_{i}/") and op.type.startswith("FusedBatchNorm")
               and not op.type.startswith("FusedBatchNormGrad")]
        bad = [op.name for op in ops if op.type != "FusedBatchNormV3" or not op.get_attr("is_training")]
        if bad:
            raise SystemExit(f"not a training-mode FusedBatchNormV3: {bad[:3]}")
        counts.append(len(ops))
    if len(set(counts)) != 1:
        raise SystemExit(f"towers differ in batch-norm count: {counts}")
    return counts[0]


def measure_one(model_name: str, towers: int, profile_top: int = 0, cli: bool = False):
    """One configuration, in this (fresh) process."""
    graph, times = build(model_name, towers)
    layers = batch_norms_per_tower(graph, towers)
    ops_before = len(graph.get_operations())
    work_dir = tempfile.mkdtemp(prefix="graphsync-bench-") if cli else None
    if cli:
        tf1.train.export_meta_graph(os.path.join(work_dir, "towers.meta"), graph=graph, clear_devices=False)
    profiler = cProfile.Profile() if profile_top else None
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
    row["ratio"] = rewrite[0] / times["build"][0]
    row["ratio_cpu"] = rewrite[1] / times["build"][1]
    row["ratio_towers_cpu"] = rewrite[1] / times["tower_loop"][1]
    row["per_instance_ms"] = 1e3 * rewrite[1] / instances
    row["ops_per_instance"] = row["ops_added"] / instances
    if profiler:
        row["profile"] = _profile_text(profiler, profile_top)
    if cli:
        del graph
        row["cli"] = cli_end_to_end(work_dir)
    return row


def _profile_text(profiler, top):
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"graphsync", top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


_LOAD_SAVE = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import graphsync.io as gio
t0 = time.perf_counter(); loaded = gio.load(sys.argv[1]); t1 = time.perf_counter()
if sys.argv[3] == "rewrite":
    import graphsync; graphsync.rewrite_towers(loaded.graph)
t2 = time.perf_counter(); gio.save(loaded, sys.argv[2]); t3 = time.perf_counter()
print("STAGES", t1 - t0, t2 - t1, t3 - t2)
"""
_TF_COPY = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_eager_execution()
meta = tf1.MetaGraphDef()
meta.ParseFromString(open(sys.argv[1], "rb").read())
graph = tf.Graph()
with graph.as_default():
    tf1.train.import_meta_graph(meta)
tf1.train.export_meta_graph(sys.argv[2], graph=graph, clear_devices=False)
"""


def cli_end_to_end(work_dir):
    """`graphsync rewrite` on the saved graph vs. processes that only read and write it."""
    src = os.path.join(work_dir, "towers.meta")
    # the CLI of the code under test, not whatever `graphsync` may be installed
    commands = {
        "graphsync rewrite": [sys.executable, "-c", "import sys; sys.argv[0] = 'graphsync'; "
                              "from cli.main import main; main()", "rewrite", "-q", src, "-o"],
        "graphsync.io load + save": [sys.executable, "-c", _LOAD_SAVE, src],
        "TF import_meta_graph + export_meta_graph": [sys.executable, "-c", _TF_COPY, src],
        "in-process stages (load, rewrite, save)": [sys.executable, "-c", _LOAD_SAVE, src],
    }
    extra = {"graphsync.io load + save": ["copy"], "in-process stages (load, rewrite, save)": ["rewrite"]}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_common.SOURCE, os.environ.get("PYTHONPATH", "")]))
    probe = subprocess.run(commands["graphsync rewrite"][:4] + ["rewrite", "--help"], capture_output=True,
                           text=True, env=env, cwd=work_dir)
    if probe.returncode != 0:
        return {"skipped": "no `graphsync rewrite` command: " + (probe.stderr.strip().splitlines() or ["?"])[-1]}
    timings = {name: [] for name in commands}
    stages = []
    for _ in range(3):
        for name, cmd in commands.items():
            dst = os.path.join(work_dir, "out.meta")
            cmd = cmd[:-1] + [cmd[-1], dst] if name == "graphsync rewrite" else cmd + [dst] + extra.get(name, [])
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work_dir)
            timings[name].append(time.perf_counter() - t0)
            if done.returncode != 0:
                return {"skipped": f"{name} failed: {done.stderr.strip()[-400:]}"}
            if "STAGES" in done.stdout and "rewrite" in extra.get(name, []):
                stages.append([float(v) for v in done.stdout.split("STAGES")[1].split()])
            os.remove(dst)
    result = {name: _common.median(t) for name, t in timings.items()}
    result["bytes"] = os.path.getsize(src)
    result["stages"] = [_common.median([s[k] for s in stages]) for k in range(3)]
    os.remove(src)
    os.rmdir(work_dir)
    return result


def run_child(model_name, towers, profile_top, cli):
    """measure_one in a fresh interpreter; returns its row."""
    args = [sys.executable, os.path.abspath(__file__), "--one", model_name, str(towers),
            "--profile-top", str(profile_top)] + (["--with-cli"] if cli else [])
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{model_name} x{towers} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("ROW ", 1)[1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["ResNet50", "DenseNet121"])
    parser.add_argument("--towers", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--profile", type=int, default=0, metavar="TOWERS",
                        help="cProfile the rewrite at this tower count and print the top functions")
    parser.add_argument("--cli", type=int, default=4, metavar="TOWERS",
                        help="tower count of the ResNet-50 graph for the CLI end-to-end timing (0: skip)")
    parser.add_argument("--json")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "TOWERS"), help=argparse.SUPPRESS)
    parser.add_argument("--profile-top", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--with-cli", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        row = measure_one(args.one[0], int(args.one[1]), args.profile_top, args.with_cli)
        print("ROW " + json.dumps(row))
        return

    print(_common.header("Rewrite cost", argv))
    rows, profiles, cli_result = [], [], None
    for model_name in args.models:
        for towers in args.towers:
            cli = bool(args.cli) and model_name == "ResNet50" and towers == args.cli
            row = run_child(model_name, towers, 30 if towers == args.profile else 0, cli)
            rows.append(row)
            print(f"  {model_name} x{towers}: build {row['build']:.2f} s ({row['build_cpu']:.2f} CPU), rewrite "
                  f"{row['rewrite']:.2f} s ({row['rewrite_cpu']:.2f} CPU); {row['summary']}",
                  file=sys.stderr, flush=True)
            if "profile" in row:
                profiles.append((f"{model_name} x{towers}", row.pop("profile")))
            if "cli" in row:
                cli_result = row.pop("cli")
    print(_common.table(rows, [("model", "model"), ("towers", "towers"), ("layers", "BN/tower"),
                               ("instances", "BN instances"), ("ops", "ops built"),
                               ("build", "build s"), ("build_cpu", "build CPU s"),
                               ("rewrite", "rewrite s"), ("rewrite_cpu", "rewrite CPU s"),
                               ("ratio", "rewrite ÷ build (wall)"), ("ratio_cpu", "rewrite ÷ build (CPU)"),
                               ("ratio_towers_cpu", "÷ build without Keras object (CPU)"),
                               ("per_instance_ms", "CPU ms / BN instance"),
                               ("ops_per_instance", "ops added / instance")]))
    print("\n'build' = constructing the Keras model object + the towers (forward, loss, compute_gradients) + "
          "averaging + apply_gradients; 'without Keras object' leaves out constructing the model object "
          "(done once, whatever the tower count). At 1 tower there is nothing to synchronize: the rewrite "
          "only plans.")
    if cli_result is not None:
        print(f"\nCLI end to end (ResNet-50, {args.cli} towers, saved .meta of "
              f"{cli_result.get('bytes', 0) / 1e6:.1f} MB; fresh processes, alternating, medians of 3):\n")
        if "skipped" in cli_result:
            print(f"skipped — {cli_result['skipped']}")
        else:
            base = cli_result["graphsync.io load + save"]
            rows_cli = [dict(what=k, s=v, ratio=v / base) for k, v in cli_result.items()
                        if k not in ("bytes", "stages", "in-process stages (load, rewrite, save)")]
            print(_common.table(rows_cli, [("what", "process"), ("s", "wall s"),
                                           ("ratio", "÷ graphsync.io load + save")]))
            load, rewrite, save = cli_result["stages"]
            print(f"\nInside one process: load {load:.2f} s, rewrite_towers {rewrite:.2f} s, save {save:.2f} s.")
    for label, text in profiles:
        print(f"\ncProfile of rewrite_towers, {label}:\n```\n{text.strip()}\n```")
    _common.write_json(args.json, {"rows": rows, "cli": cli_result})


if __name__ == "__main__":
    main()
