"""No legal graph crashes the rewrite (issue 30, point 9): a generated corpus of small odd graphs,
each built as 2 towers, is rewritten; anything other than a rewrite or a GraphsyncError fails.

The corpus crosses input shapes (static batch, dynamic batch, a batch of 0 examples, unknown
rank, a scalar) with odd statistics beside ordinary ones (constants that are zero, empty
reductions, divisions by zero, statistics of scalars, ghost reshapes, weights that are zero),
with the gradients built before, after, or not at all.
"""
import itertools
import warnings

import pytest
import tensorflow as tf

import graphsync

pytestmark = pytest.mark.full   # the odd-graph corpus

tf1 = tf.compat.v1

INPUTS = {   # name: placeholder shape
    "static": [4, 3, 3, 2],
    "dynamic": [None, 3, 3, 2],
    "empty-batch": [0, 3, 3, 2],
    "unknown-rank": None,
    "scalar": [],
    "vector": [None],
}


def _moments(h, axes):
    m, v = tf.nn.moments(h, axes)
    return (h - m) * tf.math.rsqrt(v + 1e-3)


def _all_axes(h):
    return list(range(h.shape.rank)) if h.shape.rank is not None else None


BLOCKS = {   # name: h -> tensor (raising ValueError/TypeError at build time skips the graph: not legal)
    "sum-times-zero": lambda h: _moments(h, _all_axes(h)[:-1] or [0]) + tf.reduce_sum(h) * 0.0,
    "sum-over-zero": lambda h: h / (tf.reduce_sum(h) / 0.0 + 1.0),
    "sum-times-zero-keep": lambda h: h + tf.reduce_sum(h, _all_axes(h)[:-1] or None, keepdims=True) * 0.0,
    "mean-empty-axes": lambda h: h - tf.reduce_mean(h, []),
    "moments-empty-axes": lambda h: _moments(h, []),
    "moments-all": lambda h: _moments(h, _all_axes(h)),
    "divnonan-zero": lambda h: h - tf.math.divide_no_nan(tf.reduce_sum(h, [0]), 0.0),
    "weighted-zero": lambda h: (h - tf.nn.weighted_moments(h, [0], tf.zeros_like(h))[0]),
    "weighted-const-zero": lambda h: h - tf.nn.weighted_moments(h, [0], tf.constant(0.0))[0],
    "sufficient-zero-shift": lambda h: h - tf.nn.normalize_moments(
        *tf.nn.sufficient_statistics(h, [0], shift=tf.zeros([])), shift=tf.zeros([]))[0],
    "count-zero": lambda h: h - tf.reduce_sum(h, [0]) / tf.cast(tf.shape(h)[0] * 0, h.dtype),
    "ghost-one": lambda h: _moments(tf.reshape(h, [1, -1] + h.shape.as_list()[1:]), [0, 2, 3, 4]),
    "variance": lambda h: h / tf.math.reduce_std(h, [0]),
    "fused": lambda h: tf1.layers.batch_normalization(h, training=True, fused=True, name="bn"),
    "max-zero": lambda h: h * 0.0 - tf.reduce_max(h * 0.0, [0]),
}
GRADIENTS = ("none", "before", "after")


def _build(input_shape, block, gradients):
    graph = tf.Graph()
    with graph.as_default():
        losses = []
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, input_shape, name="x")
                w = tf1.get_variable("w", [], initializer=tf1.ones_initializer())
                y = BLOCKS[block](x * w)
                losses.append(tf.reduce_sum(tf.square(y)))
        if gradients == "before":
            return graph, lambda: tf.gradients(tf.add_n(losses), [w])
        if gradients == "after":
            tf.gradients(tf.add_n(losses), [w])
    return graph, None


def _legal(input_name: str, block: str) -> bool:
    """Whether TensorFlow builds the pair at all (a reduction over an axis a scalar lacks does not)."""
    try:
        _build(INPUTS[input_name], block, GRADIENTS[0])
    except (ValueError, TypeError, IndexError, tf.errors.InvalidArgumentError):
        return False
    return True


LEGAL = [pair for pair in itertools.product(INPUTS, BLOCKS) if _legal(*pair)]


def test_the_corpus_is_mostly_legal_graphs():
    assert len(LEGAL) >= 60, len(LEGAL)


@pytest.mark.parametrize("input_name,block", LEGAL)
def test_odd_graph_rewrites_or_refuses(input_name, block):
    for gradients in GRADIENTS:
        graph, then = _build(INPUTS[input_name], block, gradients)
        with graph.as_default(), warnings.catch_warnings():
            warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
            try:
                graphsync.rewrite_towers(graph)
            except graphsync.GraphsyncError as exc:
                assert "\n" not in str(exc), str(exc)
                continue
            if then is not None:
                then()
