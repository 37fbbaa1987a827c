"""Every listing of layers — `graphsync inspect`, `rewrite`'s table, RewriteReport.layers and
.skipped, `verify` — in the order the forward pass runs them, in text and in --json: on a
12-layer model whose layer names (bn0 … bn11) sort as bn0, bn1, bn10, bn11, bn2, …; and the
topological order itself (graphsync/graph/order.py) against op ids and cycles.
"""
from __future__ import annotations

import json
import re

import pytest
import tensorflow as tf
from click.testing import CliRunner

import graphsync
import models
import towerlib as tl
from cli.main import main
from graphsync.graph import order
from graphsync.graph.reroute import reroute_consumers

tf1 = tf.compat.v1
DEPTH = 12
FORWARD = [f"bn{i}_1" for i in range(DEPTH)]      # raw_fused_bn's op inside its variable scope bn{i}
assert sorted(FORWARD) != FORWARD


def _positions_in(text: str, names) -> list[int]:
    """Where each name first appears in `text` as a whole word."""
    found = [re.search(rf"(?<![\w/]){re.escape(n)}(?![\w/])", text) for n in names]
    assert all(found), [n for n, f in zip(names, found) if not f]
    return [f.start() for f in found]


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """The 2-tower, 12-layer model saved as a meta graph, and its rewrite through the CLI."""
    tmp = tmp_path_factory.mktemp("order")
    built = tl.build(models.resnetish(depth=DEPTH), [3, 5])
    original, rewritten = str(tmp / "deep.meta"), str(tmp / "deep_sync.meta")
    tf1.train.export_meta_graph(original, graph=built.graph)
    runner = CliRunner()
    text = runner.invoke(main, ["rewrite", original, "-o", rewritten, "-v"])   # -v: the table
    assert text.exit_code == 0, text.output
    as_json = runner.invoke(main, ["rewrite", original, "--dry-run", "--json"])
    assert as_json.exit_code == 0, as_json.output
    return original, rewritten, text.output, json.loads(as_json.output)


def test_inspect_lists_layers_in_forward_order(deep):
    original = deep[0]
    runner = CliRunner()
    text = runner.invoke(main, ["inspect", original])
    assert text.exit_code == 0, text.output
    assert _positions_in(text.output, FORWARD) == sorted(_positions_in(text.output, FORWARD))
    info = json.loads(runner.invoke(main, ["inspect", original, "--json"]).output)
    assert [layer["name"] for layer in info["layers"]] == FORWARD


def test_rewrite_table_and_report_list_layers_in_forward_order(deep):
    _, rewritten, text, as_json = deep
    assert _positions_in(text, FORWARD) == sorted(_positions_in(text, FORWARD))
    assert [layer["name"] for layer in as_json["layers"]] == FORWARD
    assert [layer["tower_ops"][0] for layer in as_json["layers"]] == [f"tower_0/{n}" for n in FORWARD]
    # rewriting the rewritten graph leaves every op alone: report.skipped in the order they run
    again = graphsync.rewrite_towers(graphsync.io.load(rewritten).graph)
    assert not again.layers
    skipped = [s.op for s in again.skipped]
    for tower in ("tower_0/", "tower_1/"):
        assert [op for op in skipped if op.startswith(tower)] == [tower + n for n in FORWARD]


def test_verify_lists_layers_in_forward_order(deep):
    original, rewritten, _, _ = deep
    runner = CliRunner()
    text = runner.invoke(main, ["verify", rewritten, "-v"])
    assert text.exit_code == 0, text.output
    table = text.output[text.output.index("bytes across devices"):]
    assert _positions_in(table, FORWARD) == sorted(_positions_in(table, FORWARD))
    shown = runner.invoke(main, ["verify", rewritten])     # the 8 largest, still in forward order
    table = shown.output[shown.output.index("bytes across devices"):]
    listed = [n for n in FORWARD if re.search(rf"^\s+{re.escape(n)}\s", table, re.M)]
    assert len(listed) == 8 and _positions_in(table, listed) == sorted(_positions_in(table, listed))
    report = json.loads(runner.invoke(main, ["verify", rewritten, "--original", original, "--json"]).output)
    assert report["passed"] and report["rewritten"]["layers"] == FORWARD
    assert [t["layer"] for t in report["rewritten"]["traffic"]] == FORWARD
    running = report["original"]["batch_norm_running"]
    assert [op for op in running if op.startswith("tower_0/bn")] == [f"tower_0/{n}" for n in FORWARD]


def test_order_follows_edges_not_op_ids_or_names_and_survives_cycles():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        runs_second = tf.nn.relu(x, name="a_second")    # created first, named first
        runs_first = tf.nn.relu(x, name="z_first")
        reroute_consumers(x, runs_first, only=[runs_second.op])
        a = tf.identity(x, name="loop_a")
        b = tf.identity(a, name="loop_b")
        reroute_consumers(x, b, only=[a.op])            # a ↔ b: a cycle, as a v1 while loop has
    placed = order.positions([runs_second.op, b.op])
    assert placed[x.op] < placed[runs_first.op] < placed[runs_second.op]
    assert set(placed) == {x.op, runs_first.op, runs_second.op, a.op, b.op}
    assert order.in_forward_order([runs_second.op, runs_first.op], lambda op: op) == [runs_first.op, runs_second.op]
