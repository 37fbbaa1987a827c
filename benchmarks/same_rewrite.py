"""Whether two versions of graphsync write the same rewritten graphs: each bundled fixture rewritten
by `graphsync rewrite` of both snapshots (benchmarks/snapshot.sh), the NodeDefs compared with
graphsync's own node attributes (`_graphsync_*`, which no kernel reads) and the uid that ends a
called function's name left out. Identical NodeDefs run the same step: the way to show that a
change to the code's structure left the step time as it was, without timing noise (graphsync's
unread marks, `…/statistics_read`, never run).

    benchmarks/snapshot.sh bb1a2e3 /tmp/gs-before && benchmarks/snapshot.sh HEAD /tmp/gs-after
    python benchmarks/same_rewrite.py /tmp/gs-before /tmp/gs-after
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
CASES = [("cifar10_2towers.meta", []), ("cifar10_4towers.meta", []),
         ("cifar10_4towers.meta", ["--strategy", "allreduce"]), ("moments_2towers.meta", []),
         ("moments_2towers.meta", ["--recompute", "segments"]), ("cifar10_2towers.meta", ["--recompute", "layers"]),
         ("forward_2towers.pb", [])]


def nodes(path: str) -> dict:
    """name → serialized NodeDef, graphsync's own attributes left out."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".meta"):
        meta = meta_graph_pb2.MetaGraphDef()
        meta.ParseFromString(data)
        graph = meta.graph_def
    else:
        graph = graph_pb2.GraphDef()
        graph.ParseFromString(data)
    found = {}
    for node in graph.node:
        for key in [k for k in node.attr if k.startswith("_graphsync")]:
            del node.attr[key]
        for value in node.attr.values():   # a traced body's name ends in a process-wide uid
            if value.HasField("func"):
                value.func.name = re.sub(r"_\d+$", "", value.func.name)
        found[node.name] = node.SerializeToString(deterministic=True)
    return found


def rewrite(snapshot: str, fixture: str, extra: list, out: str) -> None:
    """`graphsync rewrite` as `snapshot` holds it (run from there, so that its packages load)."""
    done = subprocess.run([sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())",
                           "rewrite", os.path.join(FIXTURES, fixture), "-o", out, *extra],
                          cwd=snapshot, env=dict(os.environ, PYTHONPATH=snapshot), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{snapshot}: rewrite {fixture} {' '.join(extra)} failed: {done.stderr.strip()[-400:]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    differing_cases = 0
    with tempfile.TemporaryDirectory() as scratch:
        for k, (fixture, extra) in enumerate(CASES):
            graphs = []
            for side, snapshot in (("before", args.before), ("after", args.after)):
                out = os.path.join(scratch, f"{k}-{side}{os.path.splitext(fixture)[1]}")
                rewrite(os.path.abspath(snapshot), fixture, extra, out)
                graphs.append(nodes(out))
            before, after = graphs
            differing = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
            differing_cases += bool(differing)
            print(f"| {fixture} {' '.join(extra)} | {len(before)} | {len(after)} | {len(differing)} "
                  f"{', '.join(differing[:3])} |")
    return 1 if differing_cases else 0


if __name__ == "__main__":
    sys.exit(main())
