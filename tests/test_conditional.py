"""Batch norm behind a tensor-valued training flag (If/StatelessIf under control flow v2,
Switch/Merge under v1): with the flag True one step of the rewritten graph equals one device on the
concatenated batch (and the un-rewritten graph does not); with the flag False it computes what the
original graph computes, and its statistics exchange does not run (measured from the step
statistics of an evaluation step).

Tolerances: float32 models this shallow agree with the reference to ~1e-6 (measured); with the flag
False the rewritten graph runs the original ops (measured difference 0).
"""
import functools
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import conditional_models as cm
import graphsync
from graphsync.graph.marks import is_recomputed
from graphsync.graph.backward import is_backward
import tiers
import towerlib as tl

tf1 = tf.compat.v1
TOLERANCE = 2e-5
UNSYNCED_MIN_ERROR = 1e-3
MODELS = {"layers": cm.layers_bn, "slim": cm.slim, "keras-layer": cm.keras_layers, "keras-model": cm.keras_model}
INPUT, OUTPUT = (6, 6, 3), (5,)


def _feed(built, x, t, batch_sizes, flag):
    splits = np.cumsum(batch_sizes)[:-1]
    feed = dict(zip(built.inputs, np.split(x, splits)))
    feed.update(zip(built.targets, np.split(t, splits)))
    feed[built.flag] = flag
    return feed


def _step(built, x, t, batch_sizes, flag):
    """tl.run_step with the training flag fed."""
    return tl.run_step(built, x, t, batch_sizes, extra_feed={built.flag: flag})


def exchange_traffic(built, x, t, batch_sizes, flag):
    """(ops, bytes) of the statistics exchange in one evaluation step (outputs and losses fetched),
    from TensorFlow's step statistics: the ops that ran in graphsync's aggregation scope or as
    collectives, constants aside (they hold no statistic), and the bytes the synchronized layers
    moved across devices (the cross-device edges `graphsync verify` counts per layer)."""
    from graphsync.towers.scopes import find_towers
    from graphsync.verification import trace
    from graphsync.verification.discovery import batch_norm
    meta = tf1.RunMetadata()
    with tf1.Session(graph=built.graph, config=tl.CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(built.outputs + built.losses, _feed(built, x, t, batch_sizes, flag),
                 options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True),
                 run_metadata=meta)
    ops = 0
    for device in meta.step_stats.dev_stats:
        for node in device.node_stats:
            kind = node.timeline_label.partition(" = ")[2].partition("(")[0]
            if (node.node_name.startswith("graphsync/") or "Collective" in kind) and kind != "Const":
                ops += 1
    towers = find_towers([op.name for op in built.graph.get_operations()])
    layers, _ = trace.traffic(meta, batch_norm.synchronized_layers(built.graph, towers), trace.exchanges(built.graph))
    assert layers
    return ops, sum(layer.total for layer in layers)


def _build(model, batch_sizes, version, **kw):
    with cm.control_flow(version):
        built = tl.build(model, batch_sizes, input_shape=INPUT, **kw)
    built.flag = model.flag(built.graph)
    return built


@functools.lru_cache(maxsize=None)
def _data(batch_sizes):
    return tl.data(list(batch_sizes), INPUT, OUTPUT)


@functools.lru_cache(maxsize=None)
def _reference(flavour, version, batch_sizes):
    """One device, the concatenated batch, flag True; per-tower losses on its slices."""
    return _reference_on(flavour, version, batch_sizes, *_data(batch_sizes))


def _reference_on(flavour, version, batch_sizes, x, t):
    ref = _build(MODELS[flavour](), [sum(batch_sizes)], version, scope="", devices=["/cpu:0"],
                 grad_divisor=len(batch_sizes))
    result = _step(ref, x, t, [sum(batch_sizes)], True)
    per_example = np.square(result["output"] - t.astype(np.float64)).reshape(len(x), -1).sum(1) * 0.5
    result["loss"] = np.array([p.sum() for p in np.split(per_example, np.cumsum(batch_sizes)[:-1])])
    return result


