"""Every node attribute graphsync puts on the ops it makes or edits, in one registry: a mark says
what an op is or how to find its partners, where a name could be mistaken for the user's, and it
survives a saved graph (a leading underscore keeps TensorFlow from checking it against the op's
registration). The stage that sets a mark and the stages that read it name it here, never by its
string. Importing this imports no TensorFlow (`graphsync run` imports it before the script does).

    recompute and segments (graphsync/splice/recompute.py, segments.py)
        RECOMPUTED        a forward op copied to run late, in the backward: forward arithmetic,
                          although only the backward reads it (graph/backward.py never counts it)
        PINNED            a ControlTrigger whose control edge keeps Grappler from absorbing a forward
                          op into its one reader once the backward's readers moved to copies
        RECOMPUTE_ROOTS   on the op whose gradient recomputes a layer: the copies' roots
        SEGMENT_ROOTS     on a segment's trigger: the roots its region starts from,
        SEGMENT_LATER     every later segment's roots in the tower,
        SEGMENT_MEMBERS   the triggers of every layer of the segment,
        SEGMENT_REACHED   set once tf.gradients has reached that trigger
    the exchange's views (graphsync/exchange/views.py: the keys a view's gradient finds the
    other towers by) and transports
        SPREAD, MEMBERS, MEMBER, GROUP_KEY, INSTANCE_KEY, TIMEOUT_MS, QUEUE, PS, WORKER, WORKERS,
        TRANSPORT         the name its gradient sum is registered under
        EXCHANGE          a ps queue's enqueue or dequeue of a synchronized step (between_graph/steps.py)
        GRADIENT_SCOPE    on a view: the name scope its gradient's sum is built under (the transport's
                          choice when the view was made; never worked out again from a name)
    the exchange (graphsync/exchange/): on every op that carries a layer's statistics across towers
        LAYER             the layer (LayerPlan.name): on the splice's other ops too (graphsync/splice/)
        DIRECTION         "forward" (the statistics) or "backward" (their gradients' sums)
        PASS              on every op the splice makes for a layer: "forward" or "backward", the pass
                          of the step it is for (a recomputed copy of one: forward; an exchange's
                          made later, by a gradient function, says it by DIRECTION alone: pass_of)
        AGGREGATION       an op of a sync group's merge on its aggregation device (strategy gather):
                          verify counts the bytes that cross to and from it
    the splice's other edits
        INLINED           a tf.function call graphsync/splice/inline.py inlined: it no longer runs
        GATE              a Switch graphsync/splice/stand_in.py puts before a rewritten If
    what `graphsync verify` reads (graphsync/splice/marks.py: the statistics each tower reads)
        STATISTICS (the mark of the statistics read, with LAYER), FORM, NORMALIZATION, FOUND_AS,
        TOWER             "<index>:<prefix>" of the tower reading them: the rewrite's towers, which
                          verify cannot find again by structure once the batch norms are replaced
"""
from __future__ import annotations

import enum


class Mark(enum.Enum):
    """One node attribute of graphsync's (module docstring); `.value` is the attribute's name."""

    RECOMPUTED = "_graphsync_recompute"
    PINNED = "_graphsync_pinned"
    RECOMPUTE_ROOTS = "_graphsync_recompute_roots"
    SEGMENT_ROOTS = "_graphsync_segment_roots"
    SEGMENT_LATER = "_graphsync_segment_later"
    SEGMENT_MEMBERS = "_graphsync_segment_members"
    SEGMENT_REACHED = "_graphsync_segment_reached"
    SPREAD = "_graphsync_spread"
    MEMBERS = "_graphsync_members"
    MEMBER = "_graphsync_member"
    GROUP_KEY = "_graphsync_group_key"
    INSTANCE_KEY = "_graphsync_instance_key"
    TIMEOUT_MS = "_graphsync_timeout_ms"
    QUEUE = "_graphsync_queue"
    PS = "_graphsync_ps"
    WORKER = "_graphsync_worker"
    WORKERS = "_graphsync_workers"
    TRANSPORT = "_graphsync_transport"
    GRADIENT_SCOPE = "_graphsync_gradient_scope"
    EXCHANGE = "_graphsync_exchange"
    INLINED = "_graphsync_inlined"
    GATE = "_graphsync_gate"
    LAYER = "_graphsync_layer"
    DIRECTION = "_graphsync_direction"
    PASS = "_graphsync_pass"
    AGGREGATION = "_graphsync_aggregation"
    FORM = "_graphsync_form"
    STATISTICS = "_graphsync_statistics"
    NORMALIZATION = "_graphsync_normalization"
    FOUND_AS = "_graphsync_found_as"
    TOWER = "_graphsync_tower"

    @classmethod
    def key(cls, name: str) -> "Mark":
        """The mark of a view's key given by keyword (`members=…`, `group_key=…`)."""
        return cls[name.upper()]


