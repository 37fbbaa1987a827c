"""Pins every private TensorFlow API graphsync uses (graphsync/graph/tf_private.py): a TensorFlow upgrade
that changes one of them fails here first, by name."""
import numpy as np
import pytest
import tensorflow as tf

from graphsync.between_graph import health_probe
from graphsync.graph import fast_ops, tf_private

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

tf1 = tf.compat.v1


def _run(graph, fetch):
    with tf1.Session(graph=graph) as sess:
        return sess.run(fetch)


def test_update_input_rewires_one_edge():
    graph = tf.Graph()
    with graph.as_default():
        a, b = tf.constant(1.0), tf.constant(2.0)
        y = tf.identity(a)
        tf_private.update_input(y.op, 0, b)
        s = tf.add(a, b)
        assert len(s.op.inputs) == 2   # read, and kept by update_input as TensorFlow would read it again
        tf_private.update_input(s.op, 1, a)
    assert y.op.inputs[0] is b and _run(graph, y) == 2.0
    kept = s.op.inputs
    s.op._inputs_val = None   # pylint: disable=protected-access
    assert [t.name for t in kept] == [t.name for t in s.op.inputs] == [a.name, a.name] and _run(graph, s) == 2.0


def test_input_types_are_the_types_of_the_ops_read_in_input_order():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3])
        mean = tf.reduce_mean(x, 0)
        variance = tf.reduce_sum(tf.square(x - mean), 0) / 7.0
    op = variance.op
    assert op._inputs_val is None   # pylint: disable=protected-access
    read = tf_private.input_types(op)   # from the C API, not building op.inputs
    assert op._inputs_val is None and read == ["Sum", "Const"]   # pylint: disable=protected-access
    assert tf_private.input_types(op) == [t.op.type for t in op.inputs] == read   # and from op.inputs once built


def test_control_edges_can_be_listed_and_replaced():
    graph = tf.Graph()
    with graph.as_default():
        old, new, keep = tf.no_op(name="old"), tf.no_op(name="new"), tf.no_op(name="keep")
        with tf.control_dependencies([old, keep]):
            waiter = tf.no_op(name="waiter")
        assert tf_private.control_outputs(old) == [waiter]
        tf_private.replace_control_input(waiter, old, [new])
    assert {op.name for op in waiter.control_inputs} == {"keep", "new"}
    assert tf_private.control_outputs(old) == []


def test_control_flow_context_and_function_library():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [])
        tf.cond(x > 0, lambda: x * 2, lambda: x)     # control flow v2: an If with two functions
        assert tf_private.control_flow_context(x.op) is None
        library = tf_private.function_library(graph)
    assert len(library) == 2 and all(hasattr(f, "node_def") for f in library.values())


def test_pristine_scope_leaves_every_caller_context():
    graph = tf.Graph()
    with graph.as_default():
        c = tf.constant(1.0)
        d = tf.constant(2.0, name="d")
        with tf.device("/cpu:1"), tf1.name_scope("user"), tf.control_dependencies([c.op]):
            with tf_private.pristine_scope(graph, "/cpu:0", "graphsync/layer"):
                y = tf.identity(c, name="y")
            with tf1.colocate_with(d.op), tf_private.pristine_scope(graph, "/cpu:2", "graphsync/other"):
                z = tf.identity(c, name="z")
            after = tf.identity(d, name="after")   # the caller's contexts are back
    assert y.name == "graphsync/layer/y:0" and y.device == "/device:CPU:0" and not y.op.control_inputs
    assert z.name == "graphsync/other/z:0" and z.device == "/device:CPU:2" and not z.op.colocation_groups()[0].endswith(b"@d")
    assert after.name == "user/after:0" and after.device == "/device:CPU:1" and after.op.control_inputs == [c.op]


def test_create_op_and_fast_ops_match_the_public_ops():
    graph = tf.Graph()
    with graph.as_default():
        ops = fast_ops.FastOps(graph)
        x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        got = [ops.sum(ops.binary("Mul", x, 2.0), 0), ops.cast(x, tf.float64), ops.unstack(ops.stack([x, x]), 2)[1],
               ops.reshape(x, [3, 2]), ops.add_n([x, x, x]), ops.unary("Square", x)]
        want = [tf.reduce_sum(x * 2.0, 0), tf.cast(x, tf.float64), x, tf.reshape(x, [3, 2]), 3 * x, tf.square(x)]
        assert ops.constant(2.0, tf.float32) is ops.constant(2.0, tf.float32)   # cached
    for g, w in zip(*_run(graph, (got, want))):
        np.testing.assert_array_equal(g, w)