def _errors(got, want):
    return {k: tl.max_rel_error(got[k], want[k]) for k in want}


CASES = [(f, v, g, b) for f in MODELS for v in ("v2", "v1") for g, b in (("after", (3, 5)), ("before", (2, 3, 4)))]


IDS = [f"{f}-{v}-{g}-{'x'.join(map(str, b))}" for f, v, g, b in CASES]
FAST = {"layers-v1-after-3x5", "keras-layer-v2-before-2x3x4"}   # both control flows, before and after


@pytest.mark.parametrize("flavour,version,gradients,batch_sizes", tiers.cases(CASES, IDS, FAST))
def test_flag_true_equals_one_device_flag_false_equals_original(flavour, version, gradients, batch_sizes):
    x, t = _data(batch_sizes)
    reports = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
        built = _build(MODELS[flavour](), list(batch_sizes), version, gradients=gradients,
                       rewrite=lambda g: reports.append(graphsync.rewrite_towers(g)))
    original = _build(MODELS[flavour](), list(batch_sizes), version, gradients=gradients)
    assert len(reports[0].layers) == 2 and {l.kind for l in reports[0].layers} == {"conditional"}, reports[0]

    errors = _errors(_step(built, x, t, batch_sizes, True), _reference(flavour, version, batch_sizes))
    assert max(errors.values()) < TOLERANCE, errors
    unsynced = _errors(_step(original, x, t, batch_sizes, True), _reference(flavour, version, batch_sizes))
    for key in ("output", "loss", "grads", "moving"):
        assert unsynced[key] > UNSYNCED_MIN_ERROR, (key, unsynced)

    evaluation = _errors(_step(built, x, t, batch_sizes, False), _step(original, x, t, batch_sizes, False))
    assert max(evaluation.values()) == 0.0, evaluation
    assert exchange_traffic(built, x, t, batch_sizes, False) == (0, 0)
    ops, n_bytes = exchange_traffic(built, x, t, batch_sizes, True)
    assert ops > 0 and n_bytes > 0   # the measurement sees the exchange when it runs


@pytest.mark.parametrize("version", [pytest.param("v2", marks=tiers.full), "v1"])
def test_allreduce(version):
    batch_sizes = (3, 5)
    x, t = _data(batch_sizes)
    built = _build(MODELS["layers"](), list(batch_sizes), version,
                   rewrite=lambda g: graphsync.rewrite_towers(g, strategy="allreduce"))
    errors = _errors(_step(built, x, t, batch_sizes, True), _reference("layers", version, batch_sizes))
    assert max(errors.values()) < TOLERANCE, errors
    original = _build(MODELS["layers"](), list(batch_sizes), version)
    evaluation = _errors(_step(built, x, t, batch_sizes, False), _step(original, x, t, batch_sizes, False))
    assert max(evaluation.values()) == 0.0, evaluation
    assert exchange_traffic(built, x, t, batch_sizes, False) == (0, 0)
    assert exchange_traffic(built, x, t, batch_sizes, True)[0] > 0


def test_towers_behind_different_flags_are_refused():
    def model(x):
        flag = tf1.placeholder_with_default(True, [], name="is_training")   # one per tower
        h = tf1.layers.batch_normalization(x, training=flag, fused=True, name="bn")
        return tf.reduce_mean(h, [1, 2]), []
    built = tl.build(model, [2, 2], input_shape=INPUT)
    before = built.graph.as_graph_def()
    with pytest.raises(graphsync.GraphsyncError, match=r"different training flag.*tower_0/is_training.*tower_1/is_training"):
        graphsync.rewrite_towers(built.graph)
    assert built.graph.as_graph_def() == before


def test_rewriting_twice_changes_nothing():
    built = _build(MODELS["layers"](), [2, 3], "v2", rewrite=graphsync.rewrite_towers)
    report = graphsync.rewrite_towers(built.graph)
    assert not report.changed and "already synchronized" in report.summary, report


