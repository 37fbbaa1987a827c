"""The memory cost model of recompute="segments" (graphsync/splice/segment_cost.py), on its own:
three layers' regions of a hand-built graph, whose bytes and peaks are counted by hand below.

    x [2, 8] ─Relu→ a [2, 8] ─Tile(×2)→ b [2, 16] ─Relu→ c [2, 16]     float32, no gradients yet

Regions {A}, {B}, {C} (A, B, C the ops making a, b, c) recompute 2·8·4 = 64, 2·16·4 = 128 and
128 bytes: before the gradients exist, every activation a region computes (x is data, not an
activation a region computes; Tile's multiples are no activation). A cut's peak, over its
segments: what the segment recomputes plus every activation it or an earlier segment reads from
another segment, kept from the forward until then:

    [0, 1, 2]   {A}: 64;  {B}: a kept 64 + 128 = 192;  {C}: a, b kept 192 + 128 = 320   → 320
    [0, 2]      {A, B}: 192;  {C}: b kept 128 + 128 = 256                             → 256
    [0, 1]      {A}: 64;  {B, C}: a kept 64 + 256 = 320                               → 320
    [0]         {A, B, C}: 320                                                        → 320

so `cut` begins segments at layers 0 and 2.
"""
import pytest
import tensorflow as tf

from graphsync.splice import segment_cost

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own (nothing runs)

tf1 = tf.compat.v1


def _regions():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 8], name="x")
        a = tf.nn.relu(x, name="a")
        b = tf.tile(a, [1, 2], name="b")
        c = tf.nn.relu(b, name="c")
    return [{a.op}, {b.op}, {c.op}]


def test_a_regions_bytes_are_the_activations_it_computes():
    assert [segment_cost.region_bytes(r) for r in _regions()] == [64, 128, 128]


def test_a_cuts_peak_counts_the_checkpoints_kept_until_then():
    regions = _regions()
    sizes = [segment_cost.region_bytes(r) for r in regions]
    peaks = {tuple(firsts): segment_cost.peak(regions, sizes, firsts) for firsts in ([0, 1, 2], [0, 2], [0, 1], [0])}
    assert peaks == {(0, 1, 2): 320, (0, 2): 256, (0, 1): 320, (0,): 320}


def test_the_cut_is_the_one_whose_peak_is_least():
    assert segment_cost.cut(_regions()) == [0, 2]