def test_create_op_through_the_c_api_builds_what_graph_create_op_builds():
    """In graphsync's own scopes create_op skips Graph.create_op; the op must come out the same
    (name, device, inputs, attrs, list inputs grouped), and anything create_op would add (control
    dependencies, colocation, device functions) must send it through TensorFlow's own path."""
    graph = tf.Graph()
    with graph.as_default():
        x, axis = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3)), tf.constant(1)
        int32 = tf_private.attr_value_pb2.AttrValue(type=tf.int32.as_datatype_enum)
        attrs = {"T": tf_private.attr_value_pb2.AttrValue(type=tf.float32.as_datatype_enum),
                 "N": tf_private.attr_value_pb2.AttrValue(i=2), "Tidx": int32}
        with tf_private.pristine_scope(graph, "/cpu:1", "graphsync/layer"):
            lean = tf_private.create_op(graph, "ConcatV2", [x, x, axis], attrs, "cat")
            again = tf_private.create_op(graph, "ConcatV2", [x, x, axis], attrs, "cat")
        with tf.device("/cpu:1"), tf1.name_scope("reference/"):
            public = graph._create_op_internal("ConcatV2", [x, x, axis], name="cat", attrs=attrs)
        guard = tf.no_op(name="guard")
        with tf_private.pristine_scope(graph, "/cpu:0", "graphsync/other"), tf.control_dependencies([guard]):
            waits = tf_private.create_op(graph, "Identity", [x], {"T": attrs["T"]}, "waits")
        with tf_private.pristine_scope(graph, None, "graphsync/other"), tf1.colocate_with(x.op):
            beside = tf_private.create_op(graph, "Identity", [x], {"T": attrs["T"]}, "beside")
        with tf_private.pristine_scope(graph, None, "graphsync/other"), graph.device(lambda op: "/cpu:2"):
            chosen = tf_private.create_op(graph, "Identity", [x], {"T": attrs["T"]}, "chosen")
    assert (lean.name, again.name, lean.device) == ("graphsync/layer/cat", "graphsync/layer/cat_1", public.device)
    assert lean.node_def.attr == public.node_def.attr and lean.node_def.input == public.node_def.input
    # the inputs it keeps on the op are the ones TensorFlow reads back from the C graph, in order
    looked_up = tuple(graph._get_tensor_by_tf_output(i) for i in tf_private._c_api.GetOperationInputs(lean._c_op))
    assert all(a is b for a, b in zip(lean.inputs, looked_up, strict=True))
    assert all(a is b for a, b in zip(lean.inputs, [x, x, axis], strict=True))
    assert lean.outputs[0].shape == public.outputs[0].shape == (2, 6) and graph.get_operation_by_name(lean.name) is lean
    assert [op.name for op in waits.control_inputs] == ["guard"]
    assert beside.colocation_groups() == [b"loc:@" + x.op.name.encode()] and chosen.device == "/cpu:2"   # the function chose it
    with tf1.Session(graph=graph, config=tf1.ConfigProto(device_count={"CPU": 3})) as sess:
        got, want = sess.run([lean.outputs[0], public.outputs[0]])
    np.testing.assert_array_equal(got, want)


def test_every_session_class_derives_from_the_session_base_class():
    base = tf_private.session_base_class()
    assert issubclass(tf1.Session, base) and issubclass(tf1.InteractiveSession, base)
    assert "__init__" in base.__dict__   # graphsync.autosync.patching wraps it


def test_a_session_whose_init_never_ran_is_collected_quietly():
    import gc
    import sys
    session = object.__new__(tf1.Session)
    tf_private.disarm_unopened_session(session)
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        del session
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []


