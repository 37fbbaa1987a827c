"""Structure after a rewrite (a complement to the numeric tests): no original batch-norm op runs,
each tower's backward reads only its own activations, failures leave the graph untouched, a second
rewrite changes nothing."""
import pytest
import tensorflow as tf

import graphsync
import models
import towerlib as tl

tf1 = tf.compat.v1
BATCH = [3, 5, 4]


@pytest.fixture(scope="module")
def rewritten():
    built = tl.build(models.layers_bn(depth=2), BATCH, gradients="after")
    old_ops = {op.name for op in built.graph.get_operations()
               if op.type.startswith("FusedBatchNorm")}
    report = graphsync.rewrite_towers(built.graph)
    return built, report, old_ops


def _executed_nodes(built):
    return tl.executed_nodes(built, BATCH)


def test_no_original_batch_norm_op_runs(rewritten):
    built, report, old_ops = rewritten
    assert len(old_ops) == 2 * 2 * len(BATCH)  # forward + gradient, 2 layers, 3 towers
    executed = _executed_nodes(built)
    assert executed, "step stats recorded nothing"
    assert not executed & old_ops
    assert any(name.startswith("graphsync/") for name in executed)


def test_unrewritten_graph_runs_them():
    built = tl.build(models.layers_bn(depth=2), BATCH, gradients="after")
    bn_ops = {op.name for op in built.graph.get_operations() if op.type.startswith("FusedBatchNorm")}
    assert len(bn_ops & _executed_nodes(built)) == 2 * 2 * len(BATCH)


def test_each_towers_backward_reads_only_its_own_tower(rewritten):
    built, report, _ = rewritten
    prefixes = [f"tower_{i}/" for i in range(len(BATCH))]
    for op in built.graph.get_operations():
        home = next((p for p in prefixes if op.name.startswith(p + "gradients")), None)
        if home is None:
            continue
        for tensor in op.inputs:
            owner = next((p for p in prefixes if tensor.op.name.startswith(p)), home)
            assert owner == home, f"{op.name} reads {tensor.name}"


def test_aggregation_sits_in_one_scope_per_layer_on_the_chosen_device(rewritten):
    built, report, _ = rewritten
    aggregation = [op for op in built.graph.get_operations() if op.name.startswith("graphsync/")]
    layers = {op.name.split("/")[1] for op in aggregation} - {"constants"}   # shared by all layers
    assert layers == {layer.name.split("/")[0] for layer in report.layers}
    assert {op.device for op in aggregation} == {"/device:CPU:0"}


def test_report_lists_layers_and_tower_ops(rewritten):
    _, report, _ = rewritten
    assert [l.name for l in report.layers] == ["bn0/FusedBatchNormV3", "bn1/FusedBatchNormV3"]
    assert report.layers[0].tower_ops == tuple(f"tower_{i}/bn0/FusedBatchNormV3" for i in range(3))
    assert all(l.kind == "fused" and l.backward == "rewritten" for l in report.layers)
    text = str(report)
    assert "2 layers × 3 towers" in text and "bn1/FusedBatchNormV3" in text
    assert report.to_dict()["layers"][1]["tower_ops"][2] == "tower_2/bn1/FusedBatchNormV3"


def test_second_rewrite_changes_nothing(rewritten):
    built, _, _ = rewritten
    before = built.graph.as_graph_def()
    report = graphsync.rewrite_towers(built.graph)
    assert not report.changed
    assert "already synchronized" in report.summary
    assert built.graph.as_graph_def() == before


def _assert_refused(graph, match, **kw):
    before = graph.as_graph_def()
    with pytest.raises(graphsync.GraphsyncError, match=match) as err:
        graphsync.rewrite_towers(graph, **kw)
    assert "\n" not in str(err.value)
    assert graph.as_graph_def() == before


def _towers_graph(model_for_tower, n=2, scope="tower_%d"):
    graph = tf.Graph()
    with graph.as_default(), tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
        for i in range(n):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(scope % i + "/"):
                x = tf1.placeholder(tf.float32, [None, 4, 4, 3])
                y = model_for_tower(i, x)
                tf.reduce_sum(y)
    return graph


def test_layer_missing_from_a_tower_is_refused():
    def model(i, x):
        y, _ = models.raw_fused_bn(x, "bn0")
        return models.raw_fused_bn(y, "bn1")[0] if i == 0 else y
    _assert_refused(_towers_graph(model), r"layer 'bn1.*missing from tower\(s\) tower_1")


def test_paired_layers_that_differ_are_refused():
    _assert_refused(_towers_graph(lambda i, x: models.raw_fused_bn(x, "bn", epsilon=1e-3 * (i + 1))[0]),
                    r"differ \(epsilon")


def test_no_towers_is_refused():
    graph = _towers_graph(lambda i, x: models.raw_fused_bn(x, "bn")[0], n=1, scope="model%d")
    _assert_refused(graph, "no towers found")


def test_control_flow_v2_batch_norm_behind_one_flag_per_tower_is_refused():
    def model(i, x):
        training = tf1.placeholder_with_default(True, [])
        return tf.cond(training, lambda: models.raw_fused_bn(x, "bn")[0], lambda: x)
    _assert_refused(_towers_graph(model), "different training flag in each tower")


def test_control_flow_v1_batch_norm_behind_one_flag_per_tower_is_refused():
    tf1.disable_control_flow_v2()
    try:
        def model(i, x):
            training = tf1.placeholder_with_default(True, [])
            return tf.cond(training, lambda: models.raw_fused_bn(x, "bn")[0], lambda: x)
        _assert_refused(_towers_graph(model), "different training flag in each tower")
    finally:
        tf1.enable_control_flow_v2()


def test_inference_mode_and_outside_towers_are_skipped_with_reasons():
    def model(i, x):
        y = tf.raw_ops.FusedBatchNormV3(x=x, scale=tf.ones([3]), offset=tf.zeros([3]), mean=tf.zeros([3]),
                                        variance=tf.ones([3]), is_training=False, name="frozen")[0]
        return models.raw_fused_bn(y, "bn")[0]
    graph = _towers_graph(model)
    with graph.as_default():
        outside = tf1.placeholder(tf.float32, [None, 4, 4, 3])
        tf.reduce_sum(models.raw_fused_bn(outside, "head_bn")[0])
    report = graphsync.rewrite_towers(graph)
    assert [l.tower_ops for l in report.layers] == [("tower_0/bn_1", "tower_1/bn_1")]
    reasons = {s.op: s.reason for s in report.skipped}
    assert "inference mode" in reasons["tower_0/frozen"] and "inference mode" in reasons["tower_1/frozen"]
    assert "outside every tower" in reasons["head_bn_1"]
