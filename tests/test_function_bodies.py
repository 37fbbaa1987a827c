"""Batch statistics inside function bodies (graphsync/batch_axis/ follows tf.function calls
and the branches of control flow v2's If): a hand-written statistic in a @tf.function every tower
calls is inlined (graphsync/splice/inline.py), with its gradient call when gradients are built, and
synchronized as a reduction: one step then equals one device on the concatenated batch (the
un-rewritten graph does not); a call that only carries the batch (gelu) neither ends the trace nor
is inlined; a statistic in a tf.cond branch is refused in one line, the graph untouched.

Three uneven towers, float64: tolerance from towerlib.tolerance (2·u·√n, 4e-15); measured ≤ 1e-15,
un-rewritten 0.1 and more. Measured errors are printed by `-s`.
"""
import functools
import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import graphsync
import tiers
import towerlib as tl
from graphsync.graph.backward import is_backward
from graphsync import batch_axis

tf1 = tf.compat.v1
BATCHES = (2, 3, 4)
EPSILON = 1e-3
WIDTH = 5
IMAGE = (6, 6, 3)


def _conv(h, name, channels=4):
    w = tf1.get_variable(name, [3, 3, h.shape[-1], channels], h.dtype,
                         tf1.random_normal_initializer(stddev=0.3, seed=len(name)))
    return tf.nn.conv2d(h, w, 1, "SAME")


def _bodies():
    """name → a tf.function of h, written as users write them (built in the graph being built)."""
    @tf.function
    def mean_only(h):
        return h - tf.reduce_mean(h, [0, 1, 2])

    @tf.function
    def reduce_variance(h):
        return h * tf.math.rsqrt(tf.math.reduce_variance(h, [0, 1, 2]) + EPSILON)

    @tf.function
    def gelu(h):
        return tf.nn.gelu(h)

    @tf.function
    def nested(h):   # a per-example call around a statistic's call
        return gelu(reduce_variance(h))
    return {"mean_only": mean_only, "reduce_variance": reduce_variance, "gelu": gelu, "nested": nested}


def _model(form):
    def model(x):
        h = _bodies()[form](_conv(x, "c1"))
        return tf.reduce_mean(_conv(tf.nn.relu(h), "c2", WIDTH), [1, 2]), []
    return model


@functools.lru_cache(maxsize=None)
def _reference(form):
    x, t = tl.data(list(BATCHES), IMAGE, (WIDTH,), dtype=np.float64)
    ref = tl.reference_step(_model(form), list(BATCHES), x, t, dtype=tf.float64)
    return (x, t), ref, tl.tolerance(tf.float64, 0.0, sum(BATCHES) * 36)


def _errors(form, gradients="before", rewrite=True):
    (x, t), ref, _ = _reference(form)
    reports = []
    fn = (lambda g: reports.append(graphsync.rewrite_towers(g))) if rewrite else None
    built = tl.build(_model(form), list(BATCHES), gradients=gradients, rewrite=fn, dtype=tf.float64)
    got = tl.run_step(built, x, t, list(BATCHES))
    return {k: tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "variables")}, reports


@pytest.mark.parametrize("form,gradients", [("mean_only", "before"), ("mean_only", "after"),
                                            ("reduce_variance", "before-sum"),
                                            pytest.param("reduce_variance", "after", marks=tiers.full),
                                            ("nested", "before"), ("nested", "after")])
def test_a_statistic_in_a_tf_function_every_tower_calls_equals_one_device(form, gradients):
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphsync.GraphsyncWarning)   # nothing left per tower
        errors, reports = _errors(form, gradients)
    unsynchronized, _ = _errors(form, rewrite=False)
    tolerance = _reference(form)[2]
    print(f"\n{form} {gradients}: tolerance {tolerance:.1e}, rewritten {max(errors.values()):.1e} {errors}, "
          f"unrewritten {max(unsynchronized.values()):.1e}")
    report = reports[0]
    assert report.layers and {l.kind for l in report.layers} == {"reduction"}, str(report)
    assert max(errors.values()) < tolerance, (errors, tolerance)
    assert unsynchronized["output"] > 3 * tolerance and unsynchronized["grads"] > 3 * tolerance, unsynchronized