# the triggers of a layer's recompute, rewritten before its gradients (graphsync/splice/recompute.py)
TRIGGERS = (Mark.RECOMPUTE_ROOTS, Mark.SEGMENT_ROOTS, Mark.SEGMENT_LATER, Mark.SEGMENT_MEMBERS,
            Mark.SEGMENT_REACHED)
# what a recomputed copy must not inherit from the op it copies: its triggers, and the mark of the
# statistics a tower reads (a fused layer's normalization carries it; each tower reads them once)
NOT_COPIED = TRIGGERS + (Mark.STATISTICS, Mark.FORM, Mark.NORMALIZATION, Mark.FOUND_AS, Mark.TOWER)


# what an op of one layer's exchange carries (graphsync/exchange/marking.py)
EXCHANGE_MARKS = (Mark.LAYER, Mark.DIRECTION, Mark.AGGREGATION)


class Direction(enum.Enum):
    """Which way an exchange carries a layer's numbers (`Mark.DIRECTION`), and which pass of the
    step an op the splice made is for (`Mark.PASS`)."""

    FORWARD = "forward"     # the statistics, to every tower
    BACKWARD = "backward"   # the sums of the towers' gradients at them

    @classmethod
    def of_tag(cls, tag: str) -> "Direction | None":
        """The direction of an exchange the splice names by `tag` ("forward", "forward_ties",
        "backward_0", …): how its ops are named and marked. None for a tag of neither."""
        return next((d for d in cls if tag.startswith(d.value)), None)


def has(op, mark: Mark) -> bool:
    return mark.value in op.node_def.attr


def get(op, mark: Mark):
    """The mark's value as TensorFlow gives it (bytes, int, list)."""
    return op.get_attr(mark.value)


def text(op, mark: Mark) -> str:
    return op.get_attr(mark.value).decode()


def value(x):
    """An AttrValue: a flag (bool), a number (int), a text (str) or a list of names (bytes)."""
    from tensorflow.core.framework import attr_value_pb2
    if isinstance(x, bool):
        return attr_value_pb2.AttrValue(b=x)
    if isinstance(x, int):
        return attr_value_pb2.AttrValue(i=x)
    if isinstance(x, str):
        return attr_value_pb2.AttrValue(s=x.encode())
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=list(x)))


def exchanged(op) -> "tuple[str, Direction] | None":
    """(layer, direction) of an op that carries a layer's statistics or their gradients across
    towers (graphsync/exchange/); None for every other op."""
    if not has(op, Mark.DIRECTION):
        return None
    return text(op, Mark.LAYER), Direction(text(op, Mark.DIRECTION))


def pass_of(op) -> "Direction | None":
    """The pass (forward or backward) graphsync made `op` for: its PASS, or an exchange's direction
    (a gradient's sum built by tf.gradients after the rewrite has no PASS); None for every other op."""
    for mark in (Mark.PASS, Mark.DIRECTION):
        if has(op, mark):
            return Direction(text(op, mark))
    return None


def made_by_graphsync(op) -> bool:
    """Whether graphsync's splice or exchange made `op` for a layer (a copy the recompute makes
    of one included: it keeps its marks)."""
    return has(op, Mark.LAYER)


def is_recomputed(op) -> bool:
    return has(op, Mark.RECOMPUTED)
