"""Moving averages that several towers update in the same step.

A batch norm's moving mean and variance are usually shared by the towers, and a step runs the
updates of one tower (tf_cnn_benchmarks, slim's model_deploy: the first clone's UPDATE_OPS). A
script that gathers `UPDATE_OPS` without a scope runs every tower's update of the same variable.
Unsynchronized, each moved it by its own tower's statistics; synchronized, each moves it by the
same global statistics, so the average moves up to T times as far as one device's would (T
updates in a row, or T that read the old value concurrently and each subtract the same step).
graphsync does not change what the user's step runs: it names the layers, with the remedy, in one
line (a GraphsyncWarning).
"""
from __future__ import annotations

import collections

import tensorflow as tf

from graphsync.graph import tf_private
from graphsync.graph.op_types import WRITE_TYPES
from graphsync.graph.backward import is_backward

_DEPTH = 8          # ops from a batch statistic to the write of its moving average (keras: Sub, Mul, Cast…)
_PASS_THROUGH = frozenset({"Identity", "ReadVariableOp", "RefIdentity"})


def writes_per_layer(layers) -> dict:
    """{layer name: {variable op: [(tower label, write op)]}} for the planned `layers`, found from
    the statistics each site computes (before the splice moves their readers)."""
    found = {}
    for layer in layers:
        found[layer.name] = {v: w for v, w in writes_of(layer).items() if len({t for t, _ in w}) > 1}
    return found


def writes_of(layer) -> dict:
    """{variable op: [(tower label, write op)]}: every write of a moving average that `layer`'s
    statistics feed, one tower's or several (before the splice moves their readers)."""
    by_variable = collections.defaultdict(list)
    for site in layer.sites:
        for write in _writes_from(_statistics(site)):
            by_variable[variable_of(write)].append((site.tower.label, write))
    return dict(by_variable)


def variable_of(write: tf.Operation) -> tf.Operation:
    """The variable (VariableV2, VarHandleOp) a write assigns."""
    return _variable(write.inputs[0])


def repeated(found: dict) -> list:
    """(layer name, number of towers) for each layer whose moving average is updated by several
    towers' writes that one op waits for (the same step runs them)."""
    writes = [w for by_variable in found.values() for ws in by_variable.values() for _, w in ws]
    # A tower's update that no op waits for (left in UPDATE_OPS, unrun) has no successor at all.
    bit = {w: 1 << i for i, w in enumerate(w for w in writes if _successors(w))}
    joint = _joint(_last_labels(bit))
    said = []
    for name, by_variable in found.items():
        most = max((_run_together([bit[w] for _, w in ws if w in bit], joint) for ws in by_variable.values()),
                   default=0)
        if most > 1:
            said.append((name, most))
    return said


def _statistics(site) -> list:
    op = site.op
    if op.type.startswith("FusedBatchNorm"):
        return list(op.outputs[1:3])
    variance = getattr(site.parts, "variance", None)
    return [op.outputs[0]] + ([variance.outputs[0]] if variance is not None else [])


def _writes_from(tensors: list) -> list:
    """Writes within `_DEPTH` ops downstream of `tensors`, through data edges, outside gradients."""
    found, seen, frontier = [], set(), [c for t in tensors for c in t.consumers()]
    for _ in range(_DEPTH):
        following = []
        for op in frontier:
            if op in seen or is_backward(op):
                continue
            seen.add(op)
            if op.type in WRITE_TYPES:
                found.append(op)
                continue
            following.extend(c for t in op.outputs for c in t.consumers())
        frontier = following
    return found


def _variable(t: tf.Tensor) -> tf.Operation:
    op = t.op
    while op.type in _PASS_THROUGH and op.inputs:
        op = op.inputs[0].op
    return op


def _run_together(bits: list, joint: dict) -> int:
    """How many of the writes (`bits`) share a downstream op with the first one: those a single
    fetch runs in the same step."""
    if len(bits) < 2:
        return len(bits)
    return bin(joint.get(bits[0], 0) & sum(bits)).count("1")


def _joint(labels: set) -> dict:
    """{a write's bit: the bits of every write that shares a downstream op with it}, from the
    labels of `_last_labels`."""
    joint = {}
    for label in labels:
        rest = label
        while rest:
            low = rest & -rest
            joint[low] = joint.get(low, 0) | label
            rest ^= low
    return joint


def _successors(op: tf.Operation) -> list:
    return [c for t in op.outputs for c in t.consumers()] + tf_private.control_outputs(op)


def _last_labels(bit: dict) -> set:
    """The label of each op downstream of the writes in `bit` that nothing there runs after, or
    that is on or after a cycle: the bits of the writes it is downstream of (data or control edges).
    A label only grows along an edge, so every op's is inside one of these: two writes share a
    downstream op exactly when both bits are in one of them (`_run_together` reads a few labels,
    not one per op).

    One walk for all the layers' writes, where a walk per variable went over the same optimizer and
    train ops again for each (a tenth of that rewrite). In topological order, so that each op is
    labelled once; ops on a cycle (a v1 while loop's NextIteration) are then relabelled until
    nothing changes."""
    successors, stack = {}, list(bit)   # each op's successors, read once for the three passes
    while stack:
        op = stack.pop()
        if op not in successors:
            successors[op] = _successors(op)
            stack.extend(nxt for nxt in successors[op] if nxt not in successors)
    waiting = dict.fromkeys(successors, 0)
    for following in successors.values():
        for nxt in following:
            waiting[nxt] += 1
    labels = dict(bit)
    ready = [op for op in successors if not waiting[op]]
    while ready:
        op = ready.pop()
        for nxt in successors[op]:
            labels[nxt] = labels.get(nxt, 0) | labels[op]
            waiting[nxt] -= 1
            if not waiting[nxt]:
                ready.append(nxt)
    cyclic = [op for op in successors if waiting[op]]
    stack = list(cyclic)
    while stack:   # cycles: propagate until no label grows
        op = stack.pop()
        for nxt in successors[op]:
            grown = labels.get(nxt, 0) | labels.get(op, 0)
            if grown != labels.get(nxt, 0):
                labels[nxt] = grown
                stack.append(nxt)
    return {labels.get(op, 0) for op in cyclic} | {labels[op] for op, following in successors.items() if not following}
