"""Finding batch-norm layers in a graph, by op type and edges, never by name.

A fused batch norm is a `FusedBatchNorm`/`V2`/`V3` op in training mode; its gradient ops are the
`FusedBatchNormGrad*` ops that read its reserve-space output 3 (how TensorFlow's own gradient wires
them), whatever scope `tf.gradients` put them in.
"""
from __future__ import annotations

import dataclasses

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


def fused_candidates(graph: tf.Graph) -> list[Candidate]:
    """Every fused batch-norm op in the graph, with the reason it cannot be synchronized if any
    that does not depend on towers."""
    found = []
    for op in graph.get_operations():
        if op.type not in FUSED_TYPES:
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
