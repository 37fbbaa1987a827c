"""Fused batch norm: a `FusedBatchNorm`/`V2`/`V3` op in training mode.

Its gradient ops are the `FusedBatchNormGrad*` ops that read its reserve-space output 3 (how
TensorFlow's own gradient wires them), whatever scope `tf.gradients` put them in.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import by_type, tf_private
from graphsync.graph.op_types import FUSED_BATCH_NORM_TYPES
from graphsync.match.candidate import Candidate
from graphsync.match.layer_form import LayerForm

FUSED_TYPES = FUSED_BATCH_NORM_TYPES
STARTS = FUSED_TYPES   # the op types candidates() starts from (see match.starting_types)


def is_training(op: tf.Operation) -> bool:
    return bool(op.get_attr("is_training"))


def fused_gradient_ops(op: tf.Operation) -> list:
    """The FusedBatchNormGrad* ops that differentiate `op`, in creation order."""
    reserve = op.outputs[3]
    grads = [c for c in reserve.consumers()
             if c.type.startswith("FusedBatchNormGrad") and c.inputs[3] is reserve]
    return sorted(grads, key=tf_private.creation_order)


def is_live(op: tf.Operation) -> bool:
    """Whether anything still reads y, mean or variance (false after graphsync rerouted them)."""
    return any(t.consumers() for t in op.outputs[:3]) or bool(tf_private.control_outputs(op))


LOCAL_MOMENTS_GRADIENT = "GraphsyncFusedLocalMoments"   # graphsync's per-tower statistics kernel
GRAPHSYNC_GRADIENTS = (LOCAL_MOMENTS_GRADIENT, "GraphsyncFusedNormalize", "GraphsyncSynchronizedNormalize",
                       "GraphsyncConditionalStandIn")


def gradient_type(op: tf.Operation) -> str | None:
    """The gradient an op was given by name (`_gradient_op_type`, how graphsync marks its own ops,
    in saved graphs too), or None."""
    attrs = op.node_def.attr   # a tenth of get_attr's cost where the attribute is absent (its ValueError)
    return attrs["_gradient_op_type"].s.decode() if "_gradient_op_type" in attrs else None


def made_by_graphsync(op: tf.Operation) -> bool:
    """graphsync's own fused kernels carry its gradient names (in saved graphs too)."""
    return gradient_type(op) in GRAPHSYNC_GRADIENTS


def candidates(graph: tf.Graph) -> list[Candidate]:
    """Every fused batch-norm op in the graph, with the reason it cannot be synchronized if any
    that does not depend on towers."""
    found = []
    for op in by_type.ops_of_types(graph, FUSED_TYPES):
        if made_by_graphsync(op):
            continue
        reason = None
        if not is_training(op):
            reason = "inference mode (is_training=False): uses the moving statistics"
        elif not is_live(op):
            reason = "nothing reads its outputs (already synchronized, or unused)"
        found.append(Candidate(op, LayerForm.FUSED, reason))
    return found