@pytest.mark.parametrize("gradients", ["after", "before"])
def test_a_call_that_only_carries_the_batch_is_traced_through_and_left_alone(gradients):
    """gelu in a tf.function (tf_keras' ConvNeXt calls one per block): the trace goes through the
    call, nothing is inlined, the graph is unchanged."""
    built = tl.build(_model("gelu"), list(BATCHES), dtype=tf.float64, gradients=gradients)
    analysis = batch_axis.analyze(built.graph)
    calls = [op for op in built.graph.get_operations() if op.type in ("PartitionedCall", "StatefulPartitionedCall")
             and not is_backward(op)]
    assert len(calls) == len(BATCHES) and not analysis.ended, analysis.ended
    assert all(analysis.carries(op.outputs[0]) for op in calls)
    assert all(analysis.batch.get(y.ref()) == frozenset({0}) for y in built.outputs)   # traced on past the call
    before = built.graph.as_graph_def()
    report = graphsync.rewrite_towers(built.graph)
    assert not report.changed and built.graph.as_graph_def() == before, report.summary


def _in_a_branch(x):
    training = tf1.placeholder_with_default(True, [], name="training")
    h = _conv(x, "c1")
    h = tf.cond(training, lambda: h - tf.reduce_mean(h, [0, 1, 2]), lambda: h)
    return tf.reduce_mean(_conv(tf.nn.relu(h), "c2", WIDTH), [1, 2]), []


def _returned_by_a_branch(x):   # the batch mean in training, the moving mean else: read back outside the If
    training = tf1.placeholder_with_default(True, [], name="training")
    h = _conv(x, "c1")
    moving = tf1.get_variable("moving_mean", [4], h.dtype, tf1.zeros_initializer(), trainable=False)
    h = h - tf.cond(training, lambda: tf.reduce_mean(h, [0, 1, 2]), lambda: tf.identity(moving))
    return tf.reduce_mean(_conv(tf.nn.relu(h), "c2", WIDTH), [1, 2]), []


def _metric_in_a_branch(x):   # a value of the whole batch returned by a branch, read back by nothing: terminal
    training = tf1.placeholder_with_default(True, [], name="training")
    h = _conv(x, "c1")
    metric = tf.cond(training, lambda: tf.reduce_mean(tf.square(h)), lambda: tf.constant(0.0, h.dtype))
    tf1.summary.scalar("metric", metric)
    return tf.reduce_mean(_conv(tf.nn.relu(h), "c2", WIDTH), [1, 2]), []


@pytest.mark.parametrize("gradients", ["after", "before"])
def test_a_statistic_in_a_cond_branch_is_refused_in_one_line_and_a_metric_there_left_alone(gradients):
    for model, read_back in ((_in_a_branch, ", and .* reads it back"), (_returned_by_a_branch, ", and the "
                                                                        r"branch returns it, and tower_0/\S+ reads it back")):
        graphs = []
        with pytest.raises(graphsync.GraphsyncError) as refused:
            tl.build(model, list(BATCHES), dtype=tf.float64, gradients=gradients,
                     rewrite=lambda g: graphs.append((g, g.as_graph_def())) or graphsync.rewrite_towers(g))
        message = str(refused.value)
        assert "\n" not in message and re.match(r"tower_0/cond \((Stateless)?If\) computes a batch statistic .* runs "
                                                r"the branch \S+, whose Mean \(Mean\) reduces over the batch"
                                                + read_back, message), message
        (graph, before), = graphs
        assert graph.as_graph_def() == before
    built = tl.build(_metric_in_a_branch, list(BATCHES), dtype=tf.float64, gradients=gradients)
    before = built.graph.as_graph_def()
    report = graphsync.rewrite_towers(built.graph)
    assert not report.changed and built.graph.as_graph_def() == before, report.summary


@pytest.mark.parametrize("gradients", ["after", "before"])
def test_allreduce_and_a_second_rewrite_changes_nothing(gradients):
    """The inlined calls are no longer run nor traced: the second rewrite finds the reductions synchronized."""
    (x, t), ref, tolerance = _reference("reduce_variance")
    built = tl.build(_model("reduce_variance"), list(BATCHES), gradients=gradients, dtype=tf.float64,
                     rewrite=lambda g: graphsync.rewrite_towers(g, strategy="allreduce"))
    got = tl.run_step(built, x, t, list(BATCHES))
    errors = {k: tl.max_rel_error(got[k], ref[k]) for k in ("output", "loss", "grads", "variables")}
    assert max(errors.values()) < tolerance, errors
    before = built.graph.as_graph_def()
    assert not graphsync.rewrite_towers(built.graph, strategy="allreduce").changed
    assert built.graph.as_graph_def() == before
