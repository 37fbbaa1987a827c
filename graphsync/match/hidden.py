"""Batch norm hidden in function bodies (`If`, `While`, calls), where get_operations() cannot see it:
what a tensor-valued `training` flag builds under control flow v2."""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import marks, tf_private
from graphsync.match.fused import FUSED_TYPES
from graphsync.graph.marks import Mark

FUNCTION_CALL_TYPES = ("If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
                       "PartitionedCall", "StatefulPartitionedCall")
GRADIENT_TYPES = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")
STARTS = FUNCTION_CALL_TYPES   # the op types that may hide a batch norm (see match.starting_types)
CALL_TYPES = ("PartitionedCall", "StatefulPartitionedCall")   # tf.function calls, which graphsync inlines
INLINED_SUFFIX = "_inlined"   # graphsync/splice/inline.py imports a call's body under `<call>_inlined/`
INLINE_REMEDY = "call the function's Python code directly (without tf.function) when building the towers"


def is_inlined(op: tf.Operation) -> bool:
    """Whether graphsync already inlined this tf.function call (nothing reads it any more)."""
    return op.type in CALL_TYPES and marks.has(op, Mark.INLINED)   # inlined: it no longer runs


def functions_with_training_batch_norm(graph: tf.Graph) -> set[str]:
    """Names of the graph's functions that contain (directly or through nested calls) a fused
    batch norm in training mode: the bodies TensorFlow's control flow v2 hides them in."""
    return _functions_containing(graph, lambda node, _: node.op in FUSED_TYPES and node.attr["is_training"].b)


def functions_with_batch_norm_gradient(graph: tf.Graph) -> set[str]:
    """Names of the graph's functions that contain (directly or through nested calls) a fused
    batch norm's gradient: the backward functions of tf.function calls that run a batch norm."""
    return _functions_containing(graph, lambda node, _: node.op in GRADIENT_TYPES)


def functions_with_batch_moments(graph: tf.Graph) -> set[str]:
    """Names of the graph's functions that contain (directly or through nested calls) what
    tf.nn.moments builds over the batch axis — SquaredDifference(x, StopGradient(Mean(x, axes ∋ 0)))
    — the unfused batch norm (fused=False layers, tf_keras without fusing, renorm), which a
    function call hides as it hides a fused one."""
    return _functions_containing(graph, _batch_moments)


def _batch_moments(node, nodes: dict) -> bool:
    if node.op != "SquaredDifference":
        return False
    stopped = [nodes.get(_source(name)) for name in node.input]
    means = [nodes.get(_source(s.input[0])) for s in stopped if s is not None and s.op == "StopGradient"]
    return any(m is not None and m.op == "Mean" and 0 in _const_values(nodes.get(_source(m.input[1])))
               for m in means)


def _source(input_name: str) -> str:
    """The node a FunctionDef input ("node:output:0", "^node", "argument") comes from."""
    return input_name.lstrip("^").split(":")[0]


def _const_values(node) -> list:
    if node is None or node.op != "Const":
        return []
    return [int(v) for v in tf.make_ndarray(node.attr["value"].tensor).ravel()]


def _functions_containing(graph: tf.Graph, wanted) -> set[str]:
    """Names of the functions with a node for which `wanted(node, the function's nodes by name)`
    holds, directly or in a function they call."""
    library = tf_private.function_library(graph)
    if not library:
        return set()
    calls: dict[str, set[str]] = {}
    direct = set()
    for name, fdef in library.items():
        callees = set()
        nodes = {node.name: node for node in fdef.node_def}
        for node in fdef.node_def:
            if wanted(node, nodes):
                direct.add(name)
            callees |= {value.func.name for value in node.attr.values() if value.func.name}
            if node.op in library:
                callees.add(node.op)
        calls[name] = callees
    tainted, changed = set(direct), True
    while changed:
        changed = False
        for name, callees in calls.items():
            if name not in tainted and callees & tainted:
                tainted.add(name)
                changed = True
    return tainted


def called_functions(op: tf.Operation) -> set[str]:
    """Names of the functions a control-flow or call op runs."""
    names = set()
    for attr in op.node_def.attr.values():
        if attr.func.name:
            names.add(attr.func.name)
        names |= {f.name for f in attr.list.func}
    return names
