"""Memory: peak per-step memory per device of the original multi-tower graph, the synchronized one,
and the synchronized one with recompute, step time beside it.

  original    the multi-tower graph with fused batch norm (CIFAR10 pattern, per-tower gradients)
  synced      after graphsync.rewrite_towers()
  recompute   after graphsync.rewrite_towers(recompute=True): each layer's output and activation
  segments    after graphsync.rewrite_towers(recompute="segments"): whole forward segments

Models (benchmarks/models.py): unet64, the segmentation U-Net (64×64, 10 batch norms) upsampling by
nearest-neighbour resizing; unet64t, the same U-Net upsampling by stride-2 transposed convolutions
(a `Conv2DBackpropInput` op in the forward, issue 52); and deeplab, a DeepLab-like ResNet backbone
at output stride 4 with an ASPP-like head (64×64, 12 batch norms); 4 towers × 2 examples, one
logical CPU device per tower, 8 inter-op threads so that the towers run concurrently, as on four
devices.

Bit-identity: before the timed rounds, every variant starts from the same initial values (seeded
initializers) and trains --identity-steps steps; every variable (weights and moving averages) of the
recompute variants must equal the synchronized step's bit for bit, and the synchronized step must
equal itself run again (else the comparison would say nothing). Reported per model; the script exits
with status 1 after writing its output when a recompute variant differs.

What a GPU user would see: activation memory, not CPU kernel scratch space. Without oneDNN, CPU
convolutions allocate im2col workspaces about 9× their input that dominate the peak; this script
therefore sets TF_ENABLE_ONEDNN_OPTS=1 (oneDNN on any x86-64 CPU) and TF_CPU_ALLOCATOR_USE_BFC=true
(the CPU allocator keeps statistics only as a BFC allocator) unless they are set already.

Peak: the CPU allocator's peak during one step minus its bytes in use before it
(tf.config.experimental.get_memory_info; the logical devices share that allocator, and the towers
run concurrently, so the per-device peak is the step's peak over the number of towers). Peaks vary
with the towers' interleaving: variants alternate, every round measures each once, medians reported.
Step time: the median over the rounds of the mean of --steps steps.

--sweep B…: the U-Nets' peaks (--sweep-models) also at these per-device batches, a straight line
fitted per model and variant (peak = fixed + per-example × batch), the examples per device each
variant fits in the budget where the original fits --budget-examples, and with --plot PATH the
largest per-device batch that fits each memory budget, for the four variants, one panel per U-Net.

    python benchmarks/memory.py --plot docs/memory.png --json benchmarks/results/memory.json   # recorded
    python benchmarks/memory.py --models unet64t --rounds 3 --sweep                            # a quick look
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

tf = _common.import_tf()
tf1 = tf.compat.v1
TOWERS = 4
INTER_OP = 8
SESSION_CONFIG = _common.logical_cpus(tf, TOWERS, INTER_OP, allow_soft_placement=False)

import numpy as np  # noqa: E402

import graphsync  # noqa: E402
import models  # noqa: E402

VARIANTS = {"original": False, "synced": True, "recompute": {"recompute": True},
            "segments": {"recompute": "segments"}}
MiB = 2.0 ** 20


class Variant:
    def __init__(self, arch, name, batches):
        with _common.quiet_stderr():
            self.built = models.build_towers(arch, TOWERS, "fused", batches, rewrite=VARIANTS[name])
        self.name = name
        self.session = tf1.Session(graph=self.built["graph"], config=SESSION_CONFIG)
        self.session.run(self.built["init"])

    def step(self):
        self.session.run(self.built["train_op"])

    def measure(self, steps):
        """(peak bytes of one step above what was in use before, seconds per step over `steps`)."""
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        self.step()
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
        t0 = _common.now()
        for _ in range(steps):
            self.step()
        return peak, (_common.now() - t0) / steps

    def trained(self, steps):
        """Every variable by name after `steps` steps from the initial values, in a session of its
        own (the seeded initializers draw the same values only on a session's first run)."""
        graph = self.built["graph"]
        variables = graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
        with tf1.Session(graph=graph, config=SESSION_CONFIG) as session:
            session.run(self.built["init"])
            for _ in range(steps):
                session.run(self.built["train_op"])
            return dict(zip([v.op.name for v in variables], session.run(variables)))

    def close(self):
        self.session.close()


def compare(reference, values):
    """(bit-identical, max |difference|) of `values` against `reference`, variable by variable."""
    same, worst = True, 0.0
    for name, ref in reference.items():
        got = values.get(name)
        if got is None or got.shape != ref.shape:
            return False, float("inf")
        if got.tobytes() != ref.tobytes():
            same = False
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - ref))))
    return same, worst


