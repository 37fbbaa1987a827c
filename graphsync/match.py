"""Finding batch-norm layers in a graph, by op type and edges, never by user-chosen names.

A fused batch norm is a `FusedBatchNorm`/`V2`/`V3` op in training mode; its gradient ops are the
`FusedBatchNormGrad*` ops that read its reserve-space output 3 (how TensorFlow's own gradient wires
them), whatever scope `tf.gradients` put them in.

A moments batch norm is what `tf.nn.moments` builds, in any name scope:

    mean = Mean(x, axes, keep_dims)        → consumers (Squeeze, batch_normalization, averages…)
    SquaredDifference(x, StopGradient(mean))
    variance = Mean(that, axes, keep_dims) → consumers

It is batch norm when the axes include the batch axis 0. Its gradients are found through the
scopes `tf.gradients` itself names after each forward op (`…/gradients[_N]/<op name>_grad/…`).
"""
from __future__ import annotations

import dataclasses
import re

import tensorflow as tf

from graphsync import tf_private

FUSED_TYPES = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
FUNCTION_CALL_TYPES = ("If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
                       "PartitionedCall", "StatefulPartitionedCall")


@dataclasses.dataclass
class Candidate:
    """One batch-norm op in one tower (or outside all towers) that graphsync may synchronize."""

    op: tf.Operation
    kind: str
    skip_reason: str | None = None
    parts: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.op.name


def is_training(op: tf.Operation) -> bool:
    return bool(op.get_attr("is_training"))


def fused_gradient_ops(op: tf.Operation) -> list:
    """The FusedBatchNormGrad* ops that differentiate `op`, in creation order."""
    reserve = op.outputs[3]
    grads = [c for c in reserve.consumers()
             if c.type.startswith("FusedBatchNormGrad") and c.inputs[3] is reserve]
    return sorted(grads, key=lambda g: g._id)  # pylint: disable=protected-access


def is_live(op: tf.Operation) -> bool:
    """Whether anything still reads y, mean or variance (false after graphsync rerouted them)."""
    return any(t.consumers() for t in op.outputs[:3]) or bool(tf_private.control_outputs(op))


GRAPHSYNC_GRADIENTS = ("GraphsyncFusedLocalMoments", "GraphsyncFusedNormalize", "GraphsyncSynchronizedNormalize")


def made_by_graphsync(op: tf.Operation) -> bool:
    """graphsync's own fused kernels carry its gradient names (in saved graphs too)."""
    try:
        return op.get_attr("_gradient_op_type").decode() in GRAPHSYNC_GRADIENTS
    except ValueError:
        return False


def fused_candidates(graph: tf.Graph) -> list[Candidate]:
    """Every fused batch-norm op in the graph, with the reason it cannot be synchronized if any
    that does not depend on towers."""
    found = []
    for op in graph.get_operations():
        if op.type not in FUSED_TYPES or made_by_graphsync(op):
            continue
        reason = None
        if not is_training(op):
            reason = "inference mode (is_training=False): uses the moving statistics"
        elif not is_live(op):
            reason = "nothing reads its outputs (already synchronized, or unused)"
        found.append(Candidate(op, "fused", reason))
    return found


def functions_with_training_batch_norm(graph: tf.Graph) -> set[str]:
    """Names of the graph's functions that contain (directly or through nested calls) a fused
    batch norm in training mode: the bodies TensorFlow's control flow v2 hides them in."""
    library = tf_private.function_library(graph)
    if not library:
        return set()
    calls: dict[str, set[str]] = {}
    direct = set()
    for name, fdef in library.items():
        callees = set()
        for node in fdef.node_def:
            if node.op in FUSED_TYPES and node.attr["is_training"].b:
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


SHAPE_TYPES = ("Shape", "ShapeN", "Size", "Rank")
_GRAD_SCOPE = re.compile(r"^(?P<call>(?:.*/)?gradients(?:_\d+)?)/(?P<forward>.+?)_grad/")


def _const_axes(op: tf.Operation, rank: int):
    axes = tf.get_static_value(op.inputs[1])
    if axes is None:
        return None
    return tuple(sorted({int(a) % rank for a in (axes.ravel() if hasattr(axes, "ravel") else [axes])}))


def moments_candidates(graph: tf.Graph) -> list[Candidate]:
    """Every `tf.nn.moments`-shaped subgraph; those whose axes exclude the batch axis are listed
    with the reason (layer, instance and group norm are not batch norm)."""
    found = []
    for sqdiff in graph.get_operations():
        if sqdiff.type != "SquaredDifference":
            continue
        x, stopped = sqdiff.inputs
        if stopped.op.type != "StopGradient":
            x, stopped = stopped, x
        mean_op = stopped.op.inputs[0].op if stopped.op.type == "StopGradient" else None
        if mean_op is None or mean_op.type != "Mean" or mean_op.inputs[0] is not x:
            continue
        variance_ops = [c for c in sqdiff.outputs[0].consumers() if c.type == "Mean"]
        rank = x.shape.rank
        if len(variance_ops) != 1 or rank is None:
            continue
        variance_op = variance_ops[0]
        axes = _const_axes(mean_op, rank)
        if axes is None or axes != _const_axes(variance_op, rank) or \
                mean_op.get_attr("keep_dims") != variance_op.get_attr("keep_dims"):
            continue
        reason = None
        if 0 not in axes:
            reason = f"moments over axes {list(axes)} exclude the batch axis 0: layer/instance/group norm"
        elif not (_readers(mean_op.outputs[0], stopped.op) or variance_op.outputs[0].consumers()):
            reason = "nothing reads its outputs (already synchronized, or unused)"
        found.append(Candidate(mean_op, "moments", reason, {
            "variance": variance_op, "sqdiff": sqdiff, "stop_gradient": stopped.op, "axes": axes}))
    return found


def _readers(tensor: tf.Tensor, *exclude) -> list:
    return [c for c in tensor.consumers() if c not in exclude]


def gradient_scopes(graph: tf.Graph) -> dict:
    """forward op name → {gradient call prefix → ops of its gradient function}, from the scopes
    `tf.gradients` names after the op it differentiates."""
    scopes: dict = {}
    for op in graph.get_operations():
        found = _GRAD_SCOPE.match(op.name)
        if found:
            scopes.setdefault(found.group("forward"), {}).setdefault(found.group("call"), []).append(op)
    return scopes


def gradient_entry(grad_ops: list, forward_inputs) -> tf.Tensor | None:
    """The gradient arriving at a forward op's output: the one floating tensor its gradient
    function reads from outside itself for arithmetic (not for shapes), and that is not one of the
    forward op's own inputs."""
    members = set(grad_ops)
    entries = {t.ref() for op in grad_ops if op.type not in SHAPE_TYPES for t in op.inputs
               if t.op not in members and t.dtype.is_floating and
               all(t is not f for f in forward_inputs)}
    if len(entries) != 1:
        return None
    return next(iter(entries)).deref()
