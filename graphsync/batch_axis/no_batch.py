"""Ops whose outputs hold no example, whatever their inputs: shapes and sizes, variable updates,
summaries, prints, asserts, saves, and the optionals cond_v2 wraps a branch's intermediates in
(for the If's gradient alone)."""
from __future__ import annotations

from graphsync.batch_axis.registry import register

NO_BATCH = frozenset("""
Shape ShapeN Size Rank BroadcastArgs BroadcastGradientArgs Assign AssignAdd AssignSub AssignVariableOp
AssignAddVariableOp AssignSubVariableOp ScalarSummary HistogramSummary ImageSummary AudioSummary
AudioSummaryV2 TensorSummary TensorSummaryV2 MergeSummary WriteSummary WriteScalarSummary
WriteHistogramSummary WriteImageSummary Print PrintV2 Assert NoOp SaveV2 Save SaveSlices StringFormat
OptionalFromValue OptionalNone
""".split())


@register("no batch", *NO_BATCH)
def _no_batch(op, ins, context):
    return [None] * len(op.outputs), None
