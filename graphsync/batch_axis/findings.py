"""What the trace finds: where the batch axes are (Analysis), the ops that combine examples
(CrossOp, how: Crossing), and where the trace ended, and why (Ended). Plain values: the verdicts, the plan and
`graphsync inspect` read their fields, never text parsed back."""
from __future__ import annotations

import dataclasses
import enum

import tensorflow as tf


class Crossing(enum.StrEnum):
    """How an op combines examples; `described` is how verdicts say it (a BODY's verdict names
    the op inside the body instead)."""

    REDUCE = "reduce"       # a reduction over batch axes (and Softmax, L2Loss over them)
    CONTRACT = "contract"   # a contraction over them (MatMul, BatchMatMul, Einsum, …)
    KERNEL = "kernel"       # a fused batch norm's kernel in training mode
    ORDER = "order"         # sorting or selecting among the examples (TopK, Unique, ArgMax, …)
    BODY = "body"           # a call, If or While whose body holds such an op (CrossOp.inner)

    @property
    def described(self) -> str:
        return _DESCRIBED[self]


_DESCRIBED = {Crossing.REDUCE: "reduces over the batch", Crossing.CONTRACT: "contracts over the batch",
              Crossing.KERNEL: "normalizes with its batch statistics (training mode)",
              Crossing.ORDER: "orders or selects among the examples"}


@dataclasses.dataclass(frozen=True)
class CrossOp:
    """An op that combines examples: how (a Crossing), and whether it covers only part of the
    batch axes (partial: ghost batch norm's virtual batches)."""

    op: tf.Operation
    how: Crossing
    partial: bool = False
    inner: tuple = ()           # how BODY: (function name, the body's op, why it is a statistic there)
    returned: tuple = ()        # an If's or a While's: the outputs a body's cross-example value leaves by,
                                # when the body does not read it back itself (its verdict: where they go)


@dataclasses.dataclass(frozen=True)
class Ended:
    """Where a trace ended: the op, why (the text `graphsync inspect -v` lists), and the op type
    the table has no rule for when that is why: the op's own, or one inside a body the op runs
    (graphsync/batch_axis/unfollowed.py refuses those, naming the type). Unpacks as (op, why), the pair
    an entry of `Analysis.ended` was before it carried the type."""

    op: tf.Operation
    why: str
    no_rule_for: str | None = None

    @property
    def rule_missing(self) -> bool:
        return self.no_rule_for is not None

    def __iter__(self):
        return iter((self.op, self.why))


@dataclasses.dataclass
class Analysis:
    batch: dict                 # tensor ref → frozenset of the axes that carry the batch
    cross: dict                 # op → CrossOp, in the order found
    ended: list                 # Ended: where a trace ended (an op type the table does not know, …), and why
    bodies: dict = dataclasses.field(default_factory=dict)   # call or If op → [(function name, body Analysis)]
    outputs: tuple = ()         # a function body's: its output tensors, in order

    def carries(self, tensor: tf.Tensor) -> bool:
        return bool(self.batch.get(tensor.ref()))
