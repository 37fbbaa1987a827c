"""Step overhead: training-step time (and peak memory) of synchronized batch norm ÷ unsynchronized,
on 4 logical CPU devices of one process, for a small ResNet-style and a U-Net-style segmentation model
(benchmarks/models.py), all variants alive in one process and timed in alternating rounds:

  unsynced        the multi-tower graph with fused batch norm (CIFAR10 pattern, per-tower gradients)
  graphsync       the same graph after graphsync.rewrite_towers()  (statistics gathered on /cpu:0)
  graphsync-unrefined  the same without the mean residual that makes the statistics accurate
                  (graphsync.stats.REFINE_LOCAL_MOMENTS = False while building): what accuracy costs
  graphsync-allreduce  … rewrite_towers(strategy="allreduce")  (CollectiveReduceV2, no central device;
                  left out when the graphsync under test has no such option)
  moments         unsynchronized, tf.nn.moments + tf.nn.batch_normalization per tower (unfused)
  graphsync-moments  that graph after graphsync.rewrite_towers()
  byhand          the seed's approach: all towers' activations concatenated on /cpu:0 for tf.nn.moments,
                  per-tower gradients as in the CIFAR10 pattern
  byhand-summed   the same forward, one tf.gradients of the summed loss (colocated with the forward)
  keras           the peer's baseline: tf_keras model, BatchNormalization(synchronized=False),
                  tf.distribute.MirroredStrategy over the same 4 logical CPUs, tf.function train step
  keras-sync      the peer: the same with BatchNormalization(synchronized=True)

`--inter-op 1` measures the *work* instead: one inter-op thread runs every op of every tower one
after another, so a step's time is the sum of its ops' compute and nothing the 2 cores could
overlap or leave idle at a barrier enters the ratio. Each of four real devices would run a quarter
of that work (plus, on the aggregation device, the small merge), so this ratio is the per-device
compute a synchronized step adds; the concurrent figure above adds what lockstep costs when four
towers share two cores. The Keras peer (eager runtime, configured at start-up) is left out there,
and its peak memory column measures that serialized schedule, not a device (use the concurrent run's).

Models: resnet and segnet (32×32, 8 examples per tower) and unet64, the segmentation-sized model
(64×64, 32/64/128 channels, 10 batch norms, 2 examples per tower).

Sessions use ConfigProto(device_count={'CPU': 4}, inter_op=8, intra_op=1): 8 inter-op threads let
the four towers run concurrently, as they would on four devices (with 1–2 threads an unsynchronized
graph runs tower after tower while a synchronized one runs in lockstep, and the comparison measures
that scheduling, not graphsync). The eager runtime for the peer uses the same thread counts. Inputs
are per-device constants (no feeding). Each round runs --steps steps of every variant (rotating
order); ratios are taken within a round, then the median. Besides wall time, the process CPU time
per step is recorded (less disturbed by other jobs on a shared machine).

Peak memory: the TensorFlow CPU allocator's peak during 2 steps minus its bytes in use just before
(tf.config.experimental.get_memory_info('CPU:0'); all logical CPU devices share that allocator), i.e.
the transient memory of a step: activations, gradients, buffers; variables are excluded. With the
towers running concurrently the peak holds every tower's working set at once, as four devices would
each hold their own, so the synchronized ÷ unsynchronized ratio is the per-device ratio. The largest
of 3 such measurements per variant (alternating) is reported.

    python benchmarks/step_overhead.py                      # the recorded run
    python benchmarks/step_overhead.py --rounds 3 --steps 2 # a quick look
"""
from __future__ import annotations

import argparse
import inspect
import os
import time
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")   # the CPU allocator keeps statistics only as a BFC
                                                             # allocator (memory_delta); not the default everywhere

tf = _common.import_tf()
tf1 = tf.compat.v1
TOWERS = 4
INTER_OP = 8   # ≥ 2 per tower: the towers run concurrently, as on separate devices
SESSION_CONFIG = _common.logical_cpus(tf, TOWERS, INTER_OP, allow_soft_placement=False)
tf.config.threading.set_inter_op_parallelism_threads(INTER_OP)
tf.config.threading.set_intra_op_parallelism_threads(1)

import numpy as np  # noqa: E402

with _common.quiet_stderr():
    import tf_keras  # noqa: E402
import graphsync  # noqa: E402
import graphsync.splice.fused_kernels  # noqa: E402  (REFINE_LOCAL_MOMENTS, when the graphsync under test has it)
import graphsync.stats  # noqa: E402
import models  # noqa: E402