def identity(variants, steps):
    """The recompute variants against the synchronized step (module docstring), and the
    synchronized step against itself."""
    synced = variants["synced"].trained(steps)
    out = {"synced_again": compare(synced, variants["synced"].trained(steps))}
    for name in ("recompute", "segments"):
        out[name] = compare(synced, variants[name].trained(steps))
    return {name: dict(identical=same, max_abs_diff=worst) for name, (same, worst) in out.items()}


def run(arch, batch, rounds, steps, warmup, log, identity_steps=0):
    batches = models.data(arch, TOWERS, batch)
    variants = {name: Variant(arch, name, batches) for name in VARIANTS}
    report = variants["segments"].built["report"]
    checked = identity(variants, identity_steps) if identity_steps else None
    if checked:
        log(f"  {arch} ×{batch} after {identity_steps} steps, bit-identical to synced: " +
            ", ".join(f"{n} {'yes' if c['identical'] else 'NO (max |Δ| %.3g)' % c['max_abs_diff']}"
                      for n, c in checked.items()))
    for v in variants.values():
        for _ in range(warmup):
            v.step()
    peaks = {n: [] for n in variants}
    times = {n: [] for n in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            peak, seconds = variants[name].measure(steps)
            peaks[name].append(peak / TOWERS)
            times[name].append(seconds)
        log(f"  {arch} ×{batch} round {r + 1}/{rounds}: " +
            ", ".join(f"{n} {peaks[n][-1] / MiB:.1f} MiB {1e3 * times[n][-1]:.0f} ms" for n in names))
    for v in variants.values():
        v.close()
    row = dict(model=arch, batch=batch, layers=len(report.layers), recomputed=report.recomputed)
    if checked:
        row["identity_steps"] = identity_steps
        row["identity"] = checked
        row["bit_identical"] = " / ".join("yes" if checked[n]["identical"] else
                                          f"NO ({checked[n]['max_abs_diff']:.2g})"
                                          for n in ("recompute", "segments", "synced_again"))
    for n in names:
        row[f"{n}_mib"] = _common.median(peaks[n]) / MiB
        row[f"{n}_ms"] = 1e3 * _common.median(times[n])
        row[f"{n}_vs_original"] = _common.median([a / b for a, b in zip(peaks[n], peaks["original"])])
        row[f"step_{n}_vs_synced"] = _common.median([a / b for a, b in zip(times[n], times["synced"])])
    row["step_synced_vs_original"] = _common.median([a / b for a, b in zip(times["synced"], times["original"])])
    row["peaks"] = {n: [p / MiB for p in peaks[n]] for n in names}
    row["times_ms"] = {n: [1e3 * t for t in times[n]] for n in names}
    return row


def fit(sweep_rows):
    """Per variant, (fixed MiB, MiB per example) of a least-squares line through the sweep's peaks."""
    lines = {}
    for n in VARIANTS:
        b = np.array([r["batch"] for r in sweep_rows], float)
        p = np.array([r[f"{n}_mib"] for r in sweep_rows], float)
        slope, fixed = np.polyfit(b, p, 1)
        lines[n] = (float(fixed), float(slope))
    return lines


def largest_batch(line, budgets):
    """The largest per-device batch whose fitted peak stays within each budget."""
    fixed, slope = line
    return np.maximum(np.floor((np.asarray(budgets) - fixed) / slope), 0)


TITLES = {"unet64": "U-Net 64×64, upsampling by resizing",
          "unet64t": "U-Net 64×64, upsampling by transposed convolution"}


def plot(path, lines, sweeps):
    """One panel per swept model: the largest per-device batch within each budget, per variant."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = {"original": "original (unsynchronized)", "synced": "synchronized",
              "recompute": "synchronized, recompute=True", "segments": 'synchronized, recompute="segments"'}
    top = max(r["original_mib"] for rows in sweeps.values() for r in rows) * 2.2
    budgets = np.linspace(0, top, 400)
    archs = list(sweeps)
    fig, axes = plt.subplots(1, len(archs), figsize=(5.2 * len(archs), 3.9), dpi=110, sharey=True,
                             squeeze=False)
    for ax, arch in zip(axes[0], archs):
        for n, style in zip(VARIANTS, ("-", "--", ":", "-")):
            ax.step(budgets, largest_batch(lines[arch][n], budgets), where="post", linestyle=style,
                    linewidth=2.2 if n == "segments" else 1.4, label=labels[n])
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("memory budget per device (MiB)")
        ax.set_title(TITLES.get(arch, arch), fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("largest batch per device")
    axes[0][0].legend(frameon=False, fontsize=8)
    fig.suptitle("4 towers, fused batch norms; MiB of activations, gradients and buffers "
                 "(benchmarks/memory.py)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["unet64", "unet64t", "deeplab"])
    parser.add_argument("--batch", type=int, default=2, help="examples per tower")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sweep", nargs="*", type=int, default=[1, 4],
                        help="more batches of --sweep-models for the fitted line and the plot (with --batch)")
    parser.add_argument("--sweep-models", nargs="*", default=["unet64", "unet64t"],
                        help="the models swept (those also in --models)")
    parser.add_argument("--identity-steps", type=int, default=3,
                        help="steps trained before comparing every variable bit for bit (0: no check)")
    parser.add_argument("--plot", metavar="PATH", help="write the largest-batch-per-budget plot here")
    parser.add_argument("--budget-examples", type=int, default=4,
                        help="the budget: the original's fitted peak at this many examples per device")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    def log(line):
        print(line, file=sys.stderr, flush=True)

    started = time.time()
    rows = [run(arch, args.batch, args.rounds, args.steps, args.warmup, log, args.identity_steps)
            for arch in args.models]
    sweeps = {}
    if args.sweep:
        for arch in [a for a in args.sweep_models if a in args.models]:
            sweeps[arch] = [r for r in rows if r["model"] == arch]
            sweeps[arch] += [run(arch, b, max(3, args.rounds // 2), 1, 1, log)
                             for b in args.sweep if b != args.batch]
            sweeps[arch].sort(key=lambda r: r["batch"])
    print(_common.header("Peak memory per device with recompute", argv))
    print(f"TF_ENABLE_ONEDNN_OPTS={os.environ['TF_ENABLE_ONEDNN_OPTS']}, "
          f"TF_CPU_ALLOCATOR_USE_BFC={os.environ['TF_CPU_ALLOCATOR_USE_BFC']}; {TOWERS} towers on {TOWERS} "
          f"logical CPU devices, {INTER_OP} inter-op threads; medians of {args.rounds} alternating rounds.\n")
    print(_common.table(rows, [("model", "model"), ("batch", "per device"), ("layers", "batch norms"),
                               ("original_mib", "original MiB"), ("synced_mib", "synced MiB"),
                               ("recompute_mib", "recompute MiB"), ("segments_mib", "segments MiB"),
                               ("synced_vs_original", "synced ÷ original"),
                               ("recompute_vs_original", "recompute ÷ original"),
                               ("segments_vs_original", "segments ÷ original")]))
    if args.identity_steps:
        print(f"\nBit-identical to the synchronized step, every variable after {args.identity_steps} steps "
              "(recompute / segments / synchronized run again):\n")
        print(_common.table(rows, [("model", "model"), ("recomputed", "tensors recomputed (segments)"),
                                   ("bit_identical", "recompute / segments / synced again")]))
    print()
    print(_common.table(rows, [("model", "model"), ("original_ms", "original ms"), ("synced_ms", "synced ms"),
                               ("recompute_ms", "recompute ms"), ("segments_ms", "segments ms"),
                               ("step_synced_vs_original", "step synced ÷ original"),
                               ("step_recompute_vs_synced", "step recompute ÷ synced"),
                               ("step_segments_vs_synced", "step segments ÷ synced")]))
    lines = {arch: fit(sweep) for arch, sweep in sweeps.items() if len(sweep) >= 2}
    for arch, line in lines.items():
        print(f"\n{arch}, peak per device = fixed + per example × batch (least squares over batches "
              f"{', '.join(str(r['batch']) for r in sweeps[arch])}):\n")
        budget = line["original"][0] + line["original"][1] * args.budget_examples
        print(_common.table([dict(variant=n, fixed=f, per_example=s, fits=int(largest_batch((f, s), [budget])[0]))
                             for n, (f, s) in line.items()],
                            [("variant", "variant"), ("fixed", "fixed MiB"), ("per_example", "MiB per example"),
                             ("fits", f"examples per device in {budget:.1f} MiB")]))
    if lines:
        print(f"\n(the budget: the original's fitted peak at {args.budget_examples} examples per device)")
        if args.plot:
            plot(args.plot, lines, {arch: sweeps[arch] for arch in lines})
            print(f"\nplot: {args.plot}")
    print(f"\n({time.time() - started:.0f} s)")
    _common.write_json(args.json, dict(rows=rows, sweep=sweeps, lines=lines, argv=argv or sys.argv[1:]))
    different = [f"{r['model']} {n}" for r in rows for n in ("recompute", "segments")
                 if "identity" in r and not r["identity"][n]["identical"]]
    if different:
        log("not bit-identical to the synchronized step: " + ", ".join(different))
        sys.exit(1)


if __name__ == "__main__":
    main()
