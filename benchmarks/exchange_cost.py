"""What each strategy adds to a graph, in every rewrite order: graph ops added per layer and tower,
ops that actually run per step (TensorFlow's step statistics), and how the ops added grow with the
number of towers when the graph is rewritten before its gradients and each tower then calls
tf.gradients on its own loss.

Graphs: tests/towerlib.py `build` (CIFAR10 pattern, tower i on /cpu:i) around tests/models.py
`resnetish` (raw FusedBatchNormV3 layers) or `seed_moments` (tf.nn.moments + batch_normalization),
rewritten with graphsync.rewrite_towers(strategy=...)

  after       gradients built (one tf.gradients per tower), then the rewrite
  before      the rewrite, then one tf.gradients per tower
  before-sum  the rewrite, then one tf.gradients over the summed tower losses

"ops added" = ops of the rewritten graph − ops of the same graph built without graphsync.
"ops run" = nodes in one training step's step statistics, same difference (4 towers only).

    python benchmarks/exchange_cost.py [--towers 2 4 8] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import sys

import _common

sys.path.insert(0, os.path.join(_common.REPO, "tests"))
TF = _common.import_tf()

import graphsync  # noqa: E402
import models  # noqa: E402
import towerlib as tl  # noqa: E402

ORDERS = ("after", "before", "before-sum")
STRATEGIES = ("gather", "allreduce")
MODELS = {"fused": lambda depth: models.resnetish(depth=depth, channels=16),
          "moments": lambda depth: models.seed_moments(depth)}


def build(kind, depth, towers, order, strategy):
    rewrite = (lambda g: graphsync.rewrite_towers(g, strategy=strategy)) if strategy else None
    return tl.build(MODELS[kind](depth), [2] * towers, gradients=order, rewrite=rewrite,
                    devices=[f"/cpu:{i}" for i in range(towers)], input_shape=(8, 8, 3))


def per_layer_and_tower(kind, depth, towers, run):
    rows = []
    for order in ORDERS:
        base = build(kind, depth, towers, order, None)
        base_run = len(tl.executed_nodes(base, [2] * towers)) if run else None
        row = {"model": kind, "order": order}
        for strategy in STRATEGIES:
            built = build(kind, depth, towers, order, strategy)
            added = len(built.graph.get_operations()) - len(base.graph.get_operations())
            row[strategy] = added / (depth * towers)
            if run:
                row[f"{strategy}_run"] = (len(tl.executed_nodes(built, [2] * towers)) - base_run) / (depth * towers)
        row["ratio"] = row["allreduce"] / row["gather"]
        if run:
            row["ratio_run"] = row["allreduce_run"] / row["gather_run"]
        rows.append(row)
    return rows


def growth(kind, depth, tower_counts):
    rows = []
    for strategy in STRATEGIES:
        added = {}
        for towers in tower_counts:
            base = build(kind, depth, towers, "before", None)
            built = build(kind, depth, towers, "before", strategy)
            added[towers] = len(built.graph.get_operations()) - len(base.graph.get_operations())
        row = {"model": kind, "strategy": strategy}
        for i, towers in enumerate(tower_counts):
            row[f"per_tower_{towers}"] = added[towers] / towers
            if i:
                previous = tower_counts[i - 1]
                row[f"marginal_{towers}"] = (added[towers] - added[previous]) / (towers - previous)
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--towers", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--depth", type=int, default=4, help="batch norms per tower")
    parser.add_argument("--growth-depth", type=int, default=5, help="batch norms per tower in the growth table")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    print(_common.header("What each strategy adds to the graph", argv))
    print(f"Ops per layer and tower, 4 towers × {args.depth} layers (2 examples of 8×8×3 per tower); "
          "'run' counts the nodes one training step executes.\n")
    rows = []
    for kind in MODELS:
        rows += per_layer_and_tower(kind, args.depth, 4, run=True)
    print(_common.table(rows, [("model", "model"), ("order", "rewrite order"), ("gather", "gather ops added"),
                               ("allreduce", "allreduce ops added"), ("ratio", "allreduce ÷ gather"),
                               ("gather_run", "gather ops run"), ("allreduce_run", "allreduce ops run"),
                               ("ratio_run", "allreduce ÷ gather (run)")]))
    print(f"\nOps added per tower, rewritten before the gradients, then one tf.gradients per tower "
          f"({args.growth_depth} layers per tower); 'marginal' = ops one more tower adds.\n")
    grow = []
    for kind in MODELS:
        grow += growth(kind, args.growth_depth, args.towers)
    columns = [("model", "model"), ("strategy", "strategy")]
    for i, towers in enumerate(args.towers):
        columns.append((f"per_tower_{towers}", f"per tower at {towers}"))
        if i:
            columns.append((f"marginal_{towers}", f"marginal {args.towers[i - 1]}→{towers}"))
    print(_common.table(grow, columns))
    _common.write_json(args.json, {"args": vars(args), "per_layer_and_tower": rows, "growth": grow})


if __name__ == "__main__":
    main()
