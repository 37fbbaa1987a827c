"""tf.function calls in graph mode (`PartitionedCall`/`StatefulPartitionedCall`) whose bodies run a
training batch norm, or a hand-written batch statistic (graphsync/batch_axis/ finds it in
the body), inlined into the main graph before the rewrite: the other modules then see an ordinary
fused op, the `If` of a tensor training flag, or a reduction to synchronize, instead of a function
body that get_operations() cannot list and _update_input cannot reach. Calls nested in an inlined
body are inlined in turn (imported, they have no gradient function).

Per call, the body is imported under the call's name (`tower_0/StatefulPartitionedCall_inlined/…`,
so that its layers pair across towers as the calls do; not `<call>/…`, the names TensorFlow gives
the call's own body when something still runs the old call):

    body arguments   the call's inputs (no op is imported for them)
    body ops         on the call's device; an op that reads or writes a variable through a resource
                     input goes on that variable's device, as graph-mode variable reads do; ops with
                     no input from the body wait for the call's control inputs
    readers of call output k            ← body output k (or the call's input, for an argument
                                          returned as it is)
    ops waiting for the call (control)  ← the body's outputs and its control outputs (the stateful
                                          ops tf.function makes every call run)

Gradients built before the rewrite: tf.gradients turned the call into a call of a forward function
that also returns its intermediates, differentiated by a call of a backward function that reads
them (and dy). Every call that reads an inlined call's outputs and runs a batch-norm gradient is
inlined too, after the forward, so that its arguments are the forward's inlined tensors: its
gradient `If` (or FusedBatchNormGrad) then reads the forward `If` (or fused op) directly, as it
would had the model been written without tf.function. The gradient call of a call holding a
hand-written statistic is inlined too, its `gradients/<op>_grad/…` scopes renamed
`gradients/<call>_inlined/<op>_grad/…`: tf.gradients' names for the gradient of the inlined forward
op, by which graphsync/plan/reductions.py finds it.

The old calls stay in the graph, read by nothing, so they do not run; Mark.INLINED marks them so
that they are not looked at again. A tensor held in Python from before the rewrite still names the
old call's output: fetching it runs the old, unsynchronized body (with its side effects, e.g. a
tf_keras layer's moving-average updates), as fetching an old batch-norm op's output does.

`planned` rehearses all of it on a copy of the graph first: a call that cannot be inlined, or a
graph that cannot be planned once inlined, raises with the graph untouched.
"""
from __future__ import annotations

import re

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from graphsync import match
from graphsync.graph import marks, tf_private
from graphsync.errors import GraphsyncError
from graphsync.graph.reroute import reroute_control_outputs, reroute_outputs
from graphsync.match.hidden import CALL_TYPES, INLINE_REMEDY as REMEDY, INLINED_SUFFIX, is_inlined
from graphsync.graph.backward import is_backward
from graphsync.graph.marks import Mark


# INLINED_SUFFIX: never the call's own name: TensorFlow inlines a call it runs as `<call>/<node>`
_IF_TYPES = ("If", "StatelessIf")
_GRADIENTS = re.compile(r"gradients(?:_\d+)?")
_HANDLE_PASSING = frozenset(match.FUNCTION_CALL_TYPES) | {"Identity", "Switch", "Merge"}


def planned(graph: tf.Graph, make_plan):
    """`make_plan(graph)` once every tower call it lists (`Plan.calls`) is inlined, nested calls too;
    returns the plan and the names of the calls inlined. Rehearsed on a copy of the graph first, so
    a refusal (GraphsyncError) leaves `graph` exactly as it was."""
    plan = make_plan(graph)
    if not plan.calls:
        return plan, []
    _until_planned(_copy(graph), make_plan)   # every step the real run takes, so none of them fails there
    return _until_planned(graph, make_plan, plan)


def _until_planned(graph: tf.Graph, make_plan, plan=None):
    plan = plan or make_plan(graph)
    inlined = []
    while plan.calls:
        inlined += inline_calls(graph, [graph.get_operation_by_name(op.name) for op in plan.calls])
        plan = make_plan(graph)
    return plan, inlined


def _copy(graph: tf.Graph) -> tf.Graph:
    """The graph's ops, functions and v1 control-flow contexts (what planning reads) in a new graph."""
    keys = [tf.compat.v1.GraphKeys.COND_CONTEXT, tf.compat.v1.GraphKeys.WHILE_CONTEXT]
    with graph.as_default():   # in a graph's context even where eager execution is on (the command line)
        meta = tf.compat.v1.train.export_meta_graph(graph=graph, collection_list=keys, clear_devices=False)
    copy = tf.Graph()
    with copy.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
    return copy


def inline_calls(graph: tf.Graph, calls: list) -> list[str]:
    """Inlines each call and the gradient calls that read it (module docstring); returns the names
    of the calls inlined, in the order they were."""
    library = tf_private.function_library(graph)
    backward = match.functions_with_batch_norm_gradient(graph)
    inlined = []
    for call in calls:
        gradients = sorted({c for t in call.outputs for c in t.consumers()
                            if c.type in CALL_TYPES and not is_inlined(c) and
                            (match.called_functions(c) & backward or is_backward(c))},
                           key=tf_private.creation_order)
        for op in [call] + gradients:
            # a statistic's gradient call: its gradient scopes renamed after the inlined forward's ops
            renamed = None if op is call or match.called_functions(op) & backward else call.name + INLINED_SUFFIX
            try:
                _inline(graph, op, library, forward=op is call, renamed=renamed)
            except (ValueError, KeyError, TypeError, tf.errors.OpError) as exc:
                raise GraphsyncError(f"{op.name} ({op.type}) runs a batch statistic inside a tf.function's body, "
                                     f"which graphsync could not inline ({' '.join(str(exc).split())}): "
                                     f"{REMEDY}") from None
            inlined.append(op.name)
    return inlined