GRAPH_VARIANTS = {  # name: (batch norm, gradients, rewrite)
    "unsynced": ("fused", "per-tower", False),
    "graphsync": ("fused", "per-tower", True),
    "graphsync-unrefined": ("fused", "per-tower", True),   # without the mean residual (REFINE_LOCAL_MOMENTS)
    "graphsync-allreduce": ("fused", "per-tower", {"strategy": "allreduce"}),
    "moments": ("moments", "per-tower", False),
    "graphsync-moments": ("moments", "per-tower", True),
    "graphsync-moments-unrefined": ("moments", "per-tower", True),
    "byhand": ("byhand", "per-tower", False),
    "byhand-summed": ("byhand", "summed", False),
}
PEER_VARIANTS = {"keras": False, "keras-sync": True}
RATIOS = [  # (numerator, denominator, what it says)
    ("graphsync", "unsynced", "graphsync ÷ unsynced (target ≤ 1.10)"),
    ("graphsync", "graphsync-unrefined", "graphsync ÷ graphsync without the mean residual (the accuracy's cost)"),
    ("graphsync-allreduce", "unsynced", "graphsync, strategy='allreduce' ÷ unsynced"),
    ("graphsync-moments", "moments", "graphsync on the tf.nn.moments model ÷ its unsynced"),
    ("graphsync-moments", "graphsync-moments-unrefined", "the same ÷ without the mean residual (its accuracy's cost)"),
    ("byhand", "unsynced", "by-hand ÷ unsynced (fused)"),
    ("byhand", "moments", "by-hand ÷ unsynced moments (same unfused ops)"),
    ("byhand-summed", "unsynced", "by-hand, summed-loss gradients ÷ unsynced (fused)"),
    ("keras-sync", "keras", "peer: Keras synchronized=True ÷ synchronized=False"),
    ("graphsync", "keras-sync", "graphsync ÷ peer (absolute step time; < 1 = faster)"),
    ("unsynced", "keras", "unsynced TF1 graph ÷ unsynced Keras/MirroredStrategy (the runtimes' baselines)"),
]


class GraphVariant:
    def __init__(self, arch, name, batches):
        bn, gradients, rewrite = GRAPH_VARIANTS[name]
        unrefined = name.endswith("-unrefined")
        # where the graphsync under test keeps the switch (older ones: fused only; none: KeyError)
        switch = next((m for m in (graphsync.stats, graphsync.splice.fused_kernels) if hasattr(m, "REFINE_LOCAL_MOMENTS")), None)
        if unrefined and (switch is None or (bn == "moments" and switch is not graphsync.stats)):
            raise KeyError(name)
        if unrefined:
            switch.REFINE_LOCAL_MOMENTS = False
        try:
            built = models.build_towers(arch, TOWERS, bn, batches, gradients=gradients, rewrite=rewrite)
        finally:
            if unrefined:
                switch.REFINE_LOCAL_MOMENTS = True
        self.name, self.built = name, built
        self.session = tf1.Session(graph=built["graph"], config=SESSION_CONFIG)
        self.session.run(built["init"])
        self.initial_losses = self.session.run(built["losses"])

    def step(self):
        self.session.run(self.built["train_op"])

    def close(self):
        self.session.close()


_STRATEGY = []


def strategy_4cpu():
    """One MirroredStrategy for the whole process: two strategies in one process hand out the same
    collective instance keys and their all-reduces collide ("Shape mismatch in the collective instance")."""
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(TOWERS)]))
    return _STRATEGY[0]


class PeerVariant:
    def __init__(self, arch, name, batches):
        self.name = name
        strategy = strategy_4cpu()
        with strategy.scope():
            model = models.build_keras(arch, PEER_VARIANTS[name])
            optimizer = tf_keras.optimizers.SGD(0.01)
        xs = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(batches[ctx.replica_id_in_sync_group][0]))
        ts = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(batches[ctx.replica_id_in_sync_group][1]))
        replicas = strategy.num_replicas_in_sync

        def replica_step(x, t):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=logits))
                scaled = loss / replicas
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def train(x, t):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, t)), None)

        self._train = lambda: train(xs, ts).numpy()
        self.model = model
        self.sync_layers = sum(getattr(l, "synchronized", False) for l in model.layers)

    def step(self):
        self._train()

    def close(self):
        pass


def memory_delta(variant, steps):
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    for _ in range(steps):
        variant.step()
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def _count_bn(arch):
    """Batch norms per tower of an architecture (counted by building it once with a stub builder)."""
    class Count:
        n = 0

        def bn(self, x, name):
            Count.n += 1
            return x

        def __getattr__(self, _):
            return lambda *a, **k: a[0]
    models.ARCHITECTURES[arch][0](Count(), None)
    return Count.n


