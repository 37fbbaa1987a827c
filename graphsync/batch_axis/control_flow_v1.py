"""Control flow v1, whose ops are in the graph: Switch and Merge (a tf.cond), Enter, Exit and
NextIteration (a loop's frame), LoopCond. Enter, Exit and NextIteration pass their value on, in or
out of the frame. The Merge joining a loop's entry and its NextIteration (the back edge) is met
with the entry's axes first and again when the body reaches the NextIteration, where a body that
moved the batch ends the trace. A statistic inside the recurrence (a cross-example op read back
into the examples in the loop's frame) is the op itself, which graphsync/plan/reductions.py does
not synchronize."""
from __future__ import annotations

from graphsync.batch_axis.axes import only
from graphsync.batch_axis.registry import End, register


@register("control flow v1", "Switch", "RefSwitch")
def _switch(op, ins, context):
    axes = only(ins, 0, op)
    return [axes, axes], None


@register("control flow v1", "Merge", "RefMerge")
def _merge(op, ins, context):
    values = {a for a in ins if a}
    if len(values) > 1:
        raise End("a merge of branches carrying the batch on different axes")
    return [values.pop() if values else None, None], None


@register("control flow v1", "Enter", "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration")
def _loop_frame(op, ins, context):
    """The value, unchanged, in or out of a loop's frame; a body that moves the batch ends the
    trace at the Merge (_merge)."""
    return [only(ins, 0, op)], None


@register("control flow v1", "LoopCond")
def _loop_cond(op, ins, context):
    if ins[0]:
        raise End("a loop whose condition carries the batch")
    return [None], None
