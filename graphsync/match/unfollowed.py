"""What the batch axis's trace could not check, said rather than left silent.

Past an op the tracer cannot follow (`Analysis.ended`: an op type its table does not know, a
reshape whose shape it cannot read), a tower's tensors may still hold its examples, on axes no
one knows. A reduction there that the model reads back may then be a batch statistic training
per tower, and neither the rule nor the check after the rewrite would see it. graphsync cannot
tell, so it says which reductions those are (`unfollowed`): the rewrite and `graphsync run` warn
in one line, `graphsync inspect` lists them. The op where the trace ended may itself combine
examples (an op type the table does not know): when the model reads its value back and no
reduction past it is said already, it is said the same way.

Refusing instead would stop legal training whenever the table lacks an op type (an image op of
the user's augmentation inside the towers), for reductions that most often are per example
(a layer norm over channels). A reduction whose input the trace did follow was judged by the
rule already and is not repeated here; one a batch-norm form covers is synchronized either way.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.match import batch_axis
from graphsync.match.hidden import is_inlined

REDUCING = batch_axis.REDUCTION_TYPES | batch_axis.ORDER_TYPES


@dataclasses.dataclass(frozen=True)
class Unfollowed:
    """A reduction past a trace end that the model reads back: `end` and its `why` led there."""

    op: str
    type: str
    end: str
    why: str

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
    ends = {op: why for op, why in analysis.ended if in_tower(op)}
    origin = {op: op for op in ends}
    stack, found = list(ends), []
    while stack and budget > 0:
        op = stack.pop()
        for t in op.outputs:
            for reader in t.consumers():
                if reader in origin or batch_axis.is_gradient_op(reader) or is_inlined(reader):
                    continue
                origin[reader] = origin[op]
                budget -= 1
                stack.append(reader)
                if reader.type in REDUCING and reader not in covered and reader not in analysis.cross \
                        and not analysis.carries(reader.inputs[0]) and _read_back(reader):
                    end = origin[reader]
                    found.append(Unfollowed(reader.name, reader.type, end.name, ends[end]))
    said = {u.end for u in found}
    found += [Unfollowed(op.name, op.type, op.name, why) for op, why in ends.items()   # the end may combine
              if op.name not in said and op not in covered and _read_back(op)]     # examples itself
    return found


def _read_back(op: tf.Operation, budget: int = 400) -> bool:
    """Whether a forward op after `op` that reads one of the model's variables takes its value
    into a tensor that is not a scalar (a normalization, a centring): where a batch statistic goes.
    Readers beyond the budget are not followed, and are taken to read it back (the line is said)."""
    walked = 0
    for reader in batch_axis.forward_readers(op, lambda reader: True, budget):
        walked += 1
        if any(o.shape.rank != 0 and o.dtype.is_floating for o in reader.outputs) and batch_axis.reads_variable(reader):
            return True
    return walked >= budget