def test_private_control_flow_helpers():
    """tf_private.cond_predicate and in_while_loop read TensorFlow's v1 control-flow contexts."""
    from graphsync.graph import tf_private
    with cm.control_flow("v1"), tf.Graph().as_default():
        flag = tf1.placeholder(tf.bool, [])
        inside = []
        tf.cond(flag, lambda: inside.append(tf.identity(1.0)) or inside[-1], lambda: tf.constant(0.0))
        loop = []
        tf.while_loop(lambda i: i < 3, lambda i: loop.append(tf.identity(i)) or loop[-1] + 1, [0])
    from graphsync.plan.training_flag import predicate
    assert predicate(tf_private.cond_predicate(inside[0].op)) is flag and not tf_private.in_while_loop(inside[0].op)
    assert tf_private.in_while_loop(loop[0].op) and tf_private.cond_predicate(flag.op) is None


@tiers.full
def test_keras_application_behind_the_learning_phase():
    """MobileNetV2 (52 batch norms) called without training= in a tower loop: each batch norm is an
    If on the learning phase. verify feeds the flag True by itself and says so; it fails before the
    rewrite and passes after (MobileNetV2 at initialization amplifies float rounding: the check is
    the verdict and the gap to the original, as in test_verify.py)."""
    import tf_keras
    graph = tf.Graph()
    with graph.as_default():   # set_random_seed also seeds the default graph: not the process's own
        tf_keras.utils.set_random_seed(0)
        model = tf_keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=5)
        optimizer = tf1.train.GradientDescentOptimizer(0.1)
        tower_grads = []
        for i in range(2):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"):
                images = tf1.placeholder(tf.float32, [None, 32, 32, 3], name="images")
                labels = tf1.placeholder(tf.int32, [None], name="labels")
                loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(labels, model(images)),
                                      name="loss")
                if i == 0:
                    updates = model.get_updates_for(images)
                tower_grads.append(optimizer.compute_gradients(loss, model.trainable_variables))
        averaged = [(tf.add_n([g for g, _ in gv]) / 2, gv[0][1]) for gv in zip(*tower_grads)]
        with tf.control_dependencies(updates):
            optimizer.apply_gradients(averaged)
    before = graphsync.verify(graph)
    report = graphsync.rewrite_towers(graph)
    after = graphsync.verify(graph)
    assert len(report.layers) == 52 and {l.kind for l in report.layers} == {"conditional"}
    assert not before.passed and after.passed, after.format()
    assert after.rewritten.largest()[1] * 10 < before.rewritten.largest()[1]
    assert after.rewritten.batch_norm_running == [] and before.rewritten.batch_norm_running
    assert any("keras_learning_phase" in note and "True" in note for note in after.notes), after.notes


def test_saved_graph_inspect_rewrite_verify(tmp_path):
    """The command line on a saved MetaGraphDef: inspect shows the layers as conditional, rewrite
    writes the synchronized graph, verify passes it and says it fed the flag True itself."""
    from click.testing import CliRunner
    from cli.main import main
    built = _build(MODELS["layers"](), [3, 5], "v2")
    saved, synced = str(tmp_path / "flag.meta"), str(tmp_path / "flag_sync.meta")
    tf1.train.export_meta_graph(saved, graph=built.graph)
    runner = CliRunner()
    inspected = runner.invoke(main, ["inspect", saved])
    assert inspected.exit_code == 0 and "bn0/cond  conditional  sync" in inspected.output, inspected.output
    rewritten = runner.invoke(main, ["rewrite", saved, "-o", synced])
    assert rewritten.exit_code == 0 and "(conditional; gradients rewritten)" in rewritten.output, rewritten.output
    verified = runner.invoke(main, ["verify", synced, "--original", saved])
    assert verified.exit_code == 0, verified.output
    assert "PASS" in verified.output and "fed is_training:0 = True" in verified.output, verified.output


