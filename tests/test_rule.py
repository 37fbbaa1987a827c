"""The rule (graphsync/batch_axis/, graphsync/plan/rule.py): every op combining a tower's
examples gets a verdict; a Sum or Mean over the batch no form covers is synchronized as a
reduction (graphsync/plan/reductions.py; numbers in tests/test_reductions.py), and a batch
statistic nothing synchronizes is refused in one line, the graph left as it was (issue 30's table,
fixed crop and batch sizes, 3 uneven towers), where it used to train per tower without a word.
Losses, metrics, summaries, layer norm: left exactly as they were.
"""
import re

import numpy as np
import pytest
import tensorflow as tf

import graphsync
import towerlib as tl
from graphsync import batch_axis
from graphsync.plan import rule
from graphsync.towers.scopes import find_towers

tf1 = tf.compat.v1
BATCHES = (2, 3, 5)


def _conv(h, name, channels=4):
    w = tf1.get_variable(name, [3, 3, h.shape[-1], channels], h.dtype,
                         tf1.random_normal_initializer(stddev=0.3, seed=len(name)))
    return tf.nn.conv2d(h, w, 1, "SAME")


def _mask(h):   # a per-pixel mask computed in the tower, from the data
    return tf.cast(h[..., :1] > -0.5, h.dtype)


FORMS = {   # the table: written as users write them; each trained per tower in silence
    "weighted_moments, folded": lambda h: h - tf.nn.weighted_moments(h, [0, 1, 2], _mask(h))[0],
    "reduce_variance": lambda h: h * tf.math.rsqrt(tf.math.reduce_variance(h, [0, 1, 2]) + 1e-3),
    "reduce_std": lambda h: h / (tf.math.reduce_std(h, [0, 1, 2]) + 1e-3),
    "mean only": lambda h: h - tf.reduce_mean(h, [0, 1, 2]),
    "hand mask": lambda h: h - tf.reduce_sum(h * _mask(h), [0, 1, 2]) / tf.reduce_sum(_mask(h), [0, 1, 2]),
    "top-k read back": lambda h: h - tf.reduce_mean(tf.math.top_k(tf.transpose(h, [1, 2, 3, 0]), 2)[0], [0, 1, 3]),
    "max centring": lambda h: h - tf.reduce_max(h, [0, 1, 2]),
    "batch contraction": lambda h: h + tf.matmul(tf.reshape(h, [-1, 4]), tf.reshape(h, [-1, 4]), transpose_a=True)[0],
    # sums a synchronization would get wrong: what meets them depends on the tower's share of the batch
    "shift from an example": lambda h: h - (tf.reduce_mean(h - tf.stop_gradient(h[:1]), [0, 1, 2])
                                            + tf.reduce_mean(tf.stop_gradient(h[:1]), [0, 1, 2])),
    "count from the shape": lambda h: h - tf.reduce_sum(h, [0, 1, 2]) / tf.cast(tf.shape(h)[0] * 36, h.dtype),
    "count as a constant": lambda h: h - tf.reduce_sum(h, [0, 1, 2]) / float(h.shape[0] * 36),
    "count from the size": lambda h: h - tf.reduce_sum(h, [0, 1, 2]) * (4.0 / tf.cast(tf.size(h), h.dtype)),
    "unbiased, a constant": lambda h: h * tf.math.rsqrt(tf.reduce_sum(tf.square(h), [0, 1, 2]) / float(h.shape[0] * 36 - 1)
                                                        + 1e-3),
    # a dropout mask is made from the tower's shape, but holds no count: synchronized
    "variance after dropout": lambda h: (lambda d: d * tf.math.rsqrt(tf.math.reduce_variance(d, [0, 1, 2]) + 1e-3))(
        tf.nn.dropout(h, 0.3, seed=1)),
}
TOWER_DEPENDENT = {   # plan/tower_dependent.py: the value each refusal names
    "shift from an example": r"made with tower_0/model/strided_slice \(StridedSlice: a slice that selects some of",
    "count from the shape": r"meets tower_0/model/Cast \(Cast: the tower's own count of elements, 72\)",
    "count as a constant": r"meets tower_0/model/truediv/y \(Const: the tower's own count of elements, 72\)",
    "count from the size": r"meets tower_0/model/truediv \(RealDiv: the tower's own count of elements, 72\)",
    "unbiased, a constant": r"meets tower_0/model/truediv/y \(Const: the tower's own count less one, 71\)",
}
SYNCHRONIZED = ("weighted_moments, folded", "reduce_variance", "reduce_std", "mean only", "hand mask", "max centring",
                "variance after dropout")
