"""Variance accuracy of statistics the rule synchronizes (sums over the towers, graphsync/plan/reductions.py)
against those a form synchronizes (one exchange of n, m, M2, merged in float64) and one device.

Float32, 4 towers × 8 examples of 8×8 pixels × 16 channels, x = offset + N(0, 1), so |μ|/σ = offset;
a pixel mask (70 % kept) for weighted moments. Error: max over channels of |σ̂² − σ²| / σ², σ² in
float64 on the concatenated batch, median over 5 seeds. Each statistic normalizes x and a shared γ
scales the result, so that it flows back into the model (a batch statistic, not a terminal one).

    statistic                   path
    tf.nn.weighted_moments      its form (graphsync/match/weighted.py; dynamic batch)
    tf.nn.weighted_moments      the rule (a static batch: TensorFlow folds zeros_like(x), no form
                                matches): Σw·x, Σw, Σw·(x − μ)² summed over towers
    E[(x − m)²] by hand         its form (graphsync/match/handwritten.py)
    E[(x − m)²] by hand         the rule alone (the handwritten and moments forms switched off)
    tf.nn.moments               its form
    each                        one device on the concatenated batch, float32

    python benchmarks/rule_accuracy.py
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

tf = _common.import_tf()
tf1 = tf.compat.v1
import numpy as np  # noqa: E402

import graphsync  # noqa: E402
import graphsync.match as match  # noqa: E402

TOWERS, PER_TOWER, PIXELS, CHANNELS = 4, 8, 8, 16


def weighted(x, w):
    return tf.nn.weighted_moments(x, [0, 1, 2], w)


def by_hand(x, w):
    m = tf.reduce_mean(x, [0, 1, 2])
    return m, tf.reduce_mean(tf.square(x - m), [0, 1, 2])


def nn_moments(x, w):
    return tf.nn.moments(x, [0, 1, 2])


def variance(statistic, x, w, towers, forms=None, static=False):
    """Tower 0's variance as its readers see it (after the rewrite when towers > 1)."""
    graph = tf.Graph()
    per = len(x) // towers
    with graph.as_default():
        gamma, feed, seen = None, {}, None
        for i in range(towers):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"):
                batch = per if static else None
                xs = tf1.placeholder(tf.float32, [batch, PIXELS, PIXELS, CHANNELS])
                ws = tf1.placeholder(tf.float32, [batch, PIXELS, PIXELS, 1])
                mean, var = statistic(xs, ws)
                gamma = gamma if gamma is not None else tf1.get_variable("gamma", [CHANNELS],
                                                                         initializer=tf1.ones_initializer())
                tf.reduce_sum(tf.square((xs - mean) * tf.math.rsqrt(var + 1e-3) * gamma), name="loss")
                seen = seen if seen is not None else tf.identity(var)
                feed[xs], feed[ws] = x[i * per:(i + 1) * per], w[i * per:(i + 1) * per]
        if towers > 1:
            saved, match.FORMS = match.FORMS, forms if forms is not None else match.FORMS
            try:
                graphsync.rewrite_towers(graph)
            finally:
                match.FORMS = saved
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph, config=tf1.ConfigProto(device_count={"CPU": TOWERS})) as session:
        session.run(init)
        return session.run(seen, feed)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offsets", type=float, nargs="+", default=[1e2, 1e3, 1e4])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rule_only = tuple(f for f in match.FORMS if f.__name__.rsplit(".", 1)[-1] not in ("handwritten", "moments"))
    cases = [("tf.nn.weighted_moments", "its form", weighted, TOWERS, None),
             ("tf.nn.weighted_moments", "the rule (static batch)", weighted, TOWERS, None, True),
             ("tf.nn.weighted_moments", "one device", weighted, 1, None),
             ("E[(x − m)²] by hand", "its form", by_hand, TOWERS, None),
             ("E[(x − m)²] by hand", "the rule alone", by_hand, TOWERS, rule_only),
             ("E[(x − m)²] by hand", "one device", by_hand, 1, None),
             ("tf.nn.moments", "its form", nn_moments, TOWERS, None)]
    rows = [{"statistic": s, "path": p} for s, p, *_ in cases]
    for offset in args.offsets:
        errors = [[] for _ in cases]
        for seed in range(args.seeds):
            r = np.random.RandomState(seed)
            x = (offset + r.randn(TOWERS * PER_TOWER, PIXELS, PIXELS, CHANNELS)).astype(np.float32)
            mask = (r.rand(TOWERS * PER_TOWER, PIXELS, PIXELS, 1) > 0.3).astype(np.float32)
            for k, (_, _, statistic, towers, forms, *static) in enumerate(cases):
                w = mask if statistic is weighted else np.ones_like(mask)
                x64, w64 = x.astype(np.float64), w.astype(np.float64)
                mu = (w64 * x64).sum((0, 1, 2)) / w64.sum((0, 1, 2))
                true = (w64 * (x64 - mu) ** 2).sum((0, 1, 2)) / w64.sum((0, 1, 2))
                got = variance(statistic, x, w, towers, forms, *static)
                errors[k].append(float(np.max(np.abs(got - true) / true)))
        for row, errs in zip(rows, errors):
            row[f"{offset:g}"] = _common.median(errs)
    print(_common.header("Variance accuracy: the rule's sums, the forms' merge, one device", argv))
    print(_common.table(rows, [("statistic", "statistic"), ("path", "path")] +
                        [(f"{o:g}", f"μ/σ = {o:g}") for o in args.offsets]))
    _common.write_json(args.json, rows)


if __name__ == "__main__":
    main()