@tiers.full   # sync groups: tests/test_distributed.py's fast cases
@pytest.mark.parametrize("version,strategy", [("v2", "gather"), ("v1", "allreduce")])
def test_sync_groups_each_equal_their_own_reference(version, strategy):
    """4 towers in groups of 2, flag True: each group is its own single-device run on its own
    concatenated batch, not the whole batch's; flag False: the original graph."""
    sizes = (3, 2, 4, 1)
    x, t = _data(sizes)
    edges = np.cumsum((0,) + sizes)
    refs = [_reference_on("layers", version, sizes[g:g + 2], x[edges[g]:edges[g + 2]], t[edges[g]:edges[g + 2]])
            for g in (0, 2)]
    reports = []
    built = _build(MODELS["layers"](), list(sizes), version, rewrite=lambda g: reports.append(
        graphsync.rewrite_towers(g, strategy=strategy, group_size=2)))
    assert reports[0].groups == [["tower_0", "tower_1"], ["tower_2", "tower_3"]], reports[0]
    assert {l.kind for l in reports[0].layers} == {"conditional"}
    want = {"output": np.concatenate([r["output"] for r in refs]), "loss": np.concatenate([r["loss"] for r in refs]),
            "grads": [a + b for a, b in zip(refs[0]["grads"], refs[1]["grads"])], "moving": refs[0]["moving"]}
    got = _step(built, x, t, sizes, True)
    errors = _errors(got, want)
    assert max(errors.values()) < TOLERANCE, errors
    whole = _reference("layers", version, sizes)
    assert tl.max_rel_error(got["output"], whole["output"]) > UNSYNCED_MIN_ERROR   # groups really are separate
    original = _build(MODELS["layers"](), list(sizes), version)
    unsynced = _errors(_step(original, x, t, sizes, True), want)
    assert min(unsynced[k] for k in ("output", "loss", "grads", "moving")) > UNSYNCED_MIN_ERROR, unsynced
    evaluation = _errors(_step(built, x, t, sizes, False), _step(original, x, t, sizes, False))
    assert max(evaluation.values()) == 0.0, evaluation


@pytest.mark.parametrize("version", [pytest.param("v2", marks=tiers.full), "v1"])
def test_sync_batch_norm_hook_on_a_monitored_training_session(version):
    """SyncBatchNormHook rewrites the graph when MonitoredTrainingSession begins: an evaluation
    step (is_training fed False) computes what the original computes, a training step (True)
    equals one device on the concatenated batch."""
    sizes = (3, 5)
    x, t = _data(sizes)
    built = _build(MODELS["layers"](), list(sizes), version)
    hook = graphsync.SyncBatchNormHook()
    with built.graph.as_default(), \
            tf1.train.MonitoredTrainingSession(hooks=[hook], config=tl.CONFIG) as sess:
        evaluation = sess.run(built.outputs + built.losses, _feed(built, x, t, sizes, False))
        feed = _feed(built, x, t, sizes, True)
        outs, losses, grads = sess.run([built.outputs, built.losses, built.grads], feed)
        sess.run(built.train_op, feed)
        moving = sess.run(built.moving)
    assert hook.report.summary.startswith("2 layers × 2 towers synchronized"), hook.report.summary
    assert {l.kind for l in hook.report.layers} == {"conditional"}
    got = {"output": np.concatenate([o.astype(np.float64) for o in outs]), "loss": np.array(losses, np.float64),
           "grads": grads, "moving": moving}
    reference = _reference("layers", version, sizes)
    errors = _errors(got, {k: reference[k] for k in got})
    assert max(errors.values()) < TOLERANCE, errors
    original = _build(MODELS["layers"](), list(sizes), version)
    unsynced = _errors(_step(original, x, t, sizes, True), {k: reference[k] for k in got})
    assert min(unsynced.values()) > UNSYNCED_MIN_ERROR, unsynced
    with tf1.Session(graph=original.graph, config=tl.CONFIG) as plain:
        plain.run(tf1.variables_initializer(original.variables + original.moving))
        want = plain.run(original.outputs + original.losses, _feed(original, x, t, sizes, False))
    assert tl.max_rel_error(evaluation, want) == 0.0