REFUSED = tuple(form for form in FORMS if form not in SYNCHRONIZED)   # no sum over the towers makes them one device's


def _static_towers(form, batches=BATCHES, dynamic=False):
    graph = tf.Graph()
    with graph.as_default():
        for i, n in enumerate(batches):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, [None if dynamic else n, 6, 6, 3], name="x")
                h = FORMS[form](_conv(x, "c1"))
                y = _conv(tf.nn.relu(h), "c2")
                loss = tf.reduce_sum(tf.square(y))
                tf.gradients(loss, tf1.trainable_variables())
    return graph


@pytest.mark.parametrize("form", SYNCHRONIZED)
def test_sums_and_means_of_the_table_are_synchronized_as_reductions(form):
    graph = _static_towers(form)
    report = graphsync.rewrite_towers(graph)
    assert report.layers and {layer.kind for layer in report.layers} == {"reduction"}, str(report)
    assert all(len(layer.tower_ops) == len(BATCHES) for layer in report.layers)
    plan, _ = graphsync.rewrite.plan_towers(graph)   # the result holds no per-tower batch statistic
    assert "refused" not in {r.verdict for r in plan.cross_example}, plan.cross_example


@pytest.mark.parametrize("form", REFUSED)
def test_what_no_sum_synchronizes_is_refused_in_one_line_and_the_graph_left_alone(form):
    graph = _static_towers(form)
    before = graph.as_graph_def(add_shapes=False).SerializeToString(deterministic=True)
    with pytest.raises(graphsync.GraphsyncError, match="computes a batch statistic graphsync cannot synchronize") as err:
        graphsync.rewrite_towers(graph)
    message = str(err.value)
    assert "\n" not in message and message.startswith("tower_0/"), message
    assert re.search(TOWER_DEPENDENT.get(form, ""), message), message
    assert graph.as_graph_def(add_shapes=False).SerializeToString(deterministic=True) == before


@pytest.mark.parametrize("form,named", [("shift from an example", r"strided_slice \(StridedSlice: a slice that selects"),
                                        ("count from the shape", r"Shape \(Shape: the tower's own batch size\)")])
def test_with_a_dynamic_batch_the_tower_dependent_value_is_named_too(form, named):
    with pytest.raises(graphsync.GraphsyncError, match=named):
        graphsync.rewrite_towers(_static_towers(form, dynamic=True))


def _top_k_centred(x):
    h = _conv(x, "c1")
    return _conv(tf.nn.relu(FORMS["top-k read back"](h)), "c2", 5)[:, 0, 0, :], []


def test_the_refused_form_trained_per_tower_unlike_one_device():
    """Why refusing is right: left as it is, a centring on the batch's top 2 differs from one
    device (a top-k over the towers is not synchronized)."""
    x, t = tl.data(list(BATCHES), (6, 6, 3), (5,))
    ref = tl.reference_step(_top_k_centred, list(BATCHES), x, t)
    per_tower = tl.run_step(tl.build(_top_k_centred, list(BATCHES)), x, t, list(BATCHES))
    assert tl.max_rel_error(per_tower["output"], ref["output"]) > 1e-2
    with pytest.raises(graphsync.GraphsyncError, match="TopKV2"):
        tl.build(_top_k_centred, list(BATCHES), rewrite=graphsync.rewrite_towers)


