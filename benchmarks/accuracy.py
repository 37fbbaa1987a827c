"""Accuracy of the batch statistics in float32, against float64 computed on the same float32 data:
ordinary data and data with a large offset (x = offset + N(0, 1) per channel, so |mean|/std = offset).

Methods, all over the same 4 towers' activations on 4 logical CPU devices:

  graphsync        a 4-tower graph of FusedBatchNormV3 ops (training) rewritten by
                   graphsync.rewrite_towers(); the mean and (Bessel-corrected) variance its consumers see
  graphsync        the same with rewrite_towers(strategy="allreduce") (CollectiveReduceV2 of float64
  allreduce        [n, n·m, M2 + n·m²]), when the graphsync under test has that option
  graphsync,       4 towers of tf.nn.moments + tf.nn.batch_normalization, rewritten (biased variance)
  moments model
  graphsync allr., the same with strategy="allreduce"
  moments model
  E[x²]−E[x]²      per-device float32 sums of x and x² and counts, summed across devices, then
                   Q/N − (S/N)² clamped at 0, in one graph: Keras' formula, also Horovod's and tensorpack's
  tf_keras sync BN Keras' own layer, tf_keras.layers.BatchNormalization(synchronized=True, momentum=0),
  NHWC             run in training mode under MirroredStrategy on the same 4 devices (one replica per
                   tower): per replica it sums x and x² and counts, all-reduces the three, and takes
                   max(E[x²] − E[x]², 0) in float32 (_sync_calculate_mean_and_var). What it used is read
                   from its moving mean/variance, zeroed before each call (momentum 0 makes the update
                   exactly the batch's statistics), and checked against its output
  tf_keras sync BN the same layer with axis=1 on the same data transposed to NCHW (channels first)
  NCHW axis=1
  Keras 3 sync BN  keras.layers.BatchNormalization(synchronized=True), TensorFlow backend, both layouts
  NHWC / NCHW      (keras/src/backend/tensorflow/nn.py _compute_moments_sync: the same merge); left out
                   when Keras 3 is not installed
  fused, 1 device  FusedBatchNormV3 on the concatenated batch on one device (what graphsync must match)
  moments, 1 dev.  tf.nn.moments on the concatenated batch on one device
  shifted sums     per-device sums of (x − s) and (x − s)², s = tower 0's first example, per channel
                   (a reference for what a shared shift achieves; not a peer)
  Chan, refined    Chan's combination with each tower's float32 mean m̂ corrected by its residual
  tower means      r = Σ(x − m̂) in float64 (m = m̂ + r/n, M2 = Σ(x − m̂)² − r²/n, the corrected two-pass
                   algorithm), spelled out in plain ops: what graphsync's rewrite does on both paths

Errors: variance |v̂ − v| / v and mean |μ̂ − μ| / σ, maximum over channels, median over seeds
(v Bessel-corrected for the methods that report it so, biased otherwise). A table after them sets
Keras' channels-first variance beside its channels-last one.

The recorded run (against a snapshot of HEAD; writes benchmarks/results/accuracy.md and .json;
about 15 s on 2 cores):

    benchmarks/run_all.sh HEAD accuracy

or on the checkout as it is: python benchmarks/accuracy.py
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

tf = _common.import_tf()
tf1 = tf.compat.v1
TOWERS = 4
CONFIG = _common.logical_cpus(tf, TOWERS)

import numpy as np  # noqa: E402

import graphsync  # noqa: E402

with _common.quiet_stderr():
    import tf_keras  # noqa: E402
    try:
        import keras as keras3  # noqa: E402
        if not keras3.__version__.startswith("3") or keras3.backend.backend() != "tensorflow":
            keras3 = None
    except ImportError:
        keras3 = None

# Keras' synchronized batch norm: (module, axis) per row
KERAS = {"tf_keras sync BN, NHWC": ("tf_keras", -1), "tf_keras sync BN, NCHW axis=1": ("tf_keras", 1),
         "Keras 3 sync BN, NHWC": ("keras3", -1), "Keras 3 sync BN, NCHW axis=1": ("keras3", 1)}
METHODS = ["graphsync", "graphsync allreduce", "graphsync, moments model", "graphsync allreduce, moments model",
           "E[x²]−E[x]²", *KERAS, "fused, 1 device", "moments, 1 device", "shifted sums",
           "Chan, refined tower means"]
BESSEL = {"graphsync": True, "graphsync allreduce": True, "fused, 1 device": True}


def graphsync_graph(shape, kind="fused", **options):
    """Four towers of fused (or tf.nn.moments) batch norm, rewritten; returns (graph, placeholders,
    mean, variance) as tower 1's consumers see them."""
    graph = tf.Graph()
    with graph.as_default():
        xs, means, variances = [], [], []
        for i in range(TOWERS):
            with tf.device(f"/cpu:{i}"), tf.name_scope(f"tower_{i}/"):
                x = tf1.placeholder(tf.float32, shape, name="x")
                c = shape[-1]
                if kind == "fused":
                    y, mean, var = tf1.nn.fused_batch_norm(x, tf.ones([c]), tf.zeros([c]), epsilon=1e-3,
                                                           is_training=True)[:3]
                else:
                    mean, var = tf.nn.moments(x, [0, 1, 2])
                    y = tf.nn.batch_normalization(x, mean, var, None, None, 1e-3)
                xs.append(x)
                means.append(tf.identity(mean, name="mean_seen"))
                variances.append(tf.identity(var, name="variance_seen"))
                tf.identity(y, name="y_seen")
        report = graphsync.rewrite_towers(graph, **options)
        assert len(report.layers) == 1, report
    return graph, xs, means[1], variances[1]


