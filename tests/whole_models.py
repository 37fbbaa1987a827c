"""Whole third-party models (tf_keras.applications, tf_slim's nets) as 2 uneven towers: inspect,
rewrite, one training step, the towers' outputs against one device on the concatenated batch — a
call of the same model on the whole batch in the same graph and session, outside the towers,
which graphsync leaves alone. Shared by tests/test_applications.py and tests/test_slim_nets.py.

The tolerance is 4× that device's own noise (the batch reordered, put back in order), at least
1e-9; a model noisier than 1e-2 on one device is checked for its rewrite and step only, and must
not be one of the defaults a test names.
"""
import warnings

import numpy as np
import tensorflow as tf

import graphsync
import towerlib as tl

tf1 = tf.compat.v1
FLOOR = 1e-9
CONDITIONED = 1e-2   # above this one device disagrees with itself: no comparison can mean anything


def _run(graph, inputs, outputs, references, train, init, feed, step):
    """(error of the towers against one device, that device's own noise)."""
    with tf1.Session(graph=graph, config=tl.CONFIG) as sess:
        sess.run(init)
        got, (want, reordered) = sess.run([outputs, references], feed)
        if step:
            sess.run(train, feed)
    return tl.max_rel_error(np.concatenate(got), want), tl.max_rel_error(reordered, want)


def check(name, built, sizes, defaults, refusals_allowed=True):
    """`built` = (graph, inputs, outputs, (reference, reordered), train, init, size): rewrites it
    and asserts the towers equal one device (and differed before, when something was synchronized)."""
    graph, inputs, outputs, references, train, init, size = built
    x = np.random.RandomState(0).rand(sum(sizes), size, size, 3)
    feed = dict(zip(inputs, np.split(x, np.cumsum(sizes)[:-1])))
    unsynced, _ = _run(graph, inputs, outputs, references, train, init, feed, step=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
            plan, _ = graphsync.rewrite.plan_towers(graph)
            report = graphsync.rewrite_towers(graph)
    except graphsync.GraphsyncError as refused:   # a refusal is legal: one line, the graph unchanged
        assert "\n" not in str(refused)
        print(f"{name}: refused: {refused}")
        assert refusals_allowed or name not in defaults, f"{name} refused: {refused}"
        return
    assert len(report.layers) == len(plan.layers)
    error, noise = _run(graph, inputs, outputs, references, train, init, feed, step=True)
    tolerance = max(4 * noise, FLOOR)
    print(f"{name}: {len(report.layers)} layers, error {error:.2g}, one device's noise {noise:.2g}, "
          f"unsynchronized {unsynced:.2g}, trace ends {len(plan.trace_ended)} {[op for op, _ in plan.trace_ended][:3]}")
    if noise > CONDITIONED:
        assert name not in defaults, f"{name} is ill-conditioned at {size}×{size}: take it out of the defaults"
        return
    assert error <= tolerance, (error, noise, unsynced)
    if report.layers:
        assert unsynced > 3 * tolerance, (unsynced, tolerance)
    else:   # nothing to synchronize (layer norm, no batch norm): the towers were right already
        assert unsynced <= tolerance, (unsynced, tolerance)