def op_breakdown(variants, names, steps=5):
    """Op compute time per step by op type (FULL_TRACE step stats, median of `steps`), for the
    graph variants `names`: where a synchronized step's extra work goes. Traced in a session with
    one inter-op thread, so that an op's duration is its compute, not time spent preempted by the
    other towers' threads on the 2 cores."""
    import collections
    out = {}
    config = tf1.ConfigProto()
    config.CopyFrom(SESSION_CONFIG)
    config.inter_op_parallelism_threads = 1
    for name in names:
        if name not in variants or not isinstance(variants[name], GraphVariant):
            continue
        built = variants[name].built
        session = tf1.Session(graph=built["graph"], config=config)
        session.run(built["init"])
        for _ in range(2):
            session.run(built["train_op"])
        per_step = []
        for _ in range(steps):
            meta = tf1.RunMetadata()
            session.run(built["train_op"], options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                        run_metadata=meta)
            types = collections.Counter()
            for dev in meta.step_stats.dev_stats:
                for node in dev.node_stats:
                    kind = node.timeline_label.split("(")[0].split("=")[-1].strip() or node.node_name
                    types[kind] += node.op_end_rel_micros - node.op_start_rel_micros
            per_step.append(types)
        session.close()
        kinds = set().union(*per_step)
        out[name] = {k: _common.median([c[k] for c in per_step]) / 1e3 for k in kinds}
    return out


