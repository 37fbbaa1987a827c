"""Traffic: bytes crossing devices per training step, per batch-norm layer, read from TensorFlow's own
partition graphs (RunOptions(output_partition_graphs=True)): every _Send node is one tensor crossing
from one device to another; its size is the shape × dtype of the tensor it sends, taken from the step
stats (FULL_TRACE) of the node that produced it.

Models and variants as in step_overhead.py (4 towers on /cpu:0…3, aggregation on /cpu:0). With a static
batch size grappler folds the per-tower counts into constants, so only μ/σ²-type vectors cross; the
"dynamic batch" variants (inputs fed to placeholders of unknown batch size, as most input pipelines
give) show the count crossing too. Empty tensors (control edges crossing devices) are counted
apart from data tensors. The batch
norm's own traffic is the difference to the unsynchronized graph of the same structure:
graphsync − unsynced (fused), by-hand − moments (unfused, per tower).

strategy="allreduce" (when the graphsync under test has it) exchanges through CollectiveReduceV2, which
sends no _Send/_Recv: its payload (the collective's input, per tower) is read from the step stats; a
ring all-reduce over T devices moves 2(T−1)/T of the payload per device.

Expected for graphsync, per layer and remote tower (tower 0 shares /cpu:0 with the aggregation):
forward up n, m, M2 (2C+1 values), down μ, σ² (2C, +N); backward up Σg, Σg·x̂ (2C), down their sums (2C).

    python benchmarks/traffic.py
"""
from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

tf = _common.import_tf()
tf1 = tf.compat.v1
import numpy as np  # noqa: E402

import graphsync  # noqa: E402
import models  # noqa: E402

TOWERS = 4
CONFIG = tf1.ConfigProto(device_count={"CPU": TOWERS}, inter_op_parallelism_threads=2,
                         intra_op_parallelism_threads=1)
VARIANTS = {  # name: (batch norm, gradients, rewrite, dynamic batch size)
    "unsynced": ("fused", "per-tower", False, False),
    "graphsync": ("fused", "per-tower", True, False),
    "graphsync-allreduce": ("fused", "per-tower", {"strategy": "allreduce"}, False),
    "unsynced, dynamic batch": ("fused", "per-tower", False, True),
    "graphsync, dynamic batch": ("fused", "per-tower", True, True),
    "moments": ("moments", "per-tower", False, False),
    "graphsync-moments": ("moments", "per-tower", True, False),
    "byhand": ("byhand", "per-tower", False, False),
    "byhand-summed": ("byhand", "summed", False, False)}
BASELINE = {"graphsync": "unsynced", "graphsync-allreduce": "unsynced", "graphsync, dynamic batch": "unsynced, dynamic batch",
            "graphsync-moments": "moments", "byhand": "moments", "byhand-summed": "moments"}


def transfers(built):
    """Every tensor that crossed devices in one training step: (src op, dtype, shape, bytes, from, to)."""
    with tf1.Session(graph=built["graph"], config=CONFIG) as sess:
        sess.run(built["init"])
        meta = tf1.RunMetadata()
        sess.run(built["train_op"], built["feed"], options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE,
                                                            output_partition_graphs=True), run_metadata=meta)
    produced = {}
    for dev in meta.step_stats.dev_stats:
        for node in dev.node_stats:
            produced[(dev.device, node.node_name)] = node
    out = []
    for partition in meta.partition_graphs:
        for node in partition.node:
            if node.op.startswith("Collective"):
                stats = produced.get((node.device, node.name))
                desc = stats.output[0].tensor_description
                shape = [d.size for d in desc.shape.dim]
                nbytes = int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(desc.dtype).size
                out.append(dict(src=node.name, dtype=tf.as_dtype(desc.dtype).name, shape=shape, bytes=0,
                                collective=nbytes, send=_device(node.device.encode()), recv="all"))
            if node.op != "_Send":
                continue
            src, _, slot = node.input[0].partition(":")
            stats = produced.get((node.device, src))
            if stats is None or int(slot or 0) >= len(stats.output):
                raise SystemExit(f"no step stats for the tensor {node.input[0]} sent from {node.device}")
            desc = stats.output[int(slot or 0)].tensor_description
            shape = [d.size for d in desc.shape.dim]
            nbytes = int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(desc.dtype).size
            out.append(dict(src=src, dtype=tf.as_dtype(desc.dtype).name, shape=shape, bytes=nbytes, collective=0,
                            send=_device(node.attr["send_device"].s), recv=_device(node.attr["recv_device"].s)))
    return out


def _device(spec: bytes) -> str:
    return "cpu:" + spec.decode().rsplit(":", 1)[-1]


def graphsync_breakdown(sent, layers):
    """Per layer: what graphsync's own ops sent, per remote tower, split by direction and pass
    (names: tower-side `<op>_sync…/`, aggregation `graphsync/<layer>/forward|backward…/`)."""
    rows = []
    for name, channels in layers:
        mine = [t for t in sent if (t["src"].startswith(f"graphsync/{name}/") or
                                    (f"/{name}/" in t["src"] and "_sync" in t["src"]))]
        cell = collections.defaultdict(lambda: [0, 0])  # (pass, dir) -> [tensors, bytes]
        for t in mine:
            if not t["bytes"]:
                continue  # a control edge crossing devices
            backward = "grad" in t["src"] or "/backward" in t["src"]
            up = t["recv"] == "cpu:0"
            key = ("bwd" if backward else "fwd") + (" up" if up else " down")
            cell[key][0] += 1
            cell[key][1] += t["bytes"]
        remote = TOWERS - 1
        row = dict(layer=name, C=channels)
        for key in ("fwd up", "fwd down", "bwd up", "bwd down"):
            tensors, nbytes = cell.get(key, [0, 0])
            row[key] = f"{tensors / remote:g} t, {nbytes / remote:g} B"
        row["expected"] = (f"fwd {2 * channels}+1 up / {2 * channels}(+1) down, "
                           f"bwd {2 * channels} / {2 * channels} values")
        row["aggregation scopes"] = len({re.match(r"graphsync/.*?/(forward|backward_\d+)/", t["src"]).group(1)
                                         for t in mine if t["src"].startswith("graphsync/")
                                         and re.match(r"graphsync/.*?/(forward|backward_\d+)/", t["src"])})
        rows.append(row)
    return rows