@tiers.full
def test_between_graph_workers_behind_a_flag(tmp_path):
    """2 worker processes of tests/scripts/between_graph_train.py --flag under `graphsync run`: the
    training step (is_training True) of both together equals one device on the concatenated batch,
    under plain python it does not; the evaluation pass (False) equals plain python's."""
    from test_between_graph import errors_against_one_device, run_workers
    sizes, args = [3, 5], ["--sizes", "3,5", "--flag"]
    (tmp_path / "synced").mkdir(), (tmp_path / "plain").mkdir()
    synced = run_workers(tmp_path / "synced", 2, args=args)
    plain = run_workers(tmp_path / "plain", 2, runner=[sys.executable], args=args + ["--alone"])
    for _, _, err, _, _ in synced:
        assert "2 layers × 1 tower synchronized by all-reduce on the towers' devices across 2 worker processes " \
               "(conditional" in err, err
    errors = errors_against_one_device(synced, sizes)
    assert max(errors.values()) < TOLERANCE, errors
    unsynced = errors_against_one_device(plain, sizes)
    assert min(unsynced[k] for k in ("output", "grads", "moving")) > UNSYNCED_MIN_ERROR, unsynced
    evaluation = max(tl.max_rel_error(s[4][k], p[4][k]) for s, p in zip(sorted(synced), sorted(plain))
                     for k in ("eval_output", "eval_loss"))
    assert evaluation == 0.0, evaluation



@pytest.mark.parametrize("version", ["v2", "v1"])
@pytest.mark.parametrize("gradients", ["after", pytest.param("before", marks=tiers.full)])
@pytest.mark.parametrize("recompute", [True, pytest.param("segments", marks=tiers.full)])
def test_recompute_behind_a_flag_is_bit_for_bit_and_one_device(version, gradients, recompute):
    """recompute=True or "segments" behind a tensor flag: no gradient op reads the activations
    after the flag's Merge any more; with the flag True several steps give every variable exactly
    as without recompute, and one step equals one device; with the flag False the step is the
    original's."""
    batch_sizes = (3, 5)
    x, t = _data(batch_sizes)
    reports = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recomputed = _build(MODELS["layers"](), list(batch_sizes), version, gradients=gradients,
                            rewrite=lambda g: reports.append(graphsync.rewrite_towers(g, recompute=recompute)))
    assert not [w for w in caught if "recompute" in str(w.message)], [str(w.message) for w in caught]
    plain = _build(MODELS["layers"](), list(batch_sizes), version, gradients=gradients,
                   rewrite=graphsync.rewrite_towers)
    if gradients == "after":
        assert reports[0].recomputed >= 2 * len(batch_sizes), reports[0]
    else:
        assert reports[0].recompute_deferred == 2, reports[0]
    if recompute == "segments":   # the convolutions too
        assert "Conv2D" in {op.type for op in recomputed.graph.get_operations()
                            if is_recomputed(op)}

    def gradient_readers_of_activations(graph):
        relus = [op for op in graph.get_operations() if op.type == "Relu" and op.name.startswith("tower_")
                 and not is_backward(op) and not is_recomputed(op)]
        return [c for op in relus for c in op.outputs[0].consumers()
                if is_backward(c) and c.type not in ("Shape", "ShapeN", "Size", "Rank")]
    assert gradient_readers_of_activations(plain.graph)
    assert not gradient_readers_of_activations(recomputed.graph)

    def variables_after(built, flag, steps=3):
        with tf1.Session(graph=built.graph, config=tl.CONFIG) as sess:
            sess.run(tf1.global_variables_initializer())
            for _ in range(steps):
                sess.run(built.train_op, _feed(built, x, t, batch_sizes, flag))
            return sess.run(built.variables + built.moving)
    for flag in (True, False):
        for a, b in zip(variables_after(plain, flag), variables_after(recomputed, flag), strict=True):
            np.testing.assert_array_equal(a, b)
    errors = _errors(_step(recomputed, x, t, batch_sizes, True), _reference("layers", version, batch_sizes))
    assert max(errors.values()) < TOLERANCE, errors
    original = _build(MODELS["layers"](), list(batch_sizes), version, gradients=gradients)
    evaluation = _errors(_step(recomputed, x, t, batch_sizes, False), _step(original, x, t, batch_sizes, False))
    assert max(evaluation.values()) == 0.0, evaluation
