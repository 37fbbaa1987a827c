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
        stack = [(start, iter(reads(start)))]
        while stack:
            op, pending = stack[-1]
            for parent in pending:
                if parent not in placed and parent not in on_path:
                    on_path.add(parent)
                    stack.append((parent, iter(reads(parent))))
                    break
            else:
                stack.pop()
                on_path.discard(op)
                placed[op] = len(placed)
    return placed


def in_forward_order(items: Iterable, op_of) -> list:
    """`items` sorted by where the forward pass runs `op_of(item)`: by the op that makes its first
    input (what a rewrite leaves in place: a batch norm graphsync replaced still reads its layer's
    input, but the next layers no longer read it), then by the op itself; ties by op name."""
    items = list(items)
    ops = [op_of(item) for item in items]
    placed = positions([op.inputs[0].op for op in ops if op.inputs] + ops)
    keys = [(placed[op.inputs[0].op] if op.inputs else placed[op], placed[op], op.name) for op in ops]
    return [item for _, item in sorted(zip(keys, items), key=lambda pair: pair[0])]


def sort_names(graph: tf.Graph, names: Iterable[str], op_name=lambda name: name) -> list[str]:
    """`names` in forward order of the ops `op_name(name)` names; those that name no op last, by name."""
    names = sorted(names)
    known = [n for n in names if exists(graph.get_operation_by_name, op_name(n))]
    return (in_forward_order(known, lambda n: graph.get_operation_by_name(op_name(n)))
            + [n for n in names if n not in set(known)])


def exists(lookup, name: str) -> bool:
    """Whether `lookup(name)` (a graph's get_operation_by_name or get_tensor_by_name) finds it."""
    try:
        lookup(name)
        return True
    except (KeyError, ValueError):
        return False


def reads(op: tf.Operation) -> list:
    """The ops `op` waits for: its data and control inputs, but for a v1 while loop's back edge
    (NextIteration → Merge), which comes round from a later op."""
    back_edge = op.type in ("Merge", "RefMerge")
    return [t.op for t in op.inputs if not (back_edge and t.op.type.endswith("NextIteration"))] + \
        list(op.control_inputs)