def run(arch, batch):
    batches = models.data(arch, TOWERS, batch)
    sent, built = {}, {}
    variants = dict(VARIANTS)
    if "strategy" not in inspect.signature(graphsync.rewrite_towers).parameters:
        del variants["graphsync-allreduce"]
    for name, (bn, gradients, rewrite, dynamic) in variants.items():
        built[name] = models.build_towers(arch, TOWERS, bn, batches, gradients=gradients, rewrite=rewrite,
                                          dynamic_batch=dynamic)
        sent[name] = transfers(built[name])
    layers = built["unsynced"]["bn_layers"]
    remote = TOWERS - 1
    channels = sum(c for _, c in layers)
    # the minimum: 2C up + 2C down forward, 2C + 2C backward (float32), per remote tower; with run-time
    # counts also n up and N down (graphsync sends them as float64 scalars: 16 B per layer)
    minimum = {False: remote * 8 * channels * 4, True: remote * (8 * channels * 4 + 16 * len(layers))}
    rows = []
    for name in variants:
        total = sum(t["bytes"] for t in sent[name])
        data = sum(1 for t in sent[name] if t["bytes"])
        collectives = [t for t in sent[name] if t["collective"]]
        row = dict(variant=name, tensors=data, control=len(sent[name]) - data - len(collectives), bytes=total)
        if collectives:
            payload = sum(t["collective"] for t in collectives)
            per = payload / len(layers) / TOWERS
            row["collective"] = (f"{len(collectives)} ops, {payload} B in: {per:.0f} B per layer & tower "
                                 f"(ring: ≈{per * 2 * (TOWERS - 1) / TOWERS:.0f} B sent per device)")
        base = BASELINE.get(name)
        if base:
            extra = total - sum(t["bytes"] for t in sent[base])
            extra_tensors = data - sum(1 for t in sent[base] if t["bytes"])
            row.update(baseline=base, extra=extra, per_layer=extra / len(layers),
                       per_layer_tower=extra / len(layers) / remote,
                       tensors_per_layer_tower=extra_tensors / len(layers) / remote,
                       vs_minimum=extra / minimum[VARIANTS[name][3]] if not collectives else "")
            if collectives:
                row.update(extra="(collectives)", per_layer="", per_layer_tower="", tensors_per_layer_tower="")
        rows.append(row)
    return dict(arch=arch, batch=batch, layers=layers, rows=rows,
                breakdown=graphsync_breakdown(sent["graphsync, dynamic batch"], layers),
                minimum=minimum,
                activations_bytes=_activation_bytes(built["unsynced"]["graph"], layers))


def _activation_bytes(graph, layers):
    """Bytes of one tower's batch-norm inputs, summed over layers (what the by-hand approach moves)."""
    total = 0
    for op in graph.get_operations():
        if op.type == "FusedBatchNormV3" and op.name.startswith("tower_1/"):
            total += op.inputs[0].shape.num_elements() * 4
    return total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet", "segnet"])
    parser.add_argument("--batch", type=int, default=8, help="examples per tower")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    print(_common.header("Traffic between devices per training step", argv))
    results = []
    for arch in args.models:
        res = run(arch, args.batch)
        results.append(res)
        n_layers = len(res["layers"])
        print(f"\n**{arch}** ({n_layers} batch norms, ΣC = {sum(c for _, c in res['layers'])}, {TOWERS} towers × "
              f"{args.batch} examples, aggregation on cpu:0. Minimum for exact statistics per step: "
              f"{res['minimum'][False]} B = 8·ΣC float32 × {TOWERS - 1} remote towers, "
              f"{res['minimum'][True]} B with run-time counts (+2 float64 per layer and remote tower). "
              f"One remote tower's batch-norm inputs, which the by-hand approach moves: "
              f"{res['activations_bytes']} B)\n")
        print(_common.table(res["rows"], [("variant", "variant"), ("tensors", "tensors sent"),
                                          ("control", "control signals"),
                                          ("bytes", "bytes sent"), ("baseline", "minus"),
                                          ("extra", "batch-norm bytes/step"), ("per_layer", "per layer"),
                                          ("per_layer_tower", "per layer & remote tower"),
                                          ("tensors_per_layer_tower", "tensors per layer & remote tower"),
                                          ("vs_minimum", "÷ minimum"),
                                          ("collective", "CollectiveReduceV2 payload")]))
        print("\ngraphsync (dynamic batch), per layer and remote tower (t = tensors, B = bytes; from graphsync's "
              "own ops, by name):\n")
        print(_common.table(res["breakdown"], [("layer", "layer"), ("C", "C"), ("fwd up", "forward up"),
                                               ("fwd down", "forward down"), ("bwd up", "backward up"),
                                               ("bwd down", "backward down"), ("expected", "expected"),
                                               ("aggregation scopes", "sync points")]))
    _common.write_json(args.json, results)


if __name__ == "__main__":
    main()