def plain_graph(shape):
    """The other in-graph methods; returns (graph, placeholders, {method: (mean, variance)})."""
    graph = tf.Graph()
    out = {}
    with graph.as_default():
        xs, sums, squares, counts, shifted, shifted_sq = [], [], [], [], [], []
        with tf.device("/cpu:0"):
            xs = [tf1.placeholder(tf.float32, shape, name=f"x{i}") for i in range(TOWERS)]
            shift = tf.stop_gradient(xs[0][0, 0, 0])
        for i, x in enumerate(xs):
            with tf.device(f"/cpu:{i}"):
                sums.append(tf.reduce_sum(x, [0, 1, 2]))
                squares.append(tf.reduce_sum(tf.square(x), [0, 1, 2]))
                counts.append(tf.cast(tf.reduce_prod(tf.shape(x)[:3]), tf.float32))
                d = x - shift
                shifted.append(tf.reduce_sum(d, [0, 1, 2]))
                shifted_sq.append(tf.reduce_sum(tf.square(d), [0, 1, 2]))
        refined = []
        for i, x in enumerate(xs):
            with tf.device(f"/cpu:{i}"):
                m_hat = tf.reduce_mean(x, [0, 1, 2])
                d = x - m_hat
                r = tf.cast(tf.reduce_sum(d, [0, 1, 2]), tf.float64)
                q = tf.cast(tf.reduce_sum(tf.square(d), [0, 1, 2]), tf.float64)
                n_t = tf.cast(counts[i], tf.float64)
                refined.append((n_t, tf.cast(m_hat, tf.float64) + r / n_t, q - r * r / n_t))
        with tf.device("/cpu:0"):
            n64 = tf.add_n([t[0] for t in refined])
            mean64 = tf.add_n([t[0] * t[1] for t in refined]) / n64
            m2 = tf.add_n([t[2] + t[0] * tf.square(t[1] - mean64) for t in refined])
            out["Chan, refined tower means"] = (tf.cast(mean64, tf.float32), tf.cast(m2 / n64, tf.float32))
            n = tf.add_n(counts)
            mean = tf.add_n(sums) / n
            out["E[x²]−E[x]²"] = (mean, tf.maximum(tf.add_n(squares) / n - tf.square(mean), 0.0))
            d_mean = tf.add_n(shifted) / n
            out["shifted sums"] = (shift + d_mean, tf.add_n(shifted_sq) / n - tf.square(d_mean))
            whole = tf.concat(xs, 0)
            c = shape[-1]
            _, f_mean, f_var = tf1.nn.fused_batch_norm(whole, tf.ones([c]), tf.zeros([c]), epsilon=1e-3,
                                                       is_training=True)[:3]
            out["fused, 1 device"] = (f_mean, f_var)
            out["moments, 1 device"] = tf.nn.moments(whole, [0, 1, 2])
    return graph, xs, out


