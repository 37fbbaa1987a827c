"""Rewrite cost: graphsync.rewrite_towers() time ÷ the time TensorFlow took to build the same
multi-tower training graph, for tf_keras ResNet-50 and DenseNet-121 at 1, 2, 4 and 8 towers.

The graph is the TensorFlow CIFAR10 multi-GPU pattern: one Keras application object (weights=None,
variables on /cpu:0), called with training=True once per tower under `tower_<i>/` on /cpu:<i % 4>,
a per-tower loss, per-tower `compute_gradients`, gradients averaged on /cpu:0, one `apply_gradients`
with tower 0's batch-norm updates as control dependencies. "Build" is everything from constructing the
Keras model to the train op; the rewrite runs right after, on the same graph.

    python benchmarks/rewrite_cost.py                  # the recorded run (a few minutes on 2 cores)
    python benchmarks/rewrite_cost.py --models ResNet50 --towers 1 2 --profile 2
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import subprocess
import sys
import tempfile

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
    """The multi-tower training graph; returns (graph, seconds per phase, train_op)."""
    graph = tf.Graph()
    times = {}
    with graph.as_default():
        t0 = _common.now()
        with tf.device("/cpu:0"):
            model = getattr(tf_keras.applications, model_name)(weights=None, input_shape=INPUT,
                                                               classes=CLASSES)
        t1 = _common.now()
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
        t2 = _common.now()
        with tf.device("/cpu:0"):
            averaged = [(tf.add_n([tg[k][0] for tg in tower_grads]) / towers, tower_grads[0][k][1])
                        for k in range(len(tower_grads[0]))]
            with tf.control_dependencies(updates):
                train_op = opt.apply_gradients(averaged)
        t3 = _common.now()
    times.update(keras=t1 - t0, tower_loop=t2 - t1, apply=t3 - t2, build=t3 - t0)
    return graph, times, train_op


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


def measure(model_name: str, towers: int, profile_top: int = 0):
    gc.collect()
    graph, times, _ = build(model_name, towers)
    layers = batch_norms_per_tower(graph, towers)
    ops_before = len(graph.get_operations())
    profiler = cProfile.Profile() if profile_top else None
    t0 = _common.now()
    if profiler:
        profiler.enable()
    report = graphsync.rewrite_towers(graph)
    if profiler:
        profiler.disable()
    rewrite = _common.now() - t0
    if towers > 1 and len(report.layers) != layers:
        raise SystemExit(f"{model_name} x{towers}: rewrote {len(report.layers)} of {layers} layers")
    instances = towers * layers
    row = dict(model=model_name, towers=towers, layers=layers, instances=instances, ops=ops_before,
               ops_added=len(graph.get_operations()) - ops_before, **times, rewrite=rewrite,
               ratio=rewrite / times["build"], ratio_no_model=rewrite / (times["tower_loop"] + times["apply"]),
               per_instance_ms=1e3 * rewrite / instances, summary=report.summary)
    row["ops_per_instance"] = row["ops_added"] / instances
    if profiler:
        row["profile"] = _profile_text(profiler, profile_top)
    return row, graph


def _profile_text(profiler, top):
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"graphsync", top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def cli_end_to_end(graph, work_dir):
    """`graphsync rewrite` on the saved graph vs. a script that only reads and writes it, both as
    fresh processes (so both pay the TensorFlow import). None when the CLI has no rewrite command."""
    # the CLI of the code under test (not whatever `graphsync` may be installed)
    base = [sys.executable, "-c", "import sys; sys.argv[0] = 'graphsync'; from cli.main import main; main()"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_common.SOURCE, os.environ.get("PYTHONPATH", "")]))
    probe = subprocess.run(base + ["rewrite", "--help"], capture_output=True, text=True, env=env,
                           cwd=work_dir)
    if probe.returncode != 0:
        return {"skipped": "no `graphsync rewrite` command yet (cli/main.py has no rewrite subcommand): "
                           + (probe.stderr.strip().splitlines() or ["?"])[-1]}
    src = os.path.join(work_dir, "towers.meta")
    tf1.train.export_meta_graph(src, graph=graph, clear_devices=False)
    copy_script = ("import os,sys,time; os.environ['TF_CPP_MIN_LOG_LEVEL']='2'; import tensorflow as tf; "
                   "m = tf.compat.v1.MetaGraphDef(); m.ParseFromString(open(sys.argv[1],'rb').read()); "
                   "g = tf.Graph()\nwith g.as_default(): tf.compat.v1.train.import_meta_graph(m)\n"
                   "tf.compat.v1.train.export_meta_graph(sys.argv[2], graph=g, clear_devices=False)")
    timings = {"cli": [], "copy": []}
    for _ in range(3):  # alternate, median
        for kind in ("cli", "copy"):
            dst = os.path.join(work_dir, f"out_{kind}.meta")
            cmd = base + ["rewrite", src, "-o", dst] if kind == "cli" else \
                [sys.executable, "-c", copy_script, src, dst]
            t0 = _common.now()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work_dir)
            timings[kind].append(_common.now() - t0)
            if done.returncode != 0:
                return {"skipped": f"`{' '.join(cmd[-4:])}` failed: {done.stderr.strip()[-300:]}"}
            os.remove(dst)
    return {"bytes": os.path.getsize(src), "cli": _common.median(timings["cli"]),
            "copy": _common.median(timings["copy"]),
            "ratio": _common.median(timings["cli"]) / _common.median(timings["copy"])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["ResNet50", "DenseNet121"])
    parser.add_argument("--towers", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--profile", type=int, default=0, metavar="TOWERS",
                        help="cProfile the rewrite at this tower count and print the top functions")
    parser.add_argument("--cli", type=int, default=4, metavar="TOWERS",
                        help="tower count of the ResNet-50 graph for the CLI end-to-end timing (0: skip)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    print(_common.header("Rewrite cost", argv))
    rows, profiles, cli_result = [], [], None
    for model_name in args.models:
        for towers in args.towers:
            row, graph = measure(model_name, towers, 30 if towers == args.profile else 0)
            rows.append(row)
            print(f"  {model_name} x{towers}: build {row['build']:.2f} s, rewrite {row['rewrite']:.2f} s "
                  f"({row['ratio']:.3f}); {row['summary']}", file=sys.stderr, flush=True)
            if "profile" in row:
                profiles.append((f"{model_name} x{towers}", row.pop("profile")))
            if args.cli and model_name == "ResNet50" and towers == args.cli and cli_result is None:
                with tempfile.TemporaryDirectory() as work_dir:
                    # a fresh, un-rewritten copy of the same graph
                    fresh, _, _ = build(model_name, towers)
                    cli_result = cli_end_to_end(fresh, work_dir)
                    del fresh
            del graph
    print(_common.table(rows, [("model", "model"), ("towers", "towers"), ("layers", "BN/tower"),
                               ("instances", "BN instances"), ("ops", "ops built"),
                               ("keras", "Keras object s"), ("build", "build s"), ("rewrite", "rewrite s"),
                               ("ratio", "rewrite ÷ build"), ("ratio_no_model", "÷ build w/o Keras object"),
                               ("per_instance_ms", "ms / instance"), ("ops_added", "ops added"),
                               ("ops_per_instance", "ops added / instance")]))
    print("\n'build s' = Keras model object + towers (forward, loss, compute_gradients) + averaging + "
          "apply_gradients; '÷ build w/o Keras object' leaves out constructing the Keras model object.")
    if cli_result is not None:
        print("\nCLI end to end (ResNet-50, %d towers, saved .meta):" % args.cli)
        if "skipped" in cli_result:
            print(f"skipped — {cli_result['skipped']}")
        else:
            print(f"`graphsync rewrite` {cli_result['cli']:.2f} s vs. read + write only "
                  f"{cli_result['copy']:.2f} s (ratio {cli_result['ratio']:.2f}; .meta "
                  f"{cli_result['bytes'] / 1e6:.1f} MB; medians of 3 alternating fresh processes)")
    for label, text in profiles:
        print(f"\ncProfile of rewrite_towers, {label}:\n```\n{text.strip()}\n```")
    _common.write_json(args.json, {"rows": rows, "cli": cli_result})


if __name__ == "__main__":
    main()