def _left_alone_model(x):
    h = _conv(x, "c1")
    m, v = tf.nn.moments(h, [1, 2, 3], keepdims=True)                # layer norm
    h = (h - m) * tf.math.rsqrt(v + 1e-3)
    m, v = tf.nn.moments(h, [1, 2], keepdims=True)                   # instance norm
    h = tf.nn.relu((h - m) * tf.math.rsqrt(v + 1e-3))
    y = tf.reduce_mean(_conv(h, "c2", 5), [1, 2])                    # global pooling
    tf1.summary.scalar("batch_mean", tf.reduce_mean(y))              # a summary
    tf1.summary.histogram("activations", h)
    tf.reduce_mean(tf.cast(tf.equal(tf.argmax(y, 1), 0), tf.float32))   # a metric
    hardest = tf.math.top_k(tf.reduce_sum(tf.square(y), 1), 2)[0]    # hard examples, into a loss only
    tf1.add_to_collection("extra_loss", tf.reduce_sum(hardest) / tf.cast(tf.shape(y)[0], tf.float32))
    return y, []


def test_layer_instance_norm_losses_metrics_summaries_left_exactly_as_they_were():
    built = tl.build(_left_alone_model, list(BATCHES))
    before = built.graph.as_graph_def(add_shapes=False).SerializeToString(deterministic=True)
    report = graphsync.rewrite_towers(built.graph)
    assert not report.changed
    assert built.graph.as_graph_def(add_shapes=False).SerializeToString(deterministic=True) == before
    plan, _ = graphsync.rewrite.plan_towers(built.graph)
    verdicts = {r.verdict for r in plan.cross_example}
    assert verdicts == {"terminal"}, plan.cross_example


def test_verdicts_synchronized_ghost_terminal_and_where_the_trace_ended():
    graph = tf.Graph()
    with graph.as_default():
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
                h = tf1.layers.batch_normalization(_conv(x, "c1"), training=True, name="bn")
                h = tf1.layers.batch_normalization(h, training=True, fused=False, virtual_batch_size=2, name="ghost")
                h = tf.nn.relu(h)
                odd = tf.raw_ops.Bitcast(input=h, type=tf.int32)          # no rule: the trace ends here
                tf.reduce_sum(tf.square(_conv(h, "c2"))) + tf.cast(tf.reduce_sum(odd), tf.float32)
        plan, _ = graphsync.rewrite.plan_towers(graph)
    by_op = {r.op: r.verdict for r in plan.cross_example}
    assert by_op["tower_0/model/bn/FusedBatchNormV3"] == "synchronized", by_op
    assert any(r.verdict == "per tower" and "/ghost/moments/" in r.op and r.tower == "tower_0"
               for r in plan.cross_example), plan.cross_example   # virtual batches: said, kept per tower
    assert any(v == "terminal" for v in by_op.values())
    assert any(op.startswith("tower_0/") and "Bitcast" in op for op, _ in plan.trace_ended), plan.trace_ended
    assert plan.unfollowed == (), plan.unfollowed   # past the Bitcast only a loss: nothing read back


def _uneven_towers(tail):
    """3 towers of BATCHES examples, static shapes: a convolution, then `tail(h)` in the tower."""
    graph = tf.Graph()
    with graph.as_default():
        for i, n in enumerate(BATCHES):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                tail(_conv(tf1.placeholder(tf.float32, [n, 6, 6, 3], name="x"), "c1"))
    return graph


def test_a_reduction_past_where_the_trace_ended_read_back_is_said_in_one_line():
    """Past a reshape whose target the tracer cannot read the batch's axes are unknown: a mean
    there that the model reads back may be a batch statistic, and graphsync says so
    (batch_axis/unfollowed.py). No declaration could help, so it is a warning, not a refusal."""
    def tail(h):
        shape = tf1.Variable(h.shape.as_list(), trainable=False, name="shape")
        h = tf.ensure_shape(tf.reshape(h, shape.read_value()), h.shape)   # a target held in a variable: not read
        h = h - tf.reduce_mean(h, [0, 1, 2])                    # unseen by the rule: no axes past the reshape
        tf.reduce_sum(tf.square(_conv(h, "c2")))
    graph = _uneven_towers(tail)
    with graph.as_default():
        plan, _ = graphsync.rewrite.plan_towers(graph)
        assert sorted((u.op, u.end) for u in plan.unfollowed) == [
            (f"tower_{i}/model/Mean", f"tower_{i}/model/Reshape") for i in range(3)], plan.unfollowed
        with pytest.warns(graphsync.GraphsyncWarning) as said:
            graphsync.rewrite_towers(graph)
    message, = [str(w.message) for w in said]
    assert "\n" not in message and message.startswith("tower_") and "/model/Mean (Mean) reduces a tensor the batch " \
        "axis could not be followed into (past tower_" in message and "(and 2 more: graphsync inspect)" in message, message


