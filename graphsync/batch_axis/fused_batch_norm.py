"""FusedBatchNorm in training mode combines examples in its kernel (CrossOp "kernel"): its y keeps
each example apart, its mean and variance hold none. graphsync's own per-tower statistics kernel
(the local moments of a rewrite) is a cross-example op whose y carries nothing: it feeds only the
residual graphsync sums over the towers."""
from __future__ import annotations

from graphsync.batch_axis.findings import CrossOp, Crossing
from graphsync.batch_axis.per_example import per_example_outputs
from graphsync.batch_axis.registry import register
from graphsync.match.fused import FUSED_TYPES, LOCAL_MOMENTS_GRADIENT, gradient_type


@register("fused batch norm", *FUSED_TYPES)
def _fused_batch_norm(op, ins, context):
    outs = per_example_outputs(op, ins, 0)
    training = op.get_attr("is_training")
    if training and ins[0] and gradient_type(op) == LOCAL_MOMENTS_GRADIENT:
        return [None] * len(op.outputs), CrossOp(op, Crossing.KERNEL)
    return [outs[0]] + [None] * (len(op.outputs) - 1), (CrossOp(op, Crossing.KERNEL) if training and ins[0] else None)