def run_model(arch, batch, rounds, steps, warmup, log, only, op_types=False):
    batches = models.data(arch, TOWERS, batch)
    variants = {}
    if "strategy" not in inspect.signature(graphsync.rewrite_towers).parameters:
        only = only - {"graphsync-allreduce"}
    for name in [v for v in GRAPH_VARIANTS if v in only]:
        t0 = _common.now()
        try:
            variants[name] = GraphVariant(arch, name, batches)
        except KeyError:   # a variant the graphsync under test has no option for
            continue
        log(f"  {arch}/{name}: built in {_common.now() - t0:.1f} s, {variants[name].built['ops']} ops")
    for name in [v for v in PEER_VARIANTS if v in only]:
        variants[name] = PeerVariant(arch, name, batches)
    n_layers = _count_bn(arch)
    for name in ("graphsync", "graphsync-allreduce", "graphsync-moments"):
        if name in variants:
            rewritten = variants[name].built["report"]
            assert len(rewritten.layers) == n_layers, rewritten.summary
    if "keras-sync" in variants:
        assert variants["keras-sync"].sync_layers == n_layers

    # The synchronized graphs compute the same thing at step 0: graphsync == by hand.
    def loss_gap(a, b):
        if a not in variants or b not in variants:
            return float("nan")
        return float(np.max(np.abs(np.subtract(variants[a].initial_losses, variants[b].initial_losses))))
    agree = {name: loss_gap(name, "graphsync")
             for name in ("byhand", "byhand-summed", "graphsync-moments", "graphsync-allreduce")}
    differs = loss_gap("unsynced", "graphsync")

    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name].step()
    times = {name: [] for name in names}
    cpu = {name: [] for name in names}   # process CPU time per step: less disturbed by other jobs
    memory = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            t0, c0 = _common.now(), time.process_time()
            for _ in range(steps):
                variants[name].step()
            times[name].append((_common.now() - t0) / steps)
            cpu[name].append((time.process_time() - c0) / steps)
        log(f"  {arch} round {r + 1}/{rounds}: " + ", ".join(f"{n} {1e3 * times[n][-1]:.0f}" for n in names))
    for _ in range(3):
        for name in names:
            memory[name].append(memory_delta(variants[name], 2))
    breakdown = op_breakdown(variants, ("unsynced", "graphsync")) if op_types else None
    for v in variants.values():
        v.close()

    rows = []
    for name in names:
        rows.append(dict(variant=name, step_ms=1e3 * _common.median(times[name]),
                         min_ms=1e3 * min(times[name]), max_ms=1e3 * max(times[name]),
                         cpu_ms=1e3 * _common.median(cpu[name]),
                         peak_mb=max(memory[name]) / 2**20,
                         ops=variants[name].built["ops"] if name in GRAPH_VARIANTS else ""))
    ratios = []
    for num, den, what in RATIOS:
        if num not in times or den not in times:
            continue
        per_round = [a / b for a, b in zip(times[num], times[den])]
        cpu_ratio = _common.median([a / b for a, b in zip(cpu[num], cpu[den])])
        ratios.append(dict(ratio=what, time=_common.median(per_round), lo=min(per_round), hi=max(per_round),
                           cpu=cpu_ratio,
                           memory=max(memory[num]) / max(memory[den]) if max(memory[den]) else float("nan")))
    return dict(arch=arch, layers=n_layers, batch=batch, rows=rows, ratios=ratios, times=times, cpu=cpu,
                memory=memory,
                loss_agreement=agree, unsynced_vs_synced_loss=differs, breakdown=breakdown)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet", "segnet", "unet64"])
    parser.add_argument("--batch", type=int, help="examples per tower (default: 8; 2 for unet64)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=3, help="steps per variant per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(GRAPH_VARIANTS) + list(PEER_VARIANTS),
                        help="a subset of the variants (default: all)")
    parser.add_argument("--op-types", action="store_true",
                        help="also break the op compute time of unsynced and graphsync steps down by op type")
    parser.add_argument("--inter-op", type=int, default=INTER_OP,
                        help=f"inter-op threads of the graph sessions (default {INTER_OP}: towers concurrent; "
                             "1: every op in turn, the work ratio; leaves out the Keras peer)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.inter_op != INTER_OP:
        SESSION_CONFIG.inter_op_parallelism_threads = args.inter_op
        args.variants = [v for v in args.variants if v not in PEER_VARIANTS]

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    print(_common.header("Step overhead, 4 logical CPU devices" + (", one inter-op thread (the work a step adds)" if args.inter_op == 1 else ""), argv))
    results = []
    for arch in args.models:
        res = run_model(arch, args.batch or (2 if arch == "unet64" else 8), args.rounds, args.steps, args.warmup, log, set(args.variants),
                        args.op_types)
        results.append(res)
        print(f"\n**{arch}** ({res['layers']} batch norms per tower, {TOWERS} towers × {res['batch']} examples of "
              f"{models.input_size(arch)}×{models.input_size(arch)}×3; median of {args.rounds} rounds × {args.steps} steps)\n")
        print(_common.table(res["rows"], [("variant", "variant"), ("step_ms", "step ms (median)"),
                                          ("min_ms", "min"), ("max_ms", "max"),
                                          ("cpu_ms", "CPU ms / step (median)"),
                                          ("peak_mb", "step peak MiB"), ("ops", "graph ops")]))
        print()
        print(_common.table(res["ratios"], [("ratio", "ratio"), ("time", "step time (median of rounds)"),
                                            ("lo", "min"), ("hi", "max"),
                                            ("cpu", "CPU time (median of rounds)"), ("memory", "peak memory")]))
        agreement = {k: v for k, v in res["loss_agreement"].items() if v == v}   # NaN: variant not run
        names = {"byhand": "by-hand", "byhand-summed": "summed-gradient by-hand",
                 "graphsync-moments": "graphsync on the moments model", "graphsync-allreduce": "allreduce"}
        print("\nSanity: initial tower losses, max |Δ| against the variant they must equal: "
              + ", ".join(f"{names[k]} {v:.1e}" for k, v in agreement.items() if k in names)
              + f"; unsynced vs graphsync {res['unsynced_vs_synced_loss']:.1e} (they must differ).")
        if res["breakdown"] and len(res["breakdown"]) == 2:
            base, synced = res["breakdown"]["unsynced"], res["breakdown"]["graphsync"]
            kinds = sorted(set(base) | set(synced), key=lambda k: -abs(synced.get(k, 0) - base.get(k, 0)))[:12]
            kinds.sort(key=lambda k: -(synced.get(k, 0) - base.get(k, 0)))
            rows = [dict(op=k, unsynced=base.get(k, 0.0), graphsync=synced.get(k, 0.0),
                         delta=synced.get(k, 0.0) - base.get(k, 0.0)) for k in kinds]
            rows.append(dict(op="all ops", unsynced=sum(base.values()), graphsync=sum(synced.values()),
                             delta=sum(synced.values()) - sum(base.values())))
            print("\nOp compute time per step by op type, ms summed over the 4 devices (FULL_TRACE step stats, "
                  "median of 5 steps, traced with 1 inter-op thread; the 12 largest changes). Wall time is not their "
                  "sum: 4 devices share 2 cores, and each synchronized layer is a barrier across towers.\n")
            print(_common.table(rows, [("op", "op type"), ("unsynced", "unsynced ms"),
                                       ("graphsync", "graphsync ms"), ("delta", "Δ ms")]))
    _common.write_json(args.json, results)


if __name__ == "__main__":
    main()
