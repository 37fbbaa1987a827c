"""Random graphs (tests/random_towers.py): each net drawn from the ways real code writes
normalization, activations, joins, pooling and training flags, built as 2–4 uneven towers, equals
one device on the concatenated batch after the rewrite, or is refused in one line.

A fixed list of seeds runs in the full tier; the long mode draws thousands:

    python benchmarks/random_graphs.py --seeds 2000

Every seed that ever failed becomes a named case in REGRESSIONS, with what it found.
"""
import pytest

import random_towers as rt

pytestmark = pytest.mark.full

SEEDS = range(24)
REGRESSIONS = {   # name: seed (none found yet by the fixed list or the long mode's runs so far)
}


def _check(seed):
    outcome = rt.check(seed)
    if outcome.refused:
        assert "\n" not in outcome.refused, outcome
    else:
        assert outcome.error <= outcome.tolerance, outcome
        assert outcome.layers == len(outcome.spec.blocks), outcome


@pytest.mark.parametrize("seed", SEEDS)
def test_random_graph_equals_one_device_or_is_refused(seed):
    _check(seed)


@pytest.mark.parametrize("seed", list(REGRESSIONS.values()), ids=list(REGRESSIONS))
def test_regression(seed):
    _check(seed)
