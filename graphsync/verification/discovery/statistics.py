"""Which writes of a training step are moving statistics of the batch, and which are not.

Moving statistics (a batch norm's moving mean and variance) are what synchronized statistics make
independent of where each example sits. Other writes that depend on the examples legitimately
change when examples move: tensorpack's `add_moving_summary` keeps EMAs of tower 0's cost and
error rates, any trainer may average one tower's loss. Counting those would fail every graph. So
only writes whose value comes from batch statistics count toward the verdict; the others are
compared too, and listed apart.

A write's value comes from batch statistics when, walking up from it, one reaches

    a batch norm's statistics   the batch mean and variance outputs of a fused op in training mode,
                                the mean and variance of every batch-norm form graphsync matches
                                (tf.nn.moments, by hand, sufficient statistics, weighted, the
                                outputs of a conditional batch norm's If)
    a synchronized layer        any op of the forward exchange of a layer graphsync synchronized
                                (marked so: graphsync/exchange/marking.py), on its aggregation
                                device (graphsync/<layer>/…) or in a tower (<layer>_sync/forward…)

without passing through

    one tower's scalar          a float scalar computed from the examples (a loss, an error rate):
                                what an EMA of it writes is a summary of that tower, not a statistic
    a normalized output         a fused batch norm's y: what is computed from it is computed from
                                the examples (logits, losses), so the walk goes on into its input x
                                only. An unfused batch norm's y is arithmetic on x and the statistics,
                                which the walk cannot tell apart: a vector summary computed from its
                                outputs (an EMA of per-class errors) would count; scalars never do
    what no example reaches     variables, constants, and shapes (a batch size is no statistic)
"""
from __future__ import annotations

import tensorflow as tf

from graphsync import match
from graphsync.graph import marks
from graphsync.graph.marks import Direction

_STATISTIC_OUTPUTS = (1, 2)   # a fused batch norm's batch mean and batch variance


def split(graph: tf.Graph, writes: list, fed: set) -> tuple[list, list]:
    """(writes of batch statistics, other writes) among `writes`, the writes that depend on the
    tensors named in `fed`."""
    data = examples_reach(graph, fed)
    sources = statistic_tensors(graph)
    known_not: set = set()
    statistics, others = [], []
    for write in writes:
        value = write.inputs[1]
        (statistics if _reaches(value, sources, data, known_not) else others).append(write)
    return statistics, others


def examples_reach(graph: tf.Graph, fed: set) -> set:
    """The ops whose values are computed from the fed tensors' values (not merely their shapes)."""
    stack = [c for name in fed for c in graph.get_tensor_by_name(name).consumers()]
    seen = set()
    while stack:
        op = stack.pop()
        if op in seen or op.type in match.SHAPE_TYPES:
            continue
        seen.add(op)
        stack.extend(c for t in op.outputs for c in t.consumers())
    return seen


def statistic_tensors(graph: tf.Graph) -> set:
    """References of the tensors that are batch statistics (see the module docstring)."""
    found = set()
    for op in graph.get_operations():
        if op.type in match.FUSED_TYPES and match.is_training(op):
            found.update(op.outputs[i].ref() for i in _STATISTIC_OUTPUTS)
        elif _forward_exchange(op):
            found.update(t.ref() for t in op.outputs)
    for cand in match.candidates(graph):
        if cand.form.spelled_out:
            found.update(t.ref() for op in (cand.op, cand.parts.variance) for t in op.outputs)
        elif cand.form.in_branches and cand.parts:
            outputs = cand.parts.outputs
            found.update(cand.op.outputs[outputs[i]].ref() for i in _STATISTIC_OUTPUTS if i in outputs)
    return found


def _forward_exchange(op: tf.Operation) -> bool:
    """Whether `op` carries a synchronized layer's statistics to the towers."""
    exchanged = marks.exchanged(op)
    return exchanged is not None and exchanged[1] is Direction.FORWARD


def _reaches(value: tf.Tensor, sources: set, data: set, known_not: set) -> bool:
    """Whether walking up from `value` reaches a statistic (see the module docstring). Tensors a
    finished walk visited reach none: they are remembered in `known_not` for the next writes."""
    stack, visited = [value], set()
    while stack:
        tensor = stack.pop()
        key = tensor.ref()
        if key in visited or key in known_not:
            continue
        visited.add(key)
        if key in sources:
            return True
        op = tensor.op
        if op not in data or (tensor.shape.rank == 0 and tensor.dtype.is_floating):
            continue
        if op.type in match.FUSED_TYPES and tensor.value_index == 0:
            stack.append(op.inputs[0])
            continue
        stack.extend(op.inputs)
    known_not.update(visited)
    return False