def test_the_analysis_runs_again_after_the_rewrite():
    """check_rewritten names a batch statistic still per tower in the result (here: one the plan
    never covered, as a bug of the splice would leave it)."""
    graph = _static_towers("mean only")
    towers = find_towers(["tower_0/a", "tower_1/a", "tower_2/a"])
    fake = type("Plan", (), {"towers": towers, "process_group": None})()
    with pytest.raises(graphsync.GraphsyncError, match="internal: tower_0/model/Mean .* still computes"):
        rule.check_rewritten(graph, fake, {}, version=graph.version)


@pytest.mark.parametrize("shape,perm,expect", [
    ([8, 6], None, {0}), ([None, 6], None, {0}),
])
def test_reshape_rules_split_and_merge(shape, perm, expect):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, shape)
        merged = tf.reshape(x, [-1])
        split = tf.reshape(x, [2, -1, 6])
        moved = tf.transpose(split, [1, 2, 0])
    analysis = batch_axis.analyze(graph)
    assert analysis.batch[x.ref()] == frozenset(expect)
    assert analysis.batch[merged.ref()] == frozenset({0})
    assert analysis.batch[split.ref()] == frozenset({0, 1})
    assert analysis.batch[moved.ref()] == frozenset({2, 0})


def _worker_graph(towers_per_worker, variables_on=None):
    """One between-graph worker's graph: a fused batch norm, then a mean-only one written by hand."""
    graph = tf.Graph()
    with graph.as_default():
        for i in range(towers_per_worker):
            scope = f"tower_{i}" if towers_per_worker > 1 else ""
            setter = tf1.train.replica_device_setter(1, ps_device=variables_on, worker_device=f"/job:worker/task:0/cpu:{i}")
            with tf1.device(setter if variables_on else f"/cpu:{i}"), tf1.name_scope(scope or None), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, [3, 6, 6, 3], name="x")
                h = tf1.layers.batch_normalization(_conv(x, "c1"), training=True, fused=True, name="bn")
                h = _conv(FORMS["mean only"](_conv(tf.nn.relu(h), "c2")), "c3")
                tf.gradients(tf.reduce_sum(tf.square(h)), tf1.trainable_variables())
    return graph


@pytest.mark.parametrize("towers_per_worker", [1, 2])
def test_between_graph_workers_sum_reductions_over_every_process(towers_per_worker):
    """Between-graph replication (a process group): a reduction the rule finds is summed over every
    worker's towers by the batch norms' collectives, even with one tower per worker (numbers:
    tests/test_reductions.py, between worker processes)."""
    graph = _worker_graph(towers_per_worker)
    report = graphsync.rewrite_towers(graph, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 0))
    assert [l.kind for l in report.layers] == ["fused", "reduction"], str(report)
    assert [len(l.tower_ops) for l in report.layers] == [towers_per_worker] * 2


def test_through_a_parameter_server_reductions_take_its_queues():
    """A step through a parameter server exchanges by queues on it, reductions too (numbers:
    tests/test_reductions.py, between worker processes through a ps)."""
    graph = _worker_graph(1, variables_on="/job:ps")
    report = graphsync.rewrite_towers(graph, strategy="allreduce", process_group=graphsync.ProcessGroup(2, 0))
    assert report.strategy == "ps" and [l.kind for l in report.layers] == ["fused", "reduction"], str(report)


def _tensordot_graph(shape, channels=5):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, shape, name="x")
        w = tf1.get_variable("w", [shape[-1], channels])
        y = tf.tensordot(x, w, [[len(shape) - 1], [0]])      # a Dense layer on a 4-D input
    return graph, x, y


