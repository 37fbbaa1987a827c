"""`graphsync run` start-up: what running a script under `graphsync run` costs over `python`, each a
fresh process, alternating, median of --repeat runs:

  trivial script          print("hi"): the shell (click, the command modules, the import hook)
  TensorFlow script       imports TensorFlow and creates one session on a graph without towers:
                          + the patches installed after the import and one look at the graph

    python benchmarks/run_startup.py
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

_TRIVIAL = 'print("hi")\n'
_TENSORFLOW = """import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_eager_execution()
with tf.Graph().as_default():
    y = tf.nn.relu(tf.constant([1.0, -1.0]))
    with tf1.Session() as sess:
        sess.run(y)
"""
_CLI = "import sys; sys.argv[0] = 'graphsync'; from cli.main import main; main()"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    print(_common.header("graphsync run start-up", argv))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_common.SOURCE, os.environ.get("PYTHONPATH", "")]))
    rows, raw = [], {}
    with tempfile.TemporaryDirectory(prefix="graphsync-bench-") as work:
        for label, text, repeat in (("trivial script", _TRIVIAL, args.repeat),
                                    ("TensorFlow script", _TENSORFLOW, max(3, args.repeat // 4))):
            script = os.path.join(work, "script.py")
            with open(script, "w") as f:
                f.write(text)
            commands = {"python": [sys.executable, script],
                        "graphsync run": [sys.executable, "-c", _CLI, "run", script]}
            times = {name: [] for name in commands}
            for _ in range(repeat + 1):          # the first round warms the file cache, not counted
                for name, command in commands.items():
                    t0 = time.perf_counter()
                    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work)
                    elapsed = time.perf_counter() - t0
                    if done.returncode != 0:
                        raise SystemExit(f"{label}, {name} failed: {done.stderr.strip()[-500:]}")
                    times[name].append(elapsed)
            times = {name: t[1:] for name, t in times.items()}
            raw[label] = times
            base = _common.median(times["python"])
            for name, t in times.items():
                rows.append(dict(script=label, what=name, ms=1e3 * _common.median(t), lo=1e3 * min(t),
                                 extra=1e3 * (_common.median(t) - base)))
    print(f"fresh processes, alternating, median of {args.repeat} (TensorFlow script: {max(3, args.repeat // 4)})\n")
    print(_common.table(rows, [("script", "script"), ("what", "started with"), ("ms", "wall ms"), ("lo", "min"),
                               ("extra", "ms over python")]))
    _common.write_json(args.json, raw)


if __name__ == "__main__":
    main()
