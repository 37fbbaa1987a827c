"""Random graphs (tests/random_towers.py): each net drawn from the ways real code writes
normalization, activations, joins, pooling and training flags, built as 2–4 uneven towers, equals
one device on the concatenated batch after the rewrite, or is refused in one line.

A fixed list of seeds runs in the full tier; the long mode draws thousands:

    python benchmarks/random_graphs.py --seeds 2000

Every seed that ever failed becomes a named test at the end of this file, with what it found.
"""
import pytest

import random_towers as rt

pytestmark = pytest.mark.full

SEEDS = range(16)


def _check(seed):
    outcome = rt.check(seed)
    if outcome.refused:
        assert "\n" not in outcome.refused, outcome
    else:
        assert outcome.error <= outcome.tolerance, outcome
        assert outcome.layers >= 1, outcome   # (a statistic written by hand may count as several reductions)
        assert outcome.unsynchronized > 3 * outcome.tolerance, outcome   # the check tells one from the other


@pytest.mark.parametrize("seed", SEEDS)
def test_random_graph_equals_one_device_or_is_refused(seed):
    _check(seed)


# Every seed that ever failed, named by what it found.

def test_keras_variables_under_tower_0s_scope_are_compared_with_their_own():
    """Seed 11: a tf_keras batch norm built in tower 0 names its variables tower_0/norm0/…, which
    sorted them apart from the reference's norm0/… (19 off: the comparison's, not the rewrite's)."""
    _check(11)


def test_towers_of_one_example_within_one_devices_noise():
    """Seed 7: towers of [1, 2, 1]: 3.5e-6 off where two reorderings of one device measured a
    noise of 8e-7 and a third 1.6e-6 (the tolerance takes three)."""
    _check(7)
