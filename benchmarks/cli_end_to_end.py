"""CLI end to end: `graphsync rewrite IN.meta -o OUT.meta` on a saved multi-tower training graph vs.
merely reading and writing the same file, each a fresh process (so each pays Python + TensorFlow
start-up), alternating, median of --repeat runs:

  graphsync rewrite            the CLI of the code under test (cli.main with graphsync from GRAPHSYNC_SRC)
  graphsync.io load + save     the CLI's own reading and writing, no rewrite
  TF import + export           tf.compat.v1.train.import_meta_graph + export_meta_graph

The graph is benchmarks/rewrite_cost.py's tf_keras ResNet-50 at --towers towers (CIFAR10 pattern, with
gradients and train op), exported with tf.compat.v1.train.export_meta_graph.

    python benchmarks/cli_end_to_end.py
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

_LOAD_SAVE = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import graphsync.io as gio
gio.save(gio.load(sys.argv[1]), sys.argv[2])
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
_CLI = "import sys; sys.argv[0] = 'graphsync'; from cli.main import main; main()"


def save_graph(model, towers, path):
    """Builds the graph in a child process (rewrite_cost's builder) and exports it."""
    script = (f"import sys; sys.argv = ['x']; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
              "import rewrite_cost as rc\n"
              f"graph, _ = rc.build({model!r}, {towers})\n"
              f"rc.tf1.train.export_meta_graph({path!r}, graph=graph, clear_devices=False)\n")
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ResNet50")
    parser.add_argument("--towers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    _common.import_tf()
    print(_common.header("CLI end to end on a saved graph", argv))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_common.SOURCE, os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="graphsync-bench-") as work:
        src = os.path.join(work, "towers.meta")
        save_graph(args.model, args.towers, src)
        probe = subprocess.run([sys.executable, "-c", _CLI, "rewrite", "--help"], capture_output=True,
                               text=True, env=env, cwd=work)
        if probe.returncode != 0:
            print("skipped — no `graphsync rewrite` command: " + (probe.stderr.strip().splitlines() or ["?"])[-1])
            return
        commands = {
            "graphsync rewrite": lambda dst: [sys.executable, "-c", _CLI, "rewrite", "-v", src, "-o", dst],
            "graphsync.io load + save": lambda dst: [sys.executable, "-c", _LOAD_SAVE, src, dst],
            "TF import + export": lambda dst: [sys.executable, "-c", _TF_COPY, src, dst],
        }
        times = {name: [] for name in commands}
        stages = []
        for _ in range(args.repeat):
            for name, command in commands.items():
                dst = os.path.join(work, "out.meta")
                t0 = time.perf_counter()
                done = subprocess.run(command(dst), capture_output=True, text=True, env=env, cwd=work)
                times[name].append(time.perf_counter() - t0)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed: {done.stderr.strip()[-500:]}")
                found = re.search(r"loading ([\d.]+)s, rewriting ([\d.]+)s, saving ([\d.]+)s", done.stdout + done.stderr)
                if found:
                    stages.append([float(v) for v in found.groups()])
                os.remove(dst)
        size = os.path.getsize(src)
    base = _common.median(times["graphsync.io load + save"])
    rows = [dict(what=name, s=_common.median(t), lo=min(t), hi=max(t), ratio=_common.median(t) / base)
            for name, t in times.items()]
    print(f"{args.model}, {args.towers} towers, .meta of {size / 1e6:.1f} MB; fresh processes, alternating, "
          f"median of {args.repeat}\n")
    print(_common.table(rows, [("what", "process"), ("s", "wall s"), ("lo", "min"), ("hi", "max"),
                               ("ratio", "÷ graphsync.io load + save")]))
    if stages:
        load, rewrite, save = (_common.median([s[k] for s in stages]) for k in range(3))
        print(f"\nThe CLI's own stage times (-v): loading {load:.2f} s, rewriting {rewrite:.2f} s, saving {save:.2f} s.")
    _common.write_json(args.json, {"times": times, "stages": stages, "bytes": size})


if __name__ == "__main__":
    main()
