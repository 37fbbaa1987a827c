"""Every private TensorFlow API graphsync touches, in one place.

A TensorFlow upgrade that renames one of these breaks this module only; `tests/test_tf_private.py`
pins each of them.
"""
from __future__ import annotations

import contextlib
import functools

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.client import _pywrap_tf_session as _c_api
from tensorflow.python.framework import ops as _tf_ops
from tensorflow.python.framework import traceable_stack as _traceable_stack



def update_input(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
    """Rewires input `index` of `op` to `tensor` (TensorFlow checks shapes, not dtypes).

    TensorFlow forgets the op's `inputs` then, and builds them again on the next read, a lookup by
    name per input; they are known, so they are kept (a rewrite moves thousands of edges, and later
    stages read those ops' inputs)."""
    # pylint: disable=protected-access
    known = op._inputs_val
    op._update_input(index, tensor)
    if known is not None:
        op._inputs_val = known[:index] + (tensor,) + known[index + 1:]


def input_types(op: tf.Operation) -> list:
    """The types of the ops `op` reads, input by input, without building `op.inputs` (a Tensor
    per input, each found by name): what a matcher looks at first of most ops it rejects."""
    if op._inputs_val is not None:  # pylint: disable=protected-access
        return [t.op.type for t in op._inputs_val]  # pylint: disable=protected-access
    return [_c_api.TF_OperationOpType(i.oper) for i in _c_api.GetOperationInputs(op._c_op)]  # pylint: disable=protected-access


def is_ref(tensor: tf.Tensor) -> bool:
    """Whether `tensor` is a TF1 reference (a `VariableV2`'s output: readers alias its buffer)."""
    return tensor.dtype._is_ref_dtype  # pylint: disable=protected-access


def control_outputs(op: tf.Operation) -> list:
    """The ops that carry a control edge from `op`."""
    return list(op._control_outputs)  # pylint: disable=protected-access


def replace_control_input(op: tf.Operation, old: tf.Operation, new: list) -> None:
    """Replaces the control edge old → op by edges from each op in `new`."""
    kept = [c for c in op.control_inputs if c is not old]
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    extra = [n for n in new if n not in kept]
    op._add_control_inputs(kept + extra)  # pylint: disable=protected-access


def control_flow_context(op: tf.Operation):
    """The v1 control-flow context (`tf.cond`/`tf.while_loop` in v1 mode) `op` lives in, or None."""
    return op._get_control_flow_context()  # pylint: disable=protected-access


def in_while_loop(op: tf.Operation) -> bool:
    """Whether `op` lives inside a v1 `tf.while_loop` (a v1 `tf.cond` alone does not count: its
    Switch outputs gate the op, and what graphsync builds from them is gated alike)."""
    context = control_flow_context(op)
    return context is not None and context.GetWhileContext() is not None


def cond_predicate(op: tf.Operation):
    """The predicate of the innermost v1 `tf.cond` around `op`, or None."""
    context = control_flow_context(op)
    return getattr(context, "pred", None) if context is not None else None


def function_library(graph: tf.Graph) -> dict:
    """Name → FunctionDef of every function the graph holds (bodies of If/While/PartitionedCall)."""
    return {name: fn.cached_definition if hasattr(fn, "cached_definition") else fn.definition
            for name, fn in graph._functions.items()}  # pylint: disable=protected-access


def function_body(graph: tf.Graph, fdef):
    """A FunctionDef of `graph` as a GraphDef (one Placeholder per argument, named after it), and
    the map from the FunctionDef's tensor names ('node:out_arg:k', '^node', argument names) to the
    GraphDef's. The functions it calls are looked up in the default graph: `graph` here."""
    from tensorflow.python.framework import function_def_to_graph  # pylint: disable=import-outside-toplevel
    with graph.as_default():
        return function_def_to_graph.function_def_to_graph_def(fdef)


def function_graph(graph: tf.Graph, fdef, input_shapes):
    """A FunctionDef of `graph` as a FuncGraph whose arguments have `input_shapes` (the calling
    op's inputs'), to read its ops as tensors and consumers; nested functions looked up in `graph`."""
    from tensorflow.python.framework import function_def_to_graph  # pylint: disable=import-outside-toplevel
    with graph.as_default():
        return function_def_to_graph.function_def_to_graph(fdef, input_shapes=input_shapes)


def branch_graph(op: tf.Operation, name: str):
    """The FuncGraph of the If `op`'s branch function `name` that cond_v2 left on the op when it
    built it in this process (None otherwise): what function_graph would rebuild, for free."""
    for cached in ("_true_graph", "_false_graph"):
        graph = getattr(op, cached, None)
        if graph is not None and graph.name == name and len(graph.inputs) == len(op.inputs) - 1 \
                and len(graph.outputs) == len(op.outputs):
            return graph
    return None


def loop_body_graph(op: tf.Operation, name: str):
    """The FuncGraph of the While `op`'s body function `name` that while_v2 left on the op when it
    built it in this process (and updates when tf.gradients adds accumulators), or None."""
    graph = getattr(op, "_body_graph", None)
    if graph is not None and graph.name == name and len(graph.inputs) == len(op.inputs) \
            and len(graph.outputs) == len(op.outputs):
        return graph
    return None


def cache_branch_graphs(op: tf.Operation) -> None:
    """Builds an If's branch FuncGraphs outside any context and caches them where cond_v2 looks
    first (`_true_graph`, `_false_graph`, as cond_v2 leaves them on the Ifs it builds). An If that
    was imported has none: its gradient would rebuild them inside tf.gradients' colocation with
    the If, which pins every branch op to the If's device, variable reads too (a placement error
    when the variable lives on another device)."""
    from tensorflow.python.ops import control_flow_util_v2  # pylint: disable=import-outside-toplevel
    shapes = [t.shape for t in op.inputs[1:]]
    with op.graph.as_default(), op.graph.device(None), op.graph.colocate_with(None, ignore_existing=True), \
            op.graph.control_dependencies(None):
        for key, cached in (("then_branch", "_true_graph"), ("else_branch", "_false_graph")):
            if getattr(op, cached, None) is None:
                setattr(op, cached, control_flow_util_v2.get_func_graph(op, shapes, op.get_attr(key).name))


def add_control_inputs(op: tf.Operation, ops: list) -> None:
    """Adds control edges from each op in `ops` to `op` (an op already created)."""
    op._add_control_inputs(ops)  # pylint: disable=protected-access


def set_attr(op: tf.Operation, name: str, value: attr_value_pb2.AttrValue) -> None:
    """Sets (or replaces) one attribute of an op already created."""
    op._set_attr(name, value)  # pylint: disable=protected-access


@contextlib.contextmanager
def pristine_scope(graph: tf.Graph, device: str | None, name_scope: str):
    """Creates ops outside any device, colocation, control-dependency or control-flow context the
    caller may be in, on `device`, under the absolute `name_scope`.

    What `graph.device(None)`, `colocate_with(None, ignore_existing=True)`, `control_dependencies(None)`,
    `device(device)` and `name_scope(name_scope + "/")` would do, done by setting the graph's
    stacks directly: a rewrite enters a few thousand of these scopes, and the six context managers
    (each recording its caller's source line) cost 40–80 µs a time, a sixth of a rewrite."""
    # pylint: disable=protected-access
    saved = (graph._get_control_flow_context(), graph._device_function_stack, graph._colocation_stack,
             graph._control_dependencies_stack, graph._name_stack)
    with as_default(graph):
        graph._set_control_flow_context(None)
        graph._device_function_stack = _traceable_stack.TraceableStack(
            [_traceable_stack.TraceableObject(_device_spec(device or ""))])
        graph._colocation_stack = _traceable_stack.TraceableStack()
        graph._control_dependencies_stack = []
        graph._name_stack = name_scope.rstrip("/")
        try:
            yield
        finally:
            (flow, graph._device_function_stack, graph._colocation_stack, graph._control_dependencies_stack,
             graph._name_stack) = saved
            graph._set_control_flow_context(flow)


def as_default(graph: tf.Graph):
    """`graph.as_default()`, or nothing when it is the default already: entering it pushes a new
    default-graph context, which a rewrite would otherwise pay in each of its few thousand scopes."""
    return graph.as_default() if tf.compat.v1.get_default_graph() is not graph else contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def _device_spec(device: str):
    """What `Graph.device(device)` pushes on the device stack (a plain string: no state)."""
    return _tf_ops._UserDeviceSpec(device)  # pylint: disable=protected-access


def session_base_class() -> type:
    """The class every TF1 session derives from (Session, InteractiveSession, and the sessions
    MonitoredSession, Supervisor and SessionManager create)."""
    from tensorflow.python.client import session  # pylint: disable=import-outside-toplevel
    return session.BaseSession


def session_extend_method() -> str:
    """The BaseSession method that copies the ops added to the graph since the session's last call
    into its runtime, before every `run`, `partial_run_setup`, `make_callable` and callable from
    options (`partial_run` steps reuse their setup's copy). Ops edited after a session copied them
    keep running in that session as they were."""
    return "_extend_graph"


def tracing_entry_point() -> tuple:
    """(module, attribute) of the function every `tf.function` trace goes through, once per trace
    and retrace: it returns the FuncGraph, built, before TensorFlow makes a function of it (or
    inlines it into a caller). Control-flow branches, loop bodies and nested tf.functions are traced
    through it too, inside their caller's trace."""
    from tensorflow.python.framework import func_graph  # pylint: disable=import-outside-toplevel
    return func_graph, "func_graph_from_py_func"


def gradient_registry():
    """The registry every gradient function is looked up in, by op type, when tf.gradients or a
    GradientTape differentiates an op (`lookup(op_type)`, called once per op differentiated)."""
    return _tf_ops._gradient_registry  # pylint: disable=protected-access


def tape_gradient_entry_point() -> tuple:
    """(module, attribute) of the function every GradientTape.gradient call (and
    tf.autodiff.ForwardAccumulator's, jvp's) runs the backward through."""
    from tensorflow.python.eager import imperative_grad  # pylint: disable=import-outside-toplevel
    return imperative_grad, "imperative_grad"


@contextlib.contextmanager
def tensors_compared_as_nodes():
    """Within: `==` between tensors is identity and tensors hash, as in TF1 graphs. TF2 makes `==`
    an elementwise op (it would add an Equal op to the graph being rewritten, or fail on dtypes) and
    tensors unhashable; graphsync's graph code compares tensors as graph nodes."""
    saved = tf.Tensor._USE_EQUALITY  # pylint: disable=protected-access
    tf.Tensor._USE_EQUALITY = False  # pylint: disable=protected-access
    try:
        yield
    finally:
        tf.Tensor._USE_EQUALITY = saved  # pylint: disable=protected-access


def session_is_open(session) -> bool:
    return not session._closed  # pylint: disable=protected-access


@functools.lru_cache(maxsize=None)
def _first_op_id() -> int:
    """The id TensorFlow gives a graph's first op: 2 where ids are the C++ node ids (after SOURCE
    and SINK; TensorFlow 2.13 on), 1 where they came from a Python counter (2.12)."""
    with tf.Graph().as_default():
        return tf.constant(0.0).op._id  # pylint: disable=protected-access


def existed_at(op: tf.Operation, version: int) -> bool:
    """Whether `op` existed when its graph's version was `version`.

    TensorFlow numbers a graph's ops in creation order (Operation._id, from `_first_op_id()`) and
    Graph.version counts the ops created so far (none is ever removed): the first `version` ops
    carry the ids first … first + version - 1."""
    return op._id < version + _first_op_id()  # pylint: disable=protected-access


def ops_added_since(graph: tf.Graph, version: int) -> list:
    """The ops created since `graph.version` was `version`, oldest first; costs their number only."""
    by_id, first = graph._nodes_by_id, _first_op_id()  # pylint: disable=protected-access
    return [by_id[i] for i in range(version + first, graph.version + first) if i in by_id]


def creation_order(op: tf.Operation) -> int:
    """A key that sorts ops in the order they were created."""
    return op._id  # pylint: disable=protected-access


def make_server_def(server_or_cluster_def, job_name, task_index, protocol, config):
    """The tf.train.ServerDef that tf.distribute.Server(...) builds from its arguments."""
    from tensorflow.python.training import server_lib  # pylint: disable=import-outside-toplevel
    return server_lib._make_server_def(  # pylint: disable=protected-access
        server_or_cluster_def, job_name, task_index, protocol, config)


def disarm_unopened_session(session) -> None:
    """Lets a session whose __init__ never ran be collected quietly (BaseSession.__del__ reads
    `_session`, which __init__ sets)."""
    if not hasattr(session, "_session"):
        session._session = None  # pylint: disable=protected-access


def create_op(graph: tf.Graph, op_type: str, inputs: list, attrs: dict, name: str) -> tf.Operation:
    """Creates an op without the Python argument inference of `tf.raw_ops`; attrs maps names to
    AttrValue protos and must be complete.

    Where nothing but a name scope and plain device strings is in effect (graphsync's own scopes,
    see pristine_scope) the op goes straight through TensorFlow's C API: Graph.create_op's
    NodeDef round trip, validation and stack capture are most of the cost of each op a rewrite
    adds. Any other context (control dependencies, colocation, control flow, device functions,
    gradient overrides: e.g. gradients built by tf.gradients; a function being traced) takes
    TensorFlow's own path."""
    # pylint: disable=protected-access
    device = _static_device(graph)
    if device is None or not _plain_context(graph, op_type, inputs):
        return graph._create_op_internal(op_type, inputs, name=name, attrs=attrs)
    graph._check_not_finalized()
    name = graph.unique_name(name)
    op_def = _op_def_for_type(graph, op_type)
    with graph._mutation_lock():
        with graph._c_graph.get() as c_graph:
            description = _c_api.TF_NewOperation(c_graph, op_type, name)
        if device:
            _c_api.TF_SetDevice(description, device)
        if _has_list_input(op_type, op_def):
            flat = []   # the op's inputs in the C API's order: what Operation.inputs would look up again
            for group in _tf_ops._reconstruct_sequence_inputs(op_def, inputs, attrs):
                if isinstance(group, (list, tuple)):
                    _c_api.TF_AddInputList(description, [t._as_tf_output() for t in group])
                    flat.extend(group)
                else:
                    _c_api.TF_AddInput(description, group._as_tf_output())
                    flat.append(group)
        else:
            flat = inputs
            for tensor in inputs:
                _c_api.TF_AddInput(description, tensor._as_tf_output())
        for key, value in attrs.items():
            _c_api.TF_SetAttrValueProto(description, key, value.SerializeToString())
        for key, value in graph._attr_scope_map.items():   # `marked`: what Graph.create_op would add
            if key not in attrs:
                _c_api.TF_SetAttrValueProto(description, key, value.SerializeToString())
        try:
            c_op = _c_api.TF_FinishOperation(description)
        except tf.errors.InvalidArgumentError as e:
            raise ValueError(e.message) from None   # what Graph.create_op raises
        op = tf.Operation._from_c_op(c_op, graph)
        op._inputs_val = tuple(flat)   # every later stage reads them: one C lookup per input saved
        op._gradient_function = graph._gradient_function_map.get(op_type)
        graph._record_op_seen_by_control_dependencies(op)
    return op


_LIST_INPUTS = {}   # op type → whether one of its inputs is a list of tensors


def _has_list_input(op_type: str, op_def) -> bool:
    """Whether an op type takes a list of tensors as one input (AddN, ConcatV2, a call): only
    then are a flat list's inputs regrouped (most of the ops a rewrite makes take none)."""
    if op_type not in _LIST_INPUTS:
        _LIST_INPUTS[op_type] = any(arg.number_attr or arg.type_list_attr for arg in op_def.input_arg)
    return _LIST_INPUTS[op_type]


@contextlib.contextmanager
def marked(graph: tf.Graph, attrs: dict):
    """Every op created inside carries `attrs` (attribute name → AttrValue; None: the attribute
    is no longer given), what `Graph._attr_scope` does: the way a stage tags each op it makes
    without passing the tag down every helper. `create_op`'s fast path sets them too."""
    # pylint: disable=protected-access
    saved = graph._attr_scope_map
    graph._attr_scope_map = {name: value for name, value in {**saved, **attrs}.items() if value is not None}
    try:
        yield
    finally:
        graph._attr_scope_map = saved


def marked_with(graph: tf.Graph, name: str) -> bool:
    """Whether the ops created now get attribute `name` (`marked`)."""
    return name in graph._attr_scope_map  # pylint: disable=protected-access


def newest_device_name(graph: tf.Graph) -> str:
    """The display name of the newest device scope in effect on `graph` ("" when none, or a
    device function)."""
    specs = list(graph._device_function_stack.peek_objs())  # pylint: disable=protected-access
    return getattr(specs[0], "display_name", "") if specs else ""


def _static_device(graph: tf.Graph) -> str | None:
    """The device string the graph's device stack gives every new op, or None when a device
    function (e.g. replica_device_setter) decides per op. Merged as Graph._apply_device_functions
    does: newest first, down to the innermost `device(None)`."""
    # pylint: disable=protected-access
    device = ""
    for spec in graph._device_function_stack.peek_objs():
        if spec.is_null_merge:
            continue
        if spec.function is None:
            break
        if not spec.fast_string_merge:
            return None
        device = spec.function.shortcut_string_merge(_Placed(device))
    return device


class _Placed:
    """What MergeDevice.shortcut_string_merge reads of an op: its device so far."""

    __slots__ = ("device",)

    def __init__(self, device: str):
        self.device = device


def _plain_context(graph: tf.Graph, op_type: str, inputs) -> bool:
    """Whether nothing that Graph.create_op would add to a new op is in effect."""
    # pylint: disable=protected-access
    return not (graph._building_function   # a FuncGraph captures outer tensors in create_op
                or graph._control_dependencies_for_inputs({t.op for t in inputs}) or len(graph._colocation_stack)
                or graph._get_control_flow_context() is not None
                or any(callable(value) for value in graph._attr_scope_map.values())
                or graph._op_to_kernel_label_map or op_type in graph._gradient_override_map
                or graph._container or graph._default_original_op is not None)


def add_function(function, graph: tf.Graph) -> None:
    """Adds a traced tf.function (ConcreteFunction) to `graph`'s library, for call ops graphsync
    makes in it. Where `graph` is a function being traced, the definition is registered with the
    eager runtime too: on TensorFlow 2.12 a traced function runs with the functions that runtime
    knows, not with its graph's library ("Can't find a function" at the first step)."""
    # pylint: disable=import-outside-toplevel,protected-access
    function.add_to_graph(graph)
    if graph._building_function:
        from tensorflow.python.eager import context
        runtime = context.context()
        if not runtime.has_function(function.name):
            runtime.add_function_def(function.function_def)


def _op_def_for_type(graph: tf.Graph, op_type: str):
    """The OpDef of `op_type` as `graph` knows it (Graph._get_op_def on TensorFlow 2.12)."""
    # pylint: disable=protected-access
    return graph.op_def_for_type(op_type) if hasattr(graph, "op_def_for_type") else graph._get_op_def(op_type)


def default_strategy():
    """tf.distribute's default strategy (no replicas of its own): the one get_strategy() returns
    outside every scope, whatever scope this is called in (distribution_strategy_context held it on
    TensorFlow 2.12)."""
    # pylint: disable=import-outside-toplevel,protected-access
    from tensorflow.python.distribute import distribute_lib
    if hasattr(distribute_lib, "_get_default_strategy"):
        return distribute_lib._get_default_strategy()
    from tensorflow.python.distribute import distribution_strategy_context
    return distribution_strategy_context._get_default_strategy()
