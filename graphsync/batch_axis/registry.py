"""The one table of how each op type carries the batch axes: op type → rule, each type claimed by
one family (one module of graphsync/batch_axis/), so that adding an op type touches one small file
and the table says where each type lives (XLA's SPMD partitioner keeps one handler per family
behind one dispatch table the same way).

Every rule has one signature, `rule(op, ins, context) -> (outs, crossed)`: `ins` the batch axes of
each input (a frozenset of axes, or None where the input holds no example), `outs` those of each
output, `crossed` a CrossOp when the op combines examples, else None. A rule that cannot follow its
op raises End, saying why: the trace ends there. `context` (Context) carries what the few rules
that need more than the op and its inputs' axes read.

A second claim on an op type raises RuleConflict when the claiming module is imported: which rule
applied would otherwise depend on the order the families were imported in.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


class End(Exception):
    """The trace ends at this op: why (the exception's text), and `no_rule_for`, the op type the
    table has no rule for when that is why (the op's own, or one inside a body it runs)."""

    def __init__(self, why: str, no_rule_for: str | None = None):
        super().__init__(why)
        self.no_rule_for = no_rule_for


class RuleConflict(Exception):
    """An op type claimed by two families, or twice by one."""


@dataclasses.dataclass(frozen=True)
class Context:
    """What a trace shares with its rules beyond the op and its inputs' axes."""

    batch: dict      # tensor ref → the axes carrying the batch, traced so far (a reshape reads its shape's sources)
    bodies: object   # the graph's function bodies (bodies.Bodies): calls, If and While trace them
    called: dict     # call, If or While op → [(function name, body Analysis)], written by their rules


Rule = Callable[..., tuple]   # (op, ins, context) -> (outs, crossed)


class Registry:
    """Op type → (family, rule), each op type claimed once."""

    def __init__(self):
        self._rules: dict[str, Rule] = {}
        self._families: dict[str, str] = {}

    def register(self, family: str, *op_types: str) -> Callable[[Rule], Rule]:
        """A decorator: the rule it decorates is how each of `op_types` carries the batch axes, in
        `family`. Refuses (RuleConflict) before claiming any of them if one is claimed already."""
        def claim(rule: Rule) -> Rule:
            seen = set()
            for op_type in op_types:
                first = self._families.get(op_type) or (family if op_type in seen else None)
                if first is not None:
                    raise RuleConflict(f"op type {op_type} has a rule in family {first!r}, and family {family!r} "
                                       "claims it too: one op type, one family")
                seen.add(op_type)
            for op_type in op_types:
                self._rules[op_type], self._families[op_type] = rule, family
            return rule
        return claim

    def rule_for(self, op_type: str) -> Rule | None:
        """The rule for `op_type`, or None: the table has none (the trace ends there)."""
        return self._rules.get(op_type)

    def family_of(self, op_type: str) -> str | None:
        return self._families.get(op_type)

    def op_types(self, family: str | None = None) -> frozenset:
        """The op types of `family`, or of every family."""
        return frozenset(t for t, f in self._families.items() if family is None or f == family)


RULES = Registry()   # filled as the family modules are imported (graphsync/batch_axis/__init__.py)
register, rule_for, family_of = RULES.register, RULES.rule_for, RULES.family_of