def keras_peer(module, shape, axis=-1):
    """A function data → (mean, biased variance) that Keras' own synchronized batch norm
    (`module.layers.BatchNormalization(synchronized=True)`, module tf_keras or Keras 3) used on it,
    in training mode under MirroredStrategy on the 4 devices; axis=1 feeds NCHW (the NHWC data
    transposed). The statistics are read from the moving mean and variance after one call with
    momentum 0, zeroed before it: tf_keras updates v − (v − s)·1 and Keras 3 v·0 + s·1, both exactly s.
    Each call also checks the read statistics against the layer's output (see keras_check)."""
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(TOWERS)])
    _, h, w, c = shape
    with strategy.scope():
        layer = module.layers.BatchNormalization(axis=axis, synchronized=True, momentum=0.0, epsilon=1e-3)
        layer.build((None, h, w, c) if axis == -1 else (None, c, h, w))

    @tf.function
    def step(x):
        return strategy.run(lambda v: layer(v, training=True), args=(x,))

    def local(value):
        return [t.numpy() for t in strategy.experimental_local_results(value)]

    def run(parts):
        if axis == 1:
            parts = [np.ascontiguousarray(p.transpose(0, 3, 1, 2)) for p in parts]
        for v in (layer.moving_mean, layer.moving_variance):
            v.assign(tf.zeros_like(v))
        x = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group]))
        ys = local(step(x))
        means, variances = local(layer.moving_mean), local(layer.moving_variance)
        mean, var = means[0], variances[0]
        same = all(np.array_equal(m, mean) and np.array_equal(v, var) for m, v in zip(means, variances))
        keras_check(parts, ys, mean, var, axis, same)
        return mean, var
    return run


KERAS_CHECK = {"calls": 0, "replicas disagree": 0, "non-finite outputs": 0, "largest output deviation": 0.0}


def keras_check(parts, ys, mean, var, axis, same):
    """That the mean and variance read are those the layer normalized with: its output (γ = 1, β = 0)
    against (x − mean) / sqrt(var + ε) in float64 from the read statistics, in float32 ulps of
    (|x| + |mean|) / σ̂ + |y| (the size of the float32 terms tf.nn.batch_normalization adds); also
    counts NaN/inf outputs and calls whose replicas read different statistics."""
    shape = [1, -1, 1, 1] if axis == 1 else [1, 1, 1, -1]
    m = np.asarray(mean, np.float64).reshape(shape)
    s = np.sqrt(np.asarray(var, np.float64).reshape(shape) + 1e-3)
    for x, y in zip(parts, ys):
        if not np.all(np.isfinite(y)):
            KERAS_CHECK["non-finite outputs"] += 1
            continue
        x = x.astype(np.float64)
        ulp = np.spacing(((np.abs(x) + np.abs(m)) / s + np.abs(y)).astype(np.float32)).astype(np.float64)
        dev = float(np.max(np.abs(y - (x - m) / s) / ulp))
        KERAS_CHECK["largest output deviation"] = max(KERAS_CHECK["largest output deviation"], dev)
    KERAS_CHECK["replicas disagree"] += not same
    KERAS_CHECK["calls"] += 1


