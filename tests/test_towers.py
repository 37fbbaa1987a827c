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
