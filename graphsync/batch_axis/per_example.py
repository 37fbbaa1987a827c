"""Ops that keep each example apart, the batch on axis 0 of the one input holding it and of their
first output: convolutions, pooling, resizing, and the op types the user declares so
(`GRAPHSYNC_PER_EXAMPLE_OPS`); cross entropy, whose logits and labels hold one row per example."""
from __future__ import annotations

import os

from graphsync.batch_axis.axes import only
from graphsync.batch_axis.registry import End, register

PER_EXAMPLE = frozenset("""
Conv2D Conv3D DepthwiseConv2dNative MaxPool MaxPoolV2 AvgPool AvgPool3D MaxPool3D LRN Dilation2D
ResizeBilinear ResizeNearestNeighbor ResizeBicubic ResizeArea SpaceToDepth DepthToSpace ExtractImagePatches
Conv2DBackpropInput Conv3DBackpropInput Conv3DBackpropInputV2 DepthwiseConv2dNativeBackpropInput
MaxPoolWithArgmax FusedResizeAndPadConv2D FusedPadConv2D AvgPoolGrad AvgPool3DGrad
""".split())
# transposed convolutions: the examples are the gradient they are written as (input 2)
_TRANSPOSED = ("Conv2DBackpropInput", "Conv3DBackpropInput", "DepthwiseConv2dNativeBackpropInput")
PER_EXAMPLE_ENV = "GRAPHSYNC_PER_EXAMPLE_OPS"   # the user's own per-example op types (declared_per_example)


def per_example_outputs(op, ins, data):
    """Each output's batch axes for an op that keeps the examples of input `data` apart: axis 0 of
    the first output, when the input holds the batch on axis 0."""
    axes = only(ins, data, op)
    if axes is not None and axes != frozenset({0}):
        raise End(f"{op.type} reads the batch on axes {sorted(axes)}, not 0")
    return [axes] + [None] * (len(op.outputs) - 1)


@register("per example", *PER_EXAMPLE)
def _per_example(op, ins, context):
    data = 2 if op.type.startswith(_TRANSPOSED) else 1 if op.type.startswith("AvgPool") and op.type.endswith("Grad") \
        else 0   # average pooling's adjoint (an upsampler or a blur): the examples are its input 1
    return per_example_outputs(op, ins, data), None


@register("per example", "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits")
def _cross_entropy(op, ins, context):
    """Logits and labels hold one row per example (labels fed with the data carry the batch too)."""
    logits, labels = ins[0], ins[1]
    if logits and labels and logits != labels:
        raise End("cross entropy whose logits and labels carry the batch on different axes")
    axes = logits or labels
    if axes and axes != frozenset({0}):
        raise End("cross entropy with the batch off the rows")
    return [axes, axes], None


def declared_per_example() -> frozenset:
    """The op types the user declares to keep each example apart, the batch on axis 0 of the one
    input holding it and of the first output (`GRAPHSYNC_PER_EXAMPLE_OPS=TypeA,TypeB`): a custom
    op, or one the table lacks, which would otherwise end the trace and, read back, be refused
    (graphsync/batch_axis/unfollowed.py). Read from the environment so that every way in (the CLI,
    `graphsync run`, no edit at all) takes the same declaration."""
    return frozenset(t.strip() for t in os.environ.get(PER_EXAMPLE_ENV, "").split(",") if t.strip())


def declared(op, ins, context):
    """The rule of an op type without a rule of its own that the user declares per example: the
    batch on axis 0 of the first input holding it (no registry entry: the environment may change
    between traces, and a declaration never overrides a rule)."""
    carrying = [i for i, axes in enumerate(ins) if axes]
    return per_example_outputs(op, ins, carrying[0] if carrying else 0), None
