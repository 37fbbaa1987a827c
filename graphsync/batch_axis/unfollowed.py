"""What the batch axis's trace could not check: refused or said, never left silent.

Past an op the tracer cannot follow (`Analysis.ended`), a tower's tensors may still hold its
examples, on axes no one knows. A reduction there that the model reads back may then be a batch
statistic training per tower, and neither the rule nor the check after the rewrite would see it;
the op where the trace ended may combine examples itself. `unfollowed` finds both, when the model
reads their value back (a value reaching only a loss or a summary is terminal, whatever it is).

What becomes of them depends on why the trace ended. An op type the table has no rule for is
refused (`refuse`), in one line naming it and the remedy: the user knows what a custom op does,
and declares it per example (`GRAPHSYNC_PER_EXAMPLE_OPS`, batch_axis.declared_per_example); the
trace then goes on through it and the rule judges what follows. Where the op type is known but its
use could not be read (a reshape whose target is computed in a way the tracer cannot read, inputs
of unknown rank), no declaration helps and the reduction past it is most often per example (a
layer norm over channels): the rewrite and `graphsync run` warn in one line instead. `graphsync
inspect` lists both. A reduction whose input the trace did follow was judged by the rule already
and is not repeated here; one a batch-norm form covers is synchronized either way.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.batch_axis.order import ORDER_TYPES
from graphsync.batch_axis.per_example import PER_EXAMPLE_ENV
from graphsync.batch_axis.reductions import REDUCTION_TYPES
from graphsync.errors import GraphsyncError
from graphsync.match.hidden import is_inlined
from graphsync.graph.backward import is_backward
from graphsync.graph.backward import forward_readers
from graphsync.graph.walks import reads_variable

REDUCING = REDUCTION_TYPES | ORDER_TYPES


@dataclasses.dataclass(frozen=True)
class Unfollowed:
    """A reduction past a trace end that the model reads back: `end` and its `why` led there."""

    op: str
    type: str
    end: str
    why: str
    unknown_type: dataclasses.InitVar[str | None] = None

    def __post_init__(self, unknown_type):
        # The op type without a rule that ended the trace, if that is why it ended (the end's
        # Ended.no_rule_for): an attribute, not a field, so `graphsync inspect --json` lists the same keys.
        object.__setattr__(self, "unknown_type", unknown_type)

    def line(self) -> str:
        if self.op == self.end:
            return (f"{self.op} ({self.type}) holds the batch and the trace cannot follow it ({self.why}), "
                    "and the model reads its value back")
        return (f"{self.op} ({self.type}) reduces a tensor the batch axis could not be followed into "
                f"(past {self.end}: {self.why}), and the model reads it back")


def unfollowed(analysis, in_tower, covered=frozenset(), budget: int = 200_000) -> list[Unfollowed]:
    """The reductions past the trace's ends inside the towers (`in_tower(op)`) that the model
    reads back, in the graph's order of the walk, then the ends read back that no reduction past
    them names; those `covered` (synchronized by a form) left out. One walk from every end at
    once: each op is visited once, whatever the number of ends."""
    ends = {end.op: end for end in analysis.ended if in_tower(end.op)}
    origin = {op: op for op in ends}
    stack, found = list(ends), []
    while stack and budget > 0:
        op = stack.pop()
        for t in op.outputs:
            for reader in t.consumers():
                if reader in origin or is_backward(reader) or is_inlined(reader):
                    continue
                origin[reader] = origin[op]
                budget -= 1
                stack.append(reader)
                if reader.type in REDUCING and reader not in covered and reader not in analysis.cross \
                        and not analysis.carries(reader.inputs[0]) and _read_back(reader):
                    end = origin[reader]
                    found.append(Unfollowed(reader.name, reader.type, end.name, ends[end].why, ends[end].no_rule_for))
    said = {u.end for u in found}
    found += [Unfollowed(op.name, op.type, op.name, end.why, end.no_rule_for) for op, end in ends.items()
              if op.name not in said and op not in covered and _read_back(op)]   # the end may combine examples itself
    return found


def _read_back(op: tf.Operation, budget: int = 400) -> bool:
    """Whether a forward op after `op` that reads one of the model's variables takes its value
    into a tensor that is not a scalar (a normalization, a centring): where a batch statistic goes.
    Readers beyond the budget are not followed, and are taken to read it back (the line is said)."""
    walked = 0
    for reader in forward_readers(op, lambda reader: True, budget):
        walked += 1
        if any(o.shape.rank != 0 and o.dtype.is_floating for o in reader.outputs) and reads_variable(reader):
            return True
    return walked >= budget


def refuse(found) -> None:
    """One line naming the first op type without a rule whose value, or a reduction past it, the
    model reads back: it may combine examples, which would train per tower."""
    unknown = [u for u in found if u.unknown_type]
    if unknown:
        first, more = unknown[0], len(unknown) - 1
        others = f" (and {more} more: graphsync inspect)" if more else ""
        raise GraphsyncError(
            f"{first.line()}{others}: graphsync cannot tell whether {first.unknown_type} combines examples; "
            f"if it keeps each example apart (batch on axis 0), declare it: "
            f"{PER_EXAMPLE_ENV}={first.unknown_type}; else compute it outside the towers")