@pytest.mark.parametrize("shape", [[None, 4, 4, 3], [2, 4, 4, 3], [None, None, None, 3], [None, 1, 1, 3]])
def test_reshape_rules_follow_a_computed_shape(shape):
    """tf.tensordot (tf_keras' Dense on [N, H, W, C]: ConvNeXt's pointwise convs) reshapes to
    [N·H·W, C] and back with shapes computed from Shape/GatherV2/Prod/ConcatV2 when N is unknown:
    the trace reads them as the dimensions they gather and carries the batch on N, not on H, W."""
    graph, x, y = _tensordot_graph(shape)
    analysis = batch_axis.analyze(graph)
    assert not analysis.ended, analysis.ended
    reshapes = [op for op in graph.get_operations() if op.type == "Reshape"]
    assert len(reshapes) == 2
    assert analysis.batch[reshapes[0].outputs[0].ref()] == frozenset({0})   # [N·H·W, C]: merged
    assert analysis.batch[y.ref()] == frozenset({0})                          # [N, H, W, units]


def test_reshape_by_computed_shape_keeps_merged_examples_and_reads_nothing_it_cannot_match():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, None, 3], name="x")
        s = tf.shape(x)
        moved = tf.transpose(x, [1, 0, 2])                               # [T, N, 3]
        merged = tf.reshape(moved, tf.stack([s[1] * s[0], 3]))          # examples inside a mixed axis
        back = tf.reshape(merged, tf.concat([tf.gather(s, [1, 0]), [3]], 0))   # [T, N, 3] again
        other = tf1.placeholder(tf.int32, [2], name="other")
        unmatched = tf.reshape(x, tf.concat([other, [-1]], 0))           # a shape not read from x
    analysis = batch_axis.analyze(graph)
    assert analysis.batch[merged.ref()] == frozenset({0})
    assert analysis.batch[back.ref()] == frozenset({1})
    assert [op for op, _ in analysis.ended] == [unmatched.op], analysis.ended


def test_convnext_like_block_no_longer_ends_the_trace():
    """tf_keras' ConvNeXt block, small: depthwise conv, layer norm, Dense–gelu–Dense on [N, H, W, C],
    a batch norm after; the batch norm is found and the trace does not end."""
    import tf_keras
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4, 4, 3], name="x")
        h = tf_keras.layers.DepthwiseConv2D(3, padding="same")(x)
        h = tf_keras.layers.LayerNormalization(epsilon=1e-6)(h)
        h = tf_keras.layers.Dense(8, activation="gelu")(h)
        h = tf_keras.layers.Dense(3)(h)
        h = tf_keras.layers.BatchNormalization()(x + h, training=True)
        y = tf.reduce_mean(h, [1, 2])
    analysis = batch_axis.analyze(graph)
    assert not analysis.ended, analysis.ended
    assert analysis.batch[y.ref()] == frozenset({0})
    assert any(c.how == "kernel" for c in analysis.cross.values()), analysis.cross


def test_reshape_by_factors_reads_no_order_a_transpose_mixed():
    """[H, N, C] reshaped to [N·H, C] by a shape computed from the original [N, H, C], and back to
    [N, H, C]: the rows are h·N + n, not n·H + h, so both axes of the result hold examples."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, None, 3], name="x")
        s = tf.shape(x)
        mixed = tf.reshape(tf.transpose(x, [1, 0, 2]), tf.stack([tf.reduce_prod(tf.gather(s, [0, 1])), 3]))
        back = tf.reshape(mixed, tf.concat([tf.gather(s, [0, 1]), [3]], 0))
    analysis = batch_axis.analyze(graph)
    assert analysis.batch[mixed.ref()] == frozenset({0})
    assert analysis.batch.get(back.ref()) in (frozenset({0, 1}), None), analysis.batch.get(back.ref())


def test_cross_entropy_with_labels_from_the_data_does_not_end_the_trace():
    """Labels fed with the examples carry the batch too (every data-fed loss): the trace goes on to
    the loss, whose mean over the batch is terminal; logits and labels on different axes end it."""
    graph = tf.Graph()
    with graph.as_default():
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                    tf1.variable_scope("model", reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
                labels = tf1.placeholder(tf.int32, [None], name="labels")
                logits = tf.reduce_mean(_conv(tf.nn.relu(_conv(x, "c1")), "c2", 5), [1, 2])
                tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
                dense = tf.nn.softmax_cross_entropy_with_logits(labels=tf.one_hot(labels, 5), logits=logits)
                tf.reduce_mean(dense, name="dense_loss")
                tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=tf.transpose(logits), labels=tf.one_hot(labels, 5))
    analysis = batch_axis.analyze(graph)
    ends = {op.name: why for op, why in analysis.ended}
    assert all("Transpose" not in name and "SoftmaxCrossEntropyWithLogits" in name for name in ends), ends
    assert len(ends) == 2 and all("different axes" in why for why in ends.values()), ends
    for i in range(2):
        loss = graph.get_operation_by_name(f"tower_{i}/model/dense_loss")
        assert analysis.cross[loss].how == "reduce"
        assert batch_axis.judge(analysis, analysis.cross[loss])[0] == batch_axis.Verdict.TERMINAL


def test_a_statistic_whose_readers_outgrow_the_walk_is_not_judged_terminal():
    """The walk that decides whether a value flows back into the examples has a budget; a value
    whose readers it could not all visit is taken for a batch statistic (and said), never left
    per tower as terminal on what the walk happened to see."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4], initializer=tf1.ones_initializer())
        m = tf.reduce_mean(x, 0)
        far = m
        for _ in range(30):                                     # a long chain before the value returns
            far = tf.math.sin(far)
        (x - far) * w
    analysis = batch_axis.analyze(graph)
    crossed = analysis.cross[m.op]
    assert batch_axis.judge(analysis, crossed)[0] == batch_axis.Verdict.STATISTIC
    verdict, why = batch_axis.judge(analysis, crossed, budget=10)
    assert verdict == batch_axis.Verdict.STATISTIC and "more than 10 ops, not all followed" in why, why


