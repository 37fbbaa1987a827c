"""The trace: the axes that hold the examples, followed from the data sources (placeholders,
iterators, queues: their axis 0) through the forward pass, op by op, by the rule the registry holds
for each op type (graphsync/batch_axis/registry.py), in the spirit of GSPMD's sharding propagation.
An op type without a rule ends the trace there, and is listed (`Analysis.ended`), never silently
passed through, unless the user declares it per example (per_example.declared_per_example).
Gradient ops are not the forward and are not traced (graphsync/graph/backward.py), nor are the
calls graphsync inlined (they no longer run)."""
from __future__ import annotations

import tensorflow as tf

from graphsync.batch_axis.bodies import Bodies
from graphsync.batch_axis.findings import Analysis, Ended
from graphsync.batch_axis.per_example import declared, declared_per_example
from graphsync.batch_axis.registry import Context, End, rule_for
from graphsync.graph import by_type
from graphsync.graph.backward import is_backward
from graphsync.match.hidden import is_inlined

SOURCES = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext", "IteratorGetNextSync",
                     "QueueDequeueMany", "QueueDequeueManyV2", "QueueDequeueUpTo", "QueueDequeueUpToV2",
                     "ParseExample", "ParseExampleV2", "DecodeCSV"})
NO_RULE = "no rule for op type"           # how an op type the table lacks ends the trace (Ended.no_rule_for)


def analyze(graph: tf.Graph, ops=None) -> Analysis:
    """Traces the batch axes through `graph` (or from `ops`, the graph's ops, when given)."""
    seeds = []
    for op in by_type.ops_of_types(graph, SOURCES) if ops is None else (op for op in ops if op.type in SOURCES):
        if not is_backward(op):
            seeds += [(t, frozenset({0})) for t in op.outputs if t.shape.rank is None or t.shape.rank >= 1]
    return _trace(seeds, Bodies.of(graph, _trace))


def _trace(seeds, bodies) -> Analysis:
    batch, cross, ended, called = {}, {}, {}, {}
    context = Context(batch, bodies, called)
    queue = []
    for t, axes in seeds:
        if axes:
            batch[t.ref()] = axes
            queue.append(t)
    seen_ops = set()
    while queue:
        tensor = queue.pop()
        for op in tensor.consumers():
            if is_backward(op) or is_inlined(op):   # an inlined call no longer runs
                continue
            ins = [batch.get(t.ref()) for t in op.inputs]
            key = (op, tuple(ins))
            if key in seen_ops:
                continue
            seen_ops.add(key)
            try:
                outs, crossed = _rule(op.type)(op, ins, context)
            except End as why:
                ended.setdefault(op, Ended(op, str(why), why.no_rule_for))
                continue
            except (ValueError, TypeError, IndexError, ZeroDivisionError) as exc:
                ended.setdefault(op, Ended(op, f"its batch axes cannot be read ({type(exc).__name__})"))
                continue
            if crossed is not None:
                cross[op] = crossed
            for t, axes in zip(op.outputs, outs):
                if axes and batch.get(t.ref()) != axes and t.ref() not in batch:
                    batch[t.ref()] = axes
                    queue.append(t)
    return Analysis(batch, cross, list(ended.values()), called)


def _rule(op_type: str):
    """The registry's rule for `op_type`, else the declared per-example rule when the user declares
    the type so; else the trace ends at the op (End, naming the type)."""
    rule = rule_for(op_type)
    if rule is None:
        if op_type in declared_per_example():
            return declared
        raise End(f"{NO_RULE} {op_type}", no_rule_for=op_type)
    return rule
