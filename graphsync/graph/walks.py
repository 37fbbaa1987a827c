"""Walks over a graph's edges that every stage takes, kept here so that no stage borrows another's:
the forward readers downstream of an op (the batch axis's verdicts and unfollowed reductions, the
plan's tower-dependent reductions), whether an op takes one of the model's variables in, and every
op downstream of some (function bodies' outputs, the splice's recomputed regions). The ancestors
of what a run executes are graphsync/graph/executed.py's."""
from __future__ import annotations

import tensorflow as tf

from graphsync.graph import tf_private
from graphsync.graph.backward import is_backward

_VARIABLES = frozenset({"VariableV2", "Variable", "VarHandleOp", "ReadVariableOp", "ResourceGather"})


def forward_readers(op: tf.Operation, enter, budget: int = 400):
    """Each forward op downstream of `op`, once (gradient ops left out), walked on past those for
    which `enter(reader)` holds; at most `budget` of them."""
    seen, stack = {op}, [op]
    while stack and budget > 0:
        for t in stack.pop().outputs:
            for reader in t.consumers():
                if reader in seen or is_backward(reader):
                    continue
                seen.add(reader)
                budget -= 1
                yield reader
                if enter(reader):
                    stack.append(reader)


def reads_variable(op: tf.Operation, depth: int = 3) -> bool:
    """Whether `op` takes one of the model's variables in (through a few reads, casts, reshapes)."""
    frontier = [t.op for t in op.inputs]
    for _ in range(depth):
        if any(o.type in _VARIABLES for o in frontier):
            return True
        frontier = [t.op for o in frontier if o.type in ("Identity", "Cast", "Enter", "Switch", "ReadVariableOp",
                                                          "Reshape", "ExpandDims")
                    for t in o.inputs]
    return any(o.type in _VARIABLES for o in frontier)


def descendants(ops, control: bool = False) -> set:
    """`ops` and every op that reads data from them, on and on; with `control`, every op that runs
    after one of them (control edges too)."""
    seen, stack = set(ops), list(ops)
    while stack:
        op = stack.pop()
        readers = [c for t in op.outputs for c in t.consumers()]
        for nxt in (readers + tf_private.control_outputs(op)) if control else readers:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen
