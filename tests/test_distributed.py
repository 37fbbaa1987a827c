"""TensorFlow's distributed runtime and the all-reduce strategy: in-graph replication across real
server processes, all-reduce within one process, between-graph replication with cross-process
collectives, and sync groups; each compared with its single-device reference."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import cluster as cl
import graphsync
import models
import tiers
import towerlib as tl

tf1 = tf.compat.v1
KEYS = ("output", "loss", "grads", "moving", "variables")


def _compare(model, batch_sizes, rewrite, *, devices=None, target="", dtype=tf.float32, ref=None):
    x, t = tl.data(batch_sizes, (6, 6, 3), (5,), dtype=dtype.as_numpy_dtype)
    ref = ref or tl.reference_step(model, batch_sizes, x, t, dtype=dtype)
    errors = {}
    for rewritten in (True, False):
        built = tl.build(model, batch_sizes, devices=devices, rewrite=rewrite if rewritten else None, dtype=dtype,
                         gradients=getattr(rewrite, "gradients", "after"))
        got = tl.run_step(built, x, t, batch_sizes, target=target)
        errors[rewritten] = {k: tl.max_rel_error(got[k], ref[k]) for k in KEYS}
    return errors[True], errors[False]


@tiers.full
def test_in_graph_replication_across_server_processes():
    spec = cl.cluster_spec({"worker": 2, "ps": 1})
    devices = ["/job:worker/task:0/cpu:0",                       # legacy
               "/job:worker/replica:0/task:1/device:CPU:0",      # full
               "/job:worker/task:0/device:CPU:0"]                # partial + current
    reports = []

    def rewrite(graph):
        reports.append(graphsync.rewrite_towers(graph, device="/job:ps/task:0"))
    with cl.servers(spec):
        synced, unsynced = _compare(models.resnetish(depth=2), [3, 5, 4], rewrite, devices=devices,
                                    target="grpc://" + spec["worker"][0])
    assert reports[0].device == "/job:ps/task:0"
    assert max(synced.values()) < 2e-5, synced
    assert unsynced["output"] > 1e-3 and unsynced["grads"] > 1e-3


def test_default_aggregation_device_is_the_first_towers_host_cpu():
    built = tl.build(models.resnetish(depth=1), [2, 2],
                     devices=["/job:worker/task:1/device:GPU:0", "/job:worker/task:2/device:GPU:0"])
    report = graphsync.rewrite_towers(built.graph)
    assert report.device == "/job:worker/task:1/device:CPU:0"


ALLREDUCE_CASES = [("fused", models.resnetish(depth=3), tf.float32, "after"),
                   ("fused", models.resnetish(depth=3), tf.float32, "before"),
                   ("moments-f64", models.seed_moments(3), tf.float64, "after"),
                   ("moments-f64", models.seed_moments(3), tf.float64, "before"),
                   ("mixed", models.mixed(), tf.float32, "before-sum")]


@pytest.mark.parametrize("name,model,dtype,gradients", tiers.cases(
    ALLREDUCE_CASES, [f"{n}-{g}" for n, _, _, g in ALLREDUCE_CASES], fast={"fused-after", "mixed-before-sum"}))
def test_allreduce_matches_the_reference(name, model, dtype, gradients):
    def rewrite(graph):
        report = graphsync.rewrite_towers(graph, strategy="allreduce")
        assert report.strategy == "allreduce" and "all-reduce" in report.summary
    rewrite.gradients = gradients
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphsync.GraphsyncWarning)  # per-tower gradients stay linear
        synced, unsynced = _compare(model, [3, 5, 4, 2], rewrite, dtype=dtype)
    assert max(synced.values()) < (1e-12 if dtype == tf.float64 else 2e-5), synced
    assert unsynced["output"] > 1e-3 and unsynced["grads"] > 1e-3


def test_allreduce_before_gradients_keeps_each_towers_backward_its_own():
    built = tl.build(models.resnetish(depth=2), [2, 3], gradients="before",
                     rewrite=lambda g: graphsync.rewrite_towers(g, strategy="allreduce"))
    for op in built.graph.get_operations():
        if op.name.startswith("tower_1/gradients"):
            assert not any(t.op.name.startswith("tower_0/") for t in op.inputs), op.name


def test_allreduce_fetching_one_tower_does_not_block():
    """tf.Session would wait forever for the other towers' collectives; the rewrite makes every
    tower's synchronized output wait for all local collectives, so one tower's fetch runs them."""
    built = tl.build(models.resnetish(depth=2), [3, 3],
                     rewrite=lambda g: graphsync.rewrite_towers(g, strategy="allreduce"))
    x, t = tl.data([3, 3], (6, 6, 3), (5,))
    with tf1.Session(graph=built.graph, config=tl.CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        loss = sess.run(built.losses[0], {built.inputs[0]: x[:3], built.targets[0]: t[:3], built.inputs[1]: x[3:]},
                        options=tf1.RunOptions(timeout_in_ms=60000))
    assert np.isfinite(loss)


def test_allreduce_refuses_towers_sharing_a_device():
    built = tl.build(models.resnetish(depth=1), [2, 2], devices=["/cpu:0", "/cpu:0"])
    before = built.graph.as_graph_def()
    with pytest.raises(graphsync.GraphsyncError, match="own device"):
        graphsync.rewrite_towers(built.graph, strategy="allreduce")
    assert built.graph.as_graph_def() == before


@pytest.mark.parametrize("strategy", ["gather", "allreduce"])
def test_sync_groups_each_equal_their_own_reference(strategy):
    """8 towers in 2 groups of 4: each group is its own single-device run."""
    model, sizes = models.resnetish(depth=2), [3, 2, 4, 1, 2, 2, 3, 5]
    x, t = tl.data(sizes, (6, 6, 3), (5,))
    refs = [tl.reference_step(model, sizes[g:g + 4], x[sum(sizes[:g]):sum(sizes[:g + 4])],
                              t[sum(sizes[:g]):sum(sizes[:g + 4])]) for g in (0, 4)]
    reports = []
    built = tl.build(model, sizes, rewrite=lambda g: reports.append(
        graphsync.rewrite_towers(g, strategy=strategy, group_size=4)))
    got = tl.run_step(built, x, t, sizes)
    assert reports[0].groups == [[f"tower_{i}" for i in range(4)], [f"tower_{i}" for i in range(4, 8)]]
    assert "in 2 groups of 4" in reports[0].summary
    want = {"output": np.concatenate([r["output"] for r in refs]), "loss": np.concatenate([r["loss"] for r in refs]),
            "grads": [a + b for a, b in zip(refs[0]["grads"], refs[1]["grads"])], "moving": refs[0]["moving"]}
    errors = {k: tl.max_rel_error(got[k], want[k]) for k in want}
    assert max(errors.values()) < 2e-5, errors
    whole = tl.reference_step(model, sizes, x, t)
    assert tl.max_rel_error(got["output"], whole["output"]) > 1e-3  # groups really are separate


@tiers.full   # two workers: tests/test_between_graph.py
def test_between_graph_replication_with_cross_process_collectives(tmp_path):
    sizes = [3, 5]
    got = cl.between_graph_step(cl.cluster_spec({"worker": 2}), sizes, tmp_path)
    x, t = tl.data(sizes, (6, 6, 3), (5,))
    ref = tl.reference_step(models.resnetish(depth=2), sizes, x, t)
    assert int(got[0]["layers"]) == 2
    errors = {
        "output": tl.max_rel_error(np.concatenate([g["output"] for g in got]), ref["output"]),
        "loss": tl.max_rel_error(np.concatenate([g["loss"] for g in got]), ref["loss"]),
        "grads": tl.max_rel_error(got[0]["grads"] + got[1]["grads"], np.concatenate([g.ravel() for g in ref["grads"]])),
        "moving": tl.max_rel_error(got[0]["moving"], np.concatenate([m.ravel() for m in ref["moving"]])),
    }
    assert max(errors.values()) < 2e-5, errors
