"""The order the forward pass runs ops in, so that every listing reads a network from input to
output (conv0, conv1, …, conv10) whatever its names sort as.

One topological order of the data and control edges: a depth-first walk up the inputs of the ops
to order, each op numbered once everything it reads is (post-order). It visits the ancestry of
those ops only — the forward pass up to the last of them, never the gradients below — once, in
O(ops + edges). Op ids (creation order) are not used: a graph loaded from a file may number its
ops in another order. Walks start from the ops by name, so two processes that built the same
graph order it alike; the back edges of v1 while loops (NextIteration → Merge) are skipped.
"""
from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf


def positions(ops: Iterable[tf.Operation]) -> dict[tf.Operation, int]:
    """op → its place in one topological order of the graph, for `ops` and all their ancestors."""
    placed: dict[tf.Operation, int] = {}
    for start in sorted(set(ops), key=lambda op: op.name):
        if start in placed:
            continue
        on_path = {start}
        stack = [(start, _reads(start))]
        while stack:
            op, pending = stack[-1]
            for parent in pending:
                if parent not in placed and parent not in on_path:
                    on_path.add(parent)
                    stack.append((parent, _reads(parent)))
                    break
            else:
                stack.pop()
                on_path.discard(op)
                placed[op] = len(placed)
    return placed


def sort_names(graph: tf.Graph, names: Iterable[str], op_name=lambda name: name) -> list[str]:
    """`names` in forward order of the ops `op_name(name)` names; those that name no op last, by name."""
    names = list(names)
    ops = {}
    for name in names:
        try:
            ops[name] = graph.get_operation_by_name(op_name(name))
        except (KeyError, ValueError):
            pass
    placed = positions(ops.values())
    return sorted(names, key=lambda n: (0, placed[ops[n]], n) if n in ops else (1, 0, n))


def _reads(op: tf.Operation):
    return iter([t.op for t in op.inputs] + list(op.control_inputs))