def _inline(graph: tf.Graph, call: tf.Operation, library: dict, forward: bool, renamed=None) -> None:
    """One call (module docstring). The Ifs of a forward body get their branch graphs cached for
    gradients built later (tf_private.cache_branch_graphs); a backward body's are left to be
    rebuilt if ever differentiated again (a second-order gradient), which is rare and costs 2 ms
    an If."""
    fdef = library[call.get_attr("f").name]
    graph_def, names = tf_private.function_body(graph, fdef)
    if renamed:
        names = _rename_gradient_scopes(graph_def, names, renamed)
    inputs = dict(zip((arg.name for arg in fdef.signature.input_arg), call.inputs))
    body, input_map = _without_arguments(graph_def, inputs)
    returned = [fdef.ret[arg.name] for arg in fdef.signature.output_arg]
    elements = [names[ref] for ref in returned if ref not in inputs] + list(fdef.control_ret.values())
    version = graph.version
    with tf_private.pristine_scope(graph, _placement(call), call.name + INLINED_SUFFIX):
        imported = tf.compat.v1.import_graph_def(body, input_map=input_map, return_elements=elements,
                                                 name=call.name + INLINED_SUFFIX + "/") if elements else []
    new_ops = tf_private.ops_added_since(graph, version)
    _wait_for(call.control_inputs, new_ops)
    for op in new_ops if forward else []:
        if op.type in _IF_TYPES:
            tf_private.cache_branch_graphs(op)
    found = iter(imported)
    outputs = [inputs[ref] if ref in inputs else next(found) for ref in returned]
    reroute_outputs(call, outputs)
    reroute_control_outputs(call, list({t.op: None for t in outputs if t.op in new_ops}) + list(found))
    tf_private.set_attr(call, Mark.INLINED.value, marks.value(True))


def _rename_gradient_scopes(graph_def, names: dict, forward: str) -> dict:
    """A backward body's `gradients/<op>_grad/…` nodes renamed `gradients/<forward>/<op>_grad/…`,
    the scopes tf.gradients gives the gradient of `<forward>/<op>` (the inlined forward's op), so
    that graphsync/match/gradients.py finds them as if the model had been written without
    tf.function; returns `names` with the new node names."""
    def new(name):
        first, _, rest = name.partition("/")
        return f"{first}/{forward}/{rest}" if rest and _GRADIENTS.fullmatch(first) else name

    def ref(tensor):
        control = tensor.startswith("^")
        node, sep, index = tensor.lstrip("^").partition(":")
        return ("^" if control else "") + new(node) + sep + index

    for node in graph_def.node:
        node.name = new(node.name)
        node.input[:] = [ref(r) for r in node.input]
        if "_class" in node.attr:
            kept = [b"loc:@" + new(c.decode().partition("@")[2]).encode() for c in node.attr["_class"].list.s]
            del node.attr["_class"].list.s[:]
            node.attr["_class"].list.s.extend(kept)
    return {k: ref(v) for k, v in names.items()}


def _without_arguments(graph_def, inputs: dict):
    """The body without its argument placeholders, and the input map that gives their readers the
    call's inputs; colocation with an op outside the body (an argument, or a name the function
    captured) is dropped: placement follows _placement."""
    body = graph_pb2.GraphDef()
    body.versions.CopyFrom(graph_def.versions)
    input_map = {}
    kept_names = {node.name for node in graph_def.node if node.name not in inputs}
    for node in graph_def.node:
        if node.name in inputs:
            continue
        node = _copied(body, node)
        for ref in node.input:
            name, _, index = ref.lstrip("^").partition(":")
            if name in inputs:
                input_map["^" + name if ref.startswith("^") else f"{name}:{index or 0}"] = inputs[name]
        if "_class" in node.attr:
            kept = [c for c in node.attr["_class"].list.s if c.decode().partition("@")[2] in kept_names]
            del node.attr["_class"].list.s[:]
            node.attr["_class"].list.s.extend(kept)
            if not kept:
                del node.attr["_class"]
    return body, input_map


def _copied(body, node):
    copy = body.node.add()
    copy.CopyFrom(node)
    return copy


def _placement(call: tf.Operation):
    """A device function: an op's own device, else that of the variable whose resource it reads or
    writes, else the call's."""
    def device(op):
        if op.device:
            return op.device
        if op.type not in _HANDLE_PASSING:
            for tensor in op.inputs:
                if tensor.dtype == tf.resource and tensor.op.device:
                    return tensor.op.device
        return call.device
    return device


def _wait_for(control_inputs: list, new_ops: list) -> None:
    """The ops of an inlined body that read nothing from the body wait for the call's control
    inputs (every other op of the body runs after one of them)."""
    if not control_inputs:
        return
    inside = set(new_ops)
    for op in new_ops:
        if not any(t.op in inside for t in op.inputs) and not any(c in inside for c in op.control_inputs):
            tf_private.add_control_inputs(op, list(control_inputs))
