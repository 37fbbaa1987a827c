"""Rewritten before the gradients exist, then one tf.gradients per tower (the CIFAR10 pattern run in
the other order), with either strategy: one training step equals the single-device step on the
concatenated batch, each tower's backward stays inside its tower plus one exchange per layer, and
the ops added per tower do not grow with the number of towers.

Tolerance as in test_fused.py: 2e-5 relative in float32 (measured ~3e-6), 1e-12 in float64.
"""
import functools
import warnings

import numpy as np
import pytest
import tensorflow as tf

import graphsync
import models
import tiers
import towerlib as tl

tf1 = tf.compat.v1
MODELS = {"fused": (models.resnetish(depth=3), tf.float32),
          "moments": (models.seed_moments(3), tf.float64)}
TOLERANCE = {tf.float32: 2e-5, tf.float64: 1e-12}
CASES = [(strategy, model, sizes) for strategy in ("gather", "allreduce")
         for model, sizes in (("fused", (5, 2)), ("fused", (3, 5, 1, 4)), ("moments", (2, 6)),
                              ("moments", (4, 2, 5, 3)))]


@functools.lru_cache(maxsize=None)
def _reference(model_key, sizes):
    model, dtype = MODELS[model_key]
    x, t = tl.data(list(sizes), (6, 6, 3), (5,), dtype=dtype.as_numpy_dtype)
    return (x, t), tl.reference_step(model, list(sizes), x, t, dtype=dtype)


def _errors(model_key, sizes, strategy):
    model, dtype = MODELS[model_key]
    (x, t), ref = _reference(model_key, sizes)
    rewrite = (lambda g: graphsync.rewrite_towers(g, strategy=strategy)) if strategy else None
    built = tl.build(model, list(sizes), gradients="before", rewrite=rewrite, dtype=dtype)
    got = tl.run_step(built, x, t, list(sizes))
    return {k: tl.max_rel_error(got[k], ref[k]) for k in ref}


@functools.lru_cache(maxsize=None)
def _unsynced_errors(model_key, sizes):
    return _errors(model_key, sizes, None)


@pytest.mark.parametrize("strategy,model_key,sizes", tiers.cases(
    CASES, [f"{s}-{m}-{'x'.join(map(str, b))}" for s, m, b in CASES], fast={"gather-fused-5x2", "allreduce-moments-2x6"}))
def test_per_tower_gradients_equal_the_single_device_step(strategy, model_key, sizes):
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphsync.GraphsyncWarning)
        errors = _errors(model_key, sizes, strategy)
    assert max(errors.values()) < TOLERANCE[MODELS[model_key][1]], errors
    unsynced = _unsynced_errors(model_key, sizes)
    for key in ("output", "loss", "grads", "moving"):
        assert unsynced[key] > 1e-3, (key, unsynced)


def _built(strategy, towers, depth=2):
    return tl.build(models.resnetish(depth=depth), [2] * towers, gradients="before",
                    devices=[f"/cpu:{i}" for i in range(towers)],
                    rewrite=(lambda g: graphsync.rewrite_towers(g, strategy=strategy)) if strategy else None)


@pytest.mark.parametrize("strategy", ["gather", pytest.param("allreduce", marks=tiers.full)])
def test_ops_added_per_tower_do_not_grow_with_the_towers(strategy):
    """Every tower adds the same ops (the per-layer merge is shared), so the ops added are
    a + b·towers: from 4 to 8 towers exactly twice what 2 to 4 added."""
    added = {t: len(_built(strategy, t).graph.get_operations()) - len(_built(None, t).graph.get_operations())
             for t in (2, 4, 8)}
    assert added[8] - added[4] == 2 * (added[4] - added[2]), added
    assert added[8] / 8 <= added[2] / 2, added


@pytest.mark.parametrize("strategy", ["gather", "allreduce"])
def test_each_towers_backward_reads_only_its_own_tower(strategy):
    built = _built(strategy, 3)
    for op in built.graph.get_operations():
        for i in range(3):
            if op.name.startswith(f"tower_{i}/gradients"):
                others = [t.op.name for t in op.inputs if t.op.name.startswith("tower_")
                          and not t.op.name.startswith(f"tower_{i}/")]
                assert not others, (op.name, others)


def test_gather_gradient_missing_a_tower_fails_at_run_time_with_the_remedy():
    """Each tower's backward carries the gradient of the sum of all tower losses, so a gradient
    built for tower 0 only cannot be exact: running it says so instead of returning wrong numbers."""
    built = tl.build(models.resnetish(depth=1), [2, 3], gradients="before-sum",
                     rewrite=graphsync.rewrite_towers)
    with built.graph.as_default():
        partial = tf.gradients(built.losses[0], built.variables)
    x, t = tl.data([2, 3], (6, 6, 3), (5,))
    feed = {built.inputs[0]: x[:2], built.inputs[1]: x[2:], built.targets[0]: t[:2], built.targets[1]: t[2:]}
    with tf1.Session(graph=built.graph, config=tl.CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        assert np.isfinite(sess.run(built.grads, feed)[0]).all()  # the complete one still runs
        with pytest.raises(tf.errors.InvalidArgumentError, match="differentiate every tower's loss"):
            sess.run(partial, feed)
