"""Tower discovery follows the conventions of real code; scopes, not devices, identify towers."""
import pytest

import graphsync
import models
import towerlib as tl
from graphsync.towers.scopes import find_towers

BN = "bn/FusedBatchNormV3"


@pytest.mark.parametrize("names,prefixes", [
    (["tower_0/" + BN, "tower_1/" + BN], ["tower_0/", "tower_1/"]),
    (["tower_0/v0/cg/" + BN, "tower_1/v1/cg/" + BN], ["tower_0/v0/", "tower_1/v1/"]),
    (["tower0/" + BN, "tower1/" + BN, "tower10/" + BN, "tower2/" + BN],
     ["tower0/", "tower1/", "tower2/", "tower10/"]),
    (["clone_0/" + BN, "clone_1/" + BN], ["clone_0/", "clone_1/"]),
    ([BN, "replica_1/" + BN, "replica_2/" + BN], ["", "replica_1/", "replica_2/"]),
    (["model/tower_0/" + BN, "model/tower_1/" + BN], ["model/tower_0/", "model/tower_1/"]),
    (["tower_0/" + BN, "tower_1/" + BN, "clone_0/x/" + BN], ["tower_0/", "tower_1/"]),
    (["network/" + BN, "head/" + BN], []),
])
def test_discovery(names, prefixes):
    assert [t.prefix for t in find_towers(names)] == prefixes


def test_explicit_regex_and_list():
    names = ["gpu0/" + BN, "gpu1/" + BN, "loss/" + BN]
    assert [t.prefix for t in find_towers(names, r"gpu\d+/")] == ["gpu0/", "gpu1/"]
    assert [t.prefix for t in find_towers(names, ["", "gpu1"])] == ["", "gpu1/"]
    with pytest.raises(graphsync.GraphsyncError, match="not a valid regular expression"):
        find_towers(names, "gpu(")


def _check(model, batch_sizes, scope, devices=None, **rewrite_kw):
    x, t = tl.data(batch_sizes, (6, 6, 3), (5,))
    ref = tl.reference_step(model, batch_sizes, x, t)
    reports = []
    for rewrite in (True, False):
        fn = (lambda g: reports.append(graphsync.rewrite_towers(g, **rewrite_kw))) if rewrite else None
        got = tl.run_step(tl.build(model, batch_sizes, scope=scope, devices=devices, rewrite=fn), x, t, batch_sizes)
        worst = max(tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "moving"))
        if rewrite:
            assert worst < 2e-5 and len(reports[0].towers) == len(batch_sizes), (worst, reports[0])
        else:
            assert worst > 1e-3
    return reports


def test_unscoped_first_replica_is_tower_zero():
    _check(models.resnetish(), [3, 5, 4], ["", "replica_1", "replica_2"])


def test_towers_on_one_device_are_told_apart_by_scope():
    _check(models.resnetish(), [3, 5], "clone_%d", devices=["/cpu:0", "/cpu:0"])


def test_user_named_towers_and_aggregation_device():
    reports = _check(models.resnetish(), [4, 2], "gpu%d", towers=r"gpu\d+/", device="/cpu:3")
    assert reports[0].device == "/cpu:3"


@pytest.mark.parametrize("form", ["fused", "by-hand"])
def test_gradients_of_some_towers_only_are_refused_in_one_line(form):
    """Tower 1 differentiated, tower 0 not: the layer's backward cannot be synchronized call by
    call (plan/data.py check_gradient_calls). A batch norm written by hand is refused earlier, by
    the rule: its tower-1 statistic is read back into examples whose gradient is taken, and no
    layer of the plan covers it. One line either way, the graph untouched."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        losses = []
        for i in range(2):
            with tf1.device(f"/cpu:{i}"), tf.name_scope(f"tower_{i}"), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, (None, 4, 4, 3), name="x")
                h = tf1.layers.conv2d(x, 4, 3, padding="same", use_bias=False, name="conv")
                if form == "fused":
                    h = tf1.layers.batch_normalization(h, training=True, fused=True, name="bn")
                else:
                    mean, variance = tf.reduce_mean(h, [0, 1, 2]), tf.math.reduce_variance(h, [0, 1, 2])
                    h = (h - mean) * tf.math.rsqrt(variance + 1e-3)
                losses.append(tf.reduce_sum(tf.square(h)))
        tf.gradients(losses[1], tf1.trainable_variables())
        before = len(graph.get_operations())
        with pytest.raises(graphsync.GraphsyncError) as raised:
            graphsync.rewrite_towers(graph)
    expected = {"fused": "layer 'model/bn/FusedBatchNormV3' has a different number of gradient calls per tower",
                "by-hand": "tower_1/model/Mean (Mean) computes a batch statistic graphsync cannot synchronize"}
    assert expected[form] in str(raised.value), raised.value
    assert "\n" not in str(raised.value) and len(graph.get_operations()) == before
