"""benchmarks/training_run.py in a tiny setting: over several training steps the synchronized towers
follow the one-device run on the concatenated batch (losses, evaluation, every variable at the end),
and the same towers without graphsync do not. Runs without matplotlib."""
import os
import sys

import numpy as np
import pytest

_saved_path = list(sys.path)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import training_run  # noqa: E402
sys.path[:] = _saved_path     # benchmarks/models.py must not shadow tests/models.py for later imports

TINY = training_run.Setting(towers=4, per_tower=2, side=16, width=4, depth=1, steps=6, eval_every=3,
                            heldout=8)


@pytest.fixture(scope="module")
def runs(request):
    saved = sys.modules.get("matplotlib")
    sys.modules["matplotlib"] = None          # any import of matplotlib fails
    try:
        records = training_run.run_all(TINY, seeds=[0], variants=training_run.VARIANTS)
        table = training_run.markdown(TINY, records, [0])
    finally:
        if saved is None:
            del sys.modules["matplotlib"]
        else:
            sys.modules["matplotlib"] = saved
    return {r["variant"]: r for r in records}, table


def test_synchronized_towers_train_like_one_device(runs):
    by_variant, _ = runs
    synced, single = by_variant["graphsync"], by_variant["one device"]
    assert "4 towers synchronized" in synced["graphsync"]
    assert len(synced["loss"]) == TINY.steps
    np.testing.assert_allclose(synced["loss"], single["loss"], rtol=1e-4)
    for got, want in zip(synced["eval"], single["eval"]):
        assert got["step"] == want["step"]
        np.testing.assert_allclose([got["loss"], got["accuracy"]], [want["loss"], want["accuracy"]],
                                   rtol=1e-3, atol=1e-3)
    assert max(synced["loss_gap"]) < 1e-5, synced["loss_gap"]
    assert synced["drift"]["max"] < 1e-4, synced["drift"]


def test_per_tower_statistics_train_differently(runs):
    by_variant, _ = runs
    per_tower, single = by_variant["per-tower"], by_variant["one device"]
    gaps = np.abs(np.subtract(per_tower["loss"], single["loss"])) / np.array(single["loss"])
    assert np.all(gaps > 1e-3), gaps
    assert per_tower["drift"]["max"] > 1e-2, per_tower["drift"]
    assert abs(per_tower["eval"][-1]["loss"] - single["eval"][-1]["loss"]) > 1e-2


def test_the_table_has_every_variant(runs):
    _, table = runs
    for variant in training_run.VARIANTS:
        assert f"| {variant} |" in table


def test_the_plot_draws_from_the_records(runs, tmp_path):
    pytest.importorskip("matplotlib")
    by_variant, _ = runs
    path = tmp_path / "curves.png"
    training_run.plot(TINY, list(by_variant.values()), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