def test_make_server_def_is_what_a_server_is_built_from():
    config = tf1.ConfigProto()
    config.experimental.collective_group_leader = "/job:worker/replica:0/task:0"
    cluster = tf.train.ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]})
    server_def = tf_private.make_server_def(cluster, "worker", 1, None, config)
    assert isinstance(server_def, tf.train.ServerDef)
    assert (server_def.job_name, server_def.task_index, server_def.protocol) == ("worker", 1, "grpc")
    assert server_def.default_session_config.experimental.collective_group_leader == "/job:worker/replica:0/task:0"
    assert tf_private.make_server_def(server_def, None, None, None, None) == server_def


def test_fast_ops_call_runs_a_traced_function_inlined_on_the_callers_device():
    with tf.Graph().as_default():
        function = tf.function(lambda a: (tf.cast(a, tf.float64) * 2.0, tf.size(a)),
                               input_signature=[tf.TensorSpec(None, tf.float32)], autograph=False).get_concrete_function()
    graph = tf.Graph()
    with graph.as_default(), tf.device("/cpu:0"):
        ops = fast_ops.FastOps(graph)
        x = tf.constant([1.0, 2.0, 3.0])
        doubled, size = ops.call(function, [x], "double")
        again = ops.call(function, [x], "again")[0]
    assert doubled.op.type == "PartitionedCall" and doubled.dtype == tf.float64
    np.testing.assert_array_equal(_run(graph, [doubled, size, again])[0], [2.0, 4.0, 6.0])


def test_every_way_into_a_sessions_runtime_goes_through_its_extend_method():
    """run, partial_run_setup and make_callable copy the graph's new ops through one method, and
    that copy ignores later edits of the ops it holds (why graphsync must rewrite before it)."""
    session_class = tf_private.session_base_class()
    name = tf_private.session_extend_method()
    assert name in session_class.__dict__ and not any(name in cls.__dict__ for cls in
                                                      (tf1.Session, tf1.InteractiveSession))   # patched once, for all
    original, calls = getattr(session_class, name), []

    def counting(session):
        calls.append(session)
        return original(session)

    graph = tf.Graph()
    with graph.as_default():
        a, b = tf.constant(1.0), tf.constant(2.0)
        y = tf.identity(a)
        setattr(session_class, name, counting)
        try:
            with tf1.Session() as sess:
                assert sess.run(y) == 1.0
                sess.partial_run_setup([y], [])
                sess.make_callable(y)
                tf_private.update_input(y.op, 0, b)
                assert sess.run(y) == 1.0                   # the session's copy ignores the edit
                assert tf_private.session_is_open(sess)
            assert not tf_private.session_is_open(sess)
        finally:
            setattr(session_class, name, original)
    assert calls == [sess] * 4 and _run(graph, y) == 2.0    # a new session sees it


def test_graph_version_counts_ops_and_ids_follow_creation():
    graph = tf.Graph()
    with graph.as_default():
        first = [tf.constant(float(i)) for i in range(3)]
        version = graph.version
        later = [tf.identity(first[0]) for _ in range(2)]
        with tf.Graph().as_default() as other:
            tf.constant(0.0)
        tf1.import_graph_def(other.as_graph_def(), name="imported")
    assert version == 3 and graph.version == 6
    assert [tf_private.existed_at(t.op, version) for t in first + later] == [True] * 3 + [False] * 2
    assert not any(tf_private.existed_at(op, 0) for op in graph.get_operations())
    assert [op.name for op in tf_private.ops_added_since(graph, version)] == \
        [t.op.name for t in later] + ["imported/Const"]
    assert tf_private.ops_added_since(graph, graph.version) == []
    assert sorted(graph.get_operations(), key=tf_private.creation_order)[:5] == [t.op for t in first + later]


def test_worker_incarnations_asks_a_server_through_tensorflows_get_status_rpc():
    import time

    import cluster as cl
    spec = cl.cluster_spec({"worker": 1, "ps": 1})
    with cl.servers({"worker": spec["worker"]}):
        channels = {}
        first = health_probe.worker_incarnations(spec["worker"][0], 10, channels)
        assert len(first) == 1 and first[0] != 0
        assert health_probe.worker_incarnations(spec["worker"][0], 10, channels) == first
        for channel in channels.values():
            channel.close()
    started = time.monotonic()
    assert health_probe.worker_incarnations(spec["ps"][0], 5) is None   # nothing listens there
    assert time.monotonic() - started < 5