def errors(mean, var, parts, bessel):
    whole = np.concatenate(parts).astype(np.float64).reshape(-1, parts[0].shape[-1])
    true_mean = whole.mean(0)
    true_var = whole.var(0)
    n = whole.shape[0]
    want_var = true_var * n / (n - 1) if bessel else true_var
    var_err = np.max(np.abs(np.asarray(var, np.float64) - want_var) / want_var)
    mean_err = np.max(np.abs(np.asarray(mean, np.float64) - true_mean) / np.sqrt(true_var))
    return float(var_err), float(mean_err)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offsets", nargs="+", type=float, default=[0, 1e2, 1e3, 1e4])
    parser.add_argument("--seeds", type=int, default=31)
    parser.add_argument("--shape", nargs=4, type=int, default=[8, 16, 16, 16],
                        help="per-tower activation shape N H W C")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    shape = tuple(args.shape)
    print(_common.header("Accuracy of the statistics, float32 vs float64", argv))

    g_graph, g_xs, g_mean, g_var = graphsync_graph((None,) + shape[1:])
    m_graph, m_xs, m_mean, m_var = graphsync_graph((None,) + shape[1:], kind="moments")
    m_sess = tf1.Session(graph=m_graph, config=CONFIG)
    methods = list(METHODS)
    if "strategy" in inspect.signature(graphsync.rewrite_towers).parameters:
        a_graph, a_xs, a_mean, a_var = graphsync_graph((None,) + shape[1:], strategy="allreduce")
        a_sess = tf1.Session(graph=a_graph, config=CONFIG)
        am_graph, am_xs, am_mean, am_var = graphsync_graph((None,) + shape[1:], kind="moments", strategy="allreduce")
        am_sess = tf1.Session(graph=am_graph, config=CONFIG)
    else:
        methods.remove("graphsync allreduce")
        methods.remove("graphsync allreduce, moments model")
        a_sess = None
    p_graph, p_xs, p_out = plain_graph((None,) + shape[1:])
    modules = {"tf_keras": tf_keras, "keras3": keras3}
    peers = {m: keras_peer(modules[k], shape, axis) for m, (k, axis) in KERAS.items() if modules[k] is not None}
    methods = [m for m in methods if m not in KERAS or m in peers]
    variances = {}  # (method, offset) -> the Keras rows' variances, per seed
    g_sess = tf1.Session(graph=g_graph, config=CONFIG)
    p_sess = tf1.Session(graph=p_graph, config=CONFIG)

    results = {}  # (method, offset) -> list of (var_err, mean_err)
    for offset in args.offsets:
        for seed in range(args.seeds):
            rng = np.random.RandomState(seed)
            parts = [(offset + rng.randn(*shape)).astype(np.float32) for _ in range(TOWERS)]
            got = {"graphsync": g_sess.run([g_mean, g_var], dict(zip(g_xs, parts))),
                   "graphsync, moments model": m_sess.run([m_mean, m_var], dict(zip(m_xs, parts)))}
            got.update(p_sess.run(p_out, dict(zip(p_xs, parts))))
            for method, peer in peers.items():
                got[method] = peer(parts)
                variances.setdefault((method, offset), []).append(got[method][1])
            if a_sess is not None:
                got["graphsync allreduce"] = a_sess.run([a_mean, a_var], dict(zip(a_xs, parts)))
                got["graphsync allreduce, moments model"] = am_sess.run([am_mean, am_var], dict(zip(am_xs, parts)))
            for method in methods:
                mean, var = got[method]
                results.setdefault((method, offset), []).append(
                    errors(mean, var, parts, BESSEL.get(method, False)))

    def med(method, offset, k):
        return _common.median([r[k] for r in results[(method, offset)]])

    n_total = TOWERS * int(np.prod(shape[:3]))
    for k, what in ((0, "variance, relative error |v̂ − v| / v"), (1, "mean, error |μ̂ − μ| / σ")):
        rows = [dict(method=m, **{f"o{o:g}": med(m, o, k) for o in args.offsets}) for m in methods]
        print(f"\n**{what}** ({TOWERS} towers × {shape} float32, N = {n_total} per channel; max over "
              f"{shape[-1]} channels, median of {args.seeds} seeds)\n")
        print(_common.table(rows, [("method", "method \\ \\|mean\\|/std")] +
                            [(f"o{o:g}", f"{o:g}") for o in args.offsets]))

    keras_rows = []
    last, first = "tf_keras sync BN, NHWC", "tf_keras sync BN, NCHW axis=1"
    for o in args.offsets:
        row = dict(offset=f"{o:g}", last=med(last, o, 0), first=med(first, o, 0))
        pairs = zip(variances[(last, o)], variances[(first, o)])
        row["differ"] = f"{sum(not np.array_equal(a, b) for a, b in pairs)} of {args.seeds}"
        row["zero"] = " / ".join(str(sum(int(np.sum(v == 0)) for v in variances[(m, o)])) for m in (last, first))
        if keras3 is not None:
            same = sum(np.array_equal(a, b) for m in ("NHWC", "NCHW axis=1") for a, b in
                       zip(variances[(f"tf_keras sync BN, {m}", o)], variances[(f"Keras 3 sync BN, {m}", o)]))
            row["same"] = f"{same} of {2 * args.seeds}"
        keras_rows.append(row)
    versions = ", ".join(f"{name} {mod.__version__}" for name, mod in (("tf_keras", tf_keras), ("Keras", keras3))
                         if mod is not None)
    print(f"\n**Keras' synchronized batch norm** ({versions}; the layer itself under MirroredStrategy on "
          f"{TOWERS} logical CPUs): tf_keras' variance error channels-last (NHWC, axis=-1) and channels-first "
          f"(NCHW, axis=1, the same data transposed); seeds whose channels-first variance differs from "
          f"channels-last; channel variances that came out negative and were clamped to 0 (of "
          f"{args.seeds * shape[-1]}); seeds × layouts where Keras 3's variance is tf_keras' bit for bit\n")
    print(_common.table(keras_rows, [("offset", "\\|mean\\|/std"), ("last", "NHWC"), ("first", "NCHW"),
                                     ("differ", "NCHW ≠ NHWC"), ("zero", "clamped to 0, NHWC / NCHW"),
                                     ("same", "Keras 3 = tf_keras")]))
    print(f"\nCheck, {KERAS_CHECK['calls']} layer calls: the statistics read reproduce the layer's output to "
          f"within {KERAS_CHECK['largest output deviation']:.2f} float32 ulps of (|x| + |mean|)/σ̂ + |y|; "
          f"non-finite outputs: {KERAS_CHECK['non-finite outputs']}; calls whose replicas read different statistics: "
          f"{KERAS_CHECK['replicas disagree']}.")

    print("\n**Target of issue 11**: variance error ≤ 3e-6 at every |mean|/std ≤ 1e4 (the single-device "
          "fused kernel's own error for comparison)\n")
    rows = []
    for m in [m for m in methods if m.startswith("graphsync")]:
        worst = max(med(m, o, 0) for o in args.offsets if o <= 1e4)
        rows.append(dict(method=m, worst=worst, fused=max(med("fused, 1 device", o, 0) for o in args.offsets
                                                          if o <= 1e4), met="met" if worst <= 3e-6 else "MISSED"))
    print(_common.table(rows, [("method", "method"), ("worst", "largest variance error"),
                               ("fused", "fused, 1 device"), ("met", "≤ 3e-6")]))
    _common.write_json(args.json, {**{f"{m}|{o:g}": v for (m, o), v in results.items()},
                                   "Keras check": KERAS_CHECK})


if __name__ == "__main__":
    main()
