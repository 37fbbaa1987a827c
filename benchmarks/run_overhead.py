"""What `graphsync run`'s check before every Session.run costs (graphsync.autosync.patching patches
BaseSession._extend_graph; graphsync.autosync.session_copies): Session.run of a trivial fetch (one scalar
constant, or one no-op target) with the patches installed and without, alternating within each
round, median of the per-round differences; then the check alone (the one dictionary lookup and
version comparison the patch makes before calling TensorFlow's method), timed by itself.

    python benchmarks/run_overhead.py [--rounds 15] [--runs 2000]
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=2000, help="Session.run calls per variant and round")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    tf = _common.import_tf()
    import graphsync
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    print(_common.header("Session.run overhead of graphsync run's check", argv))

    autosync = graphsync.AutoSync(stream=io.StringIO())
    graph = tf.Graph()
    with graph.as_default():
        fetches = {"scalar constant": tf.constant(1.0), "no-op target": tf.no_op()}
    rows, raw = [], {}
    with tf1.Session(graph=graph) as sess:
        for label, fetch in fetches.items():
            per_run = {"python": [], "graphsync run": []}
            for _ in range(args.rounds + 1):                  # the first round warms up, not counted
                for variant in per_run:
                    if variant == "graphsync run":
                        autosync.install()
                    try:
                        sess.run(fetch)                            # the look (once per graph version)
                        t0 = _common.now()
                        for _ in range(args.runs):
                            sess.run(fetch)
                        per_run[variant].append((_common.now() - t0) / args.runs)
                    finally:
                        autosync.uninstall()
            per_run = {name: times[1:] for name, times in per_run.items()}
            extra = [ours - plain for ours, plain in zip(per_run["graphsync run"], per_run["python"])]
            raw[label] = per_run
            rows.append(dict(fetch=label, plain=1e6 * _common.median(per_run["python"]),
                             ours=1e6 * _common.median(per_run["graphsync run"]), extra=1e6 * _common.median(extra),
                             lo=1e6 * min(extra), hi=1e6 * max(extra),
                             ratio=_common.median([o / p for o, p in zip(per_run["graphsync run"],
                                                                          per_run["python"])])))

        copies = autosync._copies                                  # the check the patch makes on every run
        copies.record(sess, graph)
        repeat = 50 * args.runs
        check = min(timeit.repeat(lambda: copies.up_to_date(sess, sess.graph), number=repeat, repeat=7)) / repeat
        empty = min(timeit.repeat(lambda: None, number=repeat, repeat=7)) / repeat
    raw["check"] = {"check": check, "empty call": empty}
    print(f"{args.rounds} rounds × {args.runs} runs per variant, alternating; one session, one graph of 2 ops\n")
    print(_common.table(rows, [("fetch", "Session.run of"), ("plain", "µs / run, python"),
                               ("ours", "µs / run, graphsync run"), ("extra", "extra µs (median of rounds)"),
                               ("lo", "min"), ("hi", "max"), ("ratio", "ratio")]))
    print(f"\nThe check alone (`SessionCopies.up_to_date(session, session.graph)`, best of 7 × {repeat} calls): "
          f"{1e6 * (check - empty):.3f} µs per run over an empty call ({1e6 * check:.3f} µs with it)")
    _common.write_json(args.json, raw)


if __name__ == "__main__":
    main()