def test_function_body_attrs_and_control_inputs_of_a_created_op():
    """function_body gives a FunctionDef as a GraphDef with its tensor-name map; set_attr and
    add_control_inputs edit an op already created."""
    from tensorflow.core.framework import attr_value_pb2
    graph = tf.Graph()
    with graph.as_default():
        y = tf.function(lambda a: a * 2.0, autograph=False)(tf.constant(1.0))
        first, second = tf.no_op(name="first"), tf.no_op(name="second")
    graph_def, names = tf_private.function_body(graph, tf_private.function_library(graph)[y.op.get_attr("f").name])
    assert {node.op for node in graph_def.node} >= {"Placeholder", "Mul"} and names["mul:z:0"] == "mul:0"
    tf_private.set_attr(first, "_graphsync_mark", attr_value_pb2.AttrValue(b=True))
    tf_private.add_control_inputs(second, [first])
    assert first.get_attr("_graphsync_mark") is True and second.control_inputs == [first]


def test_function_graph_has_the_callers_shapes_on_its_arguments():
    """function_graph gives a FunctionDef as a FuncGraph: inputs and outputs in the call's order,
    the arguments shaped as the call's inputs (batch_axis traces the body through them)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3])
        y = tf.function(lambda a: a * 2.0, autograph=False)(x)
    body = tf_private.function_graph(graph, tf_private.function_library(graph)[y.op.get_attr("f").name], [x.shape])
    assert len(body.inputs) == 1 and body.inputs[0].shape.as_list() == [None, 3] and len(body.outputs) == 1
    assert body.inputs[0].consumers()[0].type == "Mul"


def test_cache_branch_graphs_is_where_cond_v2_looks_for_an_imported_ifs_branches():
    """An imported If carries no branch FuncGraphs; once cached, its gradient reads them (a
    gradient that rebuilt them inside tf.gradients' colocation would pin the variable read to
    the If's device: a placement error)."""
    source = tf.Graph()
    with source.as_default(), tf.device("/cpu:0"):
        flag = tf1.placeholder_with_default(True, [], name="flag")
        variable = tf1.get_variable("v", [], initializer=tf1.ones_initializer())
        x = tf1.placeholder_with_default(3.0, [], name="x")
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(source.as_graph_def(), name="")
        with tf.device("/cpu:0"):
            flag, x = graph.get_tensor_by_name("flag:0"), graph.get_tensor_by_name("x:0")
            handle = graph.get_tensor_by_name("v:0")
        with tf.device("/cpu:1"):
            y = tf.cond(flag, lambda: x * tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32),
                        lambda: x)
        exported = graph.as_graph_def()
    copy = tf.Graph()
    with copy.as_default():
        tf1.import_graph_def(exported, name="")
        cond = copy.get_tensor_by_name(y.name).op.inputs[0].op
        assert cond.type in ("If", "StatelessIf") and getattr(cond, "_true_graph", None) is None
        tf_private.cache_branch_graphs(cond)
        assert cond._true_graph is not None and cond._false_graph is not None
        with tf.device("/cpu:1"):
            dx, = tf.gradients(copy.get_tensor_by_name(y.name), [copy.get_tensor_by_name("x:0")])
        with tf1.Session(graph=copy, config=tf1.ConfigProto(device_count={"CPU": 2})) as sess:
            sess.run(copy.get_operation_by_name("v/Assign"))
            assert sess.run(dx) == 1.0


def test_ops_grouped_by_type_follow_the_ops_created_since():
    """graph/by_type.py reads only the ops created since its last grouping: it must list what a
    fresh walk of the graph lists, in creation order."""
    from graphsync.graph import by_type
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(1.0)
        early = by_type.ops_of_types(graph, ["Identity", "Const"])
        y = tf.identity(x)
        z = tf.constant(2.0)
        later = by_type.ops_of_types(graph, ["Identity", "Const"])
    assert early == [x.op] and later == [x.op, y.op, z.op]
    assert later == [op for op in graph.get_operations() if op.type in ("Identity", "Const")]


def test_the_default_strategy_is_found_inside_another_strategys_scope():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    default = tf_private.default_strategy()
    assert default is tf.distribute.get_strategy() and not tf.distribute.has_strategy()
    with strategy.scope():
        assert tf_private.default_strategy() is default and tf.distribute.get_strategy() is strategy