def _read_back_bitcast(h):
    odd = tf.raw_ops.Bitcast(input=tf.raw_ops.Bitcast(input=h, type=tf.int32), type=tf.float32)
    lost = tf.raw_ops.Bitcast(input=h, type=tf.int32, name="to_loss")
    tf.reduce_sum(tf.square(_conv(odd, "c2"))) + tf.cast(tf.reduce_sum(lost), tf.float32)


def test_an_op_type_without_a_rule_whose_value_is_read_back_is_refused():
    """The op where the trace ends may combine examples itself (an op type the rule has no entry
    for): when the model reads its value back the rewrite is refused in one line naming it and the
    remedy, the graph left alone; one whose value reaches only a loss is not named."""
    graph = _uneven_towers(_read_back_bitcast)
    with graph.as_default():
        before = graph.as_graph_def()
        with pytest.raises(graphsync.GraphsyncError) as refused:
            graphsync.rewrite_towers(graph)
    message = str(refused.value)
    assert "\n" not in message and "/model/Bitcast (Bitcast) holds the batch and the trace cannot follow it " \
        "(no rule for op type Bitcast), and the model reads its value back (and 2 more: graphsync inspect): " \
        "graphsync cannot tell whether Bitcast combines examples; if it keeps each example apart (batch on axis 0), " \
        "declare it: GRAPHSYNC_PER_EXAMPLE_OPS=Bitcast; else compute it outside the towers" in message, message
    assert "to_loss" not in message
    assert graph.as_graph_def() == before


def test_an_op_type_declared_per_example_is_followed(monkeypatch):
    """Declared (GRAPHSYNC_PER_EXAMPLE_OPS), the op carries the batch on axis 0 like a convolution:
    the trace goes on, nothing is refused, and a statistic past it is found by the rule."""
    monkeypatch.setenv(batch_axis.PER_EXAMPLE_ENV, " Bitcast ,Erfinv")
    graph = _uneven_towers(_read_back_bitcast)
    analysis = batch_axis.analyze(graph)
    assert not [op for op, _ in analysis.ended if op.name.startswith("tower_")], analysis.ended
    with graph.as_default():
        assert not graphsync.rewrite_towers(graph).changed   # nothing to synchronize, nothing refused
    past = _uneven_towers(lambda h: _read_back_bitcast(h - tf.reduce_mean(
        tf.raw_ops.Bitcast(input=tf.raw_ops.Bitcast(input=h, type=tf.int32), type=tf.float32), [0, 1, 2])))
    verdicts = {r.op: r.verdict for r in graphsync.rewrite.plan_towers(past)[0].cross_example}
    assert verdicts.get("tower_0/model/Mean") == "synchronized", verdicts
