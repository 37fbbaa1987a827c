"""The batch axis, traced; the ops that combine examples found by rule, whatever their spelling.

The rule SPMD partitioners (GSPMD, DTensor) apply to a batch-sharded program: any computation that
combines different examples of the batch must combine all of them. `analyze(graph)` follows the
axes that hold the examples from the data sources through the forward pass, op by op, by a table
of rules (how each op type carries the batch axes of its inputs to its outputs); an op type the
table does not know ends the trace there, and is listed (`Analysis.ended`). A cross-example op
(CrossOp) reduces over an axis carrying the batch, contracts over it, does so in a kernel
(training-mode FusedBatchNorm*), or orders or selects among examples; `judge` says whether its
value is a batch statistic to synchronize, or stays per tower (a Judgement: a Verdict, and why).

    module            its one job
    trace             analyze: the walk from the data sources, each op by its type's rule
    registry          the table: op type → rule, one family per type; Context, End
    findings          what the trace finds: Analysis, CrossOp, Ended
    verdicts          where a cross-example value goes: statistic, terminal, ghost, order, synchronized
    unfollowed        reductions past where the trace ended that the model reads back: refused or said
    axes              what rules of several families read: the input carrying the batch, constant axes

    the families (the table's rows: adding an op type touches one of these)
    elementwise       unary, binary and n-ary elementwise ops, broadcast; IdentityN
    no_batch          shapes, sizes, variable updates, summaries, prints, asserts
    per_example       convolutions, pooling, resizing, cross entropy; the types the user declares
    fused_batch_norm  FusedBatchNorm* in training mode (a cross-example kernel)
    reductions        Sum, Mean, Max, …, L2Loss, Softmax
    order             sorts, top-k, arg-max, cumulative sums, unique
    contractions      MatMul, BatchMatMul, Einsum
    data_movement     transpose, expand/squeeze, concat, stack, broadcast, pad, tile, one-hot, …
    slicing           slice, strided slice, split, unstack
    gather            Gather, GatherV2, ResourceGather
    reshape           Reshape, read by probe sizes or by the factors of its shape (shape_factors)
    bodies            calls, If, While: function bodies traced with their inputs' axes
    control_flow_v1   Switch, Merge, Enter, Exit, NextIteration, LoopCond
    tensor_lists      TensorList and TensorArray ops
"""
from __future__ import annotations

from graphsync.batch_axis import (bodies, contractions, control_flow_v1, data_movement, elementwise,
                                  fused_batch_norm, gather, no_batch, order, per_example, reductions,
                                  reshape, slicing, tensor_lists)
from graphsync.batch_axis.elementwise import ELEMENTWISE
from graphsync.batch_axis.findings import Analysis, CrossOp, Ended
from graphsync.batch_axis.order import ORDER_TYPES
from graphsync.batch_axis.per_example import PER_EXAMPLE_ENV, declared_per_example
from graphsync.batch_axis.reductions import REDUCTION_TYPES
from graphsync.batch_axis.trace import NO_RULE, SOURCES, analyze
from graphsync.batch_axis.verdicts import GRAPHSYNC_VIEWS, Judgement, Verdict, judge

# Each family module registers its op types' rules when imported: all of them, before any trace.
FAMILIES = (elementwise, no_batch, per_example, fused_batch_norm, reductions, order, contractions,
            data_movement, slicing, gather, reshape, bodies, control_flow_v1, tensor_lists)

__all__ = ["Analysis", "CrossOp", "ELEMENTWISE", "Ended", "FAMILIES", "GRAPHSYNC_VIEWS", "Judgement", "NO_RULE",
           "ORDER_TYPES", "PER_EXAMPLE_ENV", "REDUCTION_TYPES", "SOURCES", "Verdict", "analyze",
           "declared_per_example", "judge"]
