"""Per-tower copies of the main tower's variables, which verify starts equal.

A replicated trainer (tensorpack's SyncMultiGPUTrainerReplicated, tf_cnn_benchmarks' `replicated`
mode) gives every tower its own copy of each variable and copies the main tower's values into them
once, before the first step. verify runs every variable's own initializer instead: with unseeded
initializers the copies are independent draws, the towers compute different functions, and moving
an example to another tower changes its result whatever the batch norm does. So the copies are
found and given the main tower's initial values, in the synchronized and the un-rewritten run alike.

Found by structure, in this order (a variable paired once, by the first that pairs it):

    copy ops    the graph's own: an assignment the training step never runs that writes one
                variable's value, read unchanged, into another of the same dtype and shape
                (tensorpack's sync_variables_from_main_tower, tf_cnn_benchmarks' post-init ops);
                chains of them are followed back to the variable nothing is copied into
    readers     a variable only tower t > 0 reads, whose readers (the ops consuming its value)
                sit where tower 0's readers of one variable of the same dtype and shape sit: the
                same names relative to their towers, the same input slots (tower_1/v1/cg/conv0/Conv2D
                ↔ tower_0/v0/cg/conv0/Conv2D; tensorpack's tower1/conv0/Conv2D reads tower1/conv0/W,
                tower0/conv0/Conv2D reads conv0/W)
    names       a variable named within tower t > 0's scope (or its end: tf_cnn_benchmarks'
                tower_1/v1/ names variables v1/…) whose name relative to it, dtype and shape are
                those of a variable named within tower 0's or, when tower 0 keeps its variables
                unscoped (tensorpack), at the root: what no tower reads (optimizer slots)

Shared variables (one variable read by every tower: CIFAR10's towers, slim clones, parameter
servers) have no copies. MirroredStrategy's replicas already start as copies (each replica's
initial value reads the primary's); pairing them changes nothing.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.towers.scopes import ROOT, Tower
from graphsync.graph.backward import is_backward
from graphsync.verification.discovery.state import WRITE_TYPES, Variable

READS = ("ReadVariableOp", "Identity", "Snapshot")    # a variable's value, unchanged
_ASSIGNS = ("Assign", "AssignVariableOp")


@dataclasses.dataclass
class Copies:
    """copy variable → the main tower's variable it starts as, and how they were found."""

    of: dict
    how: str
    example: str = ""

    def __len__(self) -> int:
        return len(self.of)

    def describe(self) -> str:
        if not self.of:
            return ""
        return (f"{len(self.of)} per-tower copies of the main tower's variables start equal to them "
                f"({self.how}{', e.g. ' + self.example if self.example else ''})")


def find(graph: tf.Graph, towers: list[Tower], variables: list[Variable], membership) -> Copies:
    """The per-tower copies in `graph` (see the module docstring)."""
    ops = {v.name: graph.get_operation_by_name(v.name) for v in variables}
    initializers = {v.initializer for v in variables}
    by_op, example = _copy_ops(graph, ops, initializers)
    found, hows = dict(by_op), []
    if found:
        hows.append("the graph's own copy ops, which the trainer runs before its first step")
    for how, pairs in (("paired by where the towers read them", _by_readers(ops, towers, membership)),
                       ("paired by their names within the towers", _by_names(ops, towers))):
        added = {copy: main for copy, main in pairs.items() if copy not in found and main not in found}
        if added:
            found.update(added)
            hows.append(how)
            example = example or f"{min(added)} ← {added[min(added)]}"
    return Copies(found, "; ".join(hows), example)


def _signature(op: tf.Operation):
    try:
        return tf.as_dtype(op.get_attr("dtype")).base_dtype, tf.TensorShape(op.get_attr("shape")).as_list()
    except (ValueError, TypeError):
        return None


def _variable_read(tensor: tf.Tensor, ops: dict) -> tf.Operation | None:
    """The variable whose value `tensor` is, read unchanged; else None."""
    op = tensor.op
    for _ in range(8):
        if op.name in ops:
            return op
        if op.type not in READS or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def _copy_ops(graph: tf.Graph, ops: dict, initializers: set) -> tuple[dict, str]:
    """copy → source from the assignments that copy one variable into another outside the step."""
    copies, example = {}, None
    step = _step_ancestry(graph, ops, initializers)
    for op in graph.get_operations():
        if op.type not in _ASSIGNS or op.name in initializers or op in step or len(op.inputs) < 2:
            continue
        target = _variable_read(op.inputs[0], ops)
        source = _variable_read(op.inputs[1], ops)
        if target is None or source is None or target is source or _signature(target) != _signature(source):
            continue
        copies[target.name] = source.name
        if example is None or target.name < example[0]:
            example = (target.name, f"{target.name} ← {source.name} ({op.name})")
    resolved = {}
    for copy in copies:
        source, seen = copies[copy], {copy}
        while source in copies and source not in seen:
            seen.add(source)
            source = copies[source]
        if source != copy:
            resolved[copy] = source
    return resolved, example[1] if example is not None else ""


def _step_ancestry(graph: tf.Graph, ops: dict, initializers: set) -> set:
    """Every op the training step runs: the ancestors (data and control) of the optimizer's ops and
    of the writes that are not plain copies."""
    roots = [op for op in graph.get_operations()
             if ("Apply" in op.type and op.type not in _ASSIGNS)
             or (op.type in WRITE_TYPES and op.name not in initializers
                 and (op.type not in _ASSIGNS or len(op.inputs) < 2 or _variable_read(op.inputs[1], ops) is None))]
    seen, stack = set(), roots
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _readers(variable: tf.Operation) -> list[tuple[tf.Operation, int]]:
    """(op, input slot) of the ops that consume the variable's value (through reads)."""
    found, stack, seen = [], [variable.outputs[0]], set()
    while stack:
        tensor = stack.pop()
        if tensor.ref() in seen:
            continue
        seen.add(tensor.ref())
        for consumer in tensor.consumers():
            if consumer.type in READS:
                stack.extend(consumer.outputs)
            elif consumer.type not in WRITE_TYPES:
                found.extend((consumer, i) for i, t in enumerate(consumer.inputs) if t is tensor)
    return found


def _by_readers(ops: dict, towers: list[Tower], membership) -> dict:
    """copy → main from where the towers read them (see the module docstring)."""
    main_at: dict = {}
    per_tower: dict = {}
    for name, op in ops.items():
        places = {}
        for reader, slot in _readers(op):
            if is_backward(reader):
                continue
            tower = membership(reader)
            if tower is not None:
                places.setdefault(tower, set()).add((reader.name[len(tower.prefix):], slot))
        if len(places) != 1:
            continue    # shared (or unread)
        tower, where = next(iter(places.items()))
        if tower.index == 0:
            for place in where:
                main_at.setdefault(place, set()).add(name)
        else:
            per_tower[name] = where
    pairs = {}
    for name, where in per_tower.items():
        mains = set().union(*(main_at.get(place, set()) for place in where))
        if len(mains) == 1:
            main = mains.pop()
            if _signature(ops[main]) == _signature(ops[name]) is not None:
                pairs[name] = main
    return pairs


def _by_names(ops: dict, towers: list[Tower]) -> dict:
    """copy → main from the variables' own names relative to their towers. A variable's name holds
    its tower's scope, or the end of it (variable scopes name variables, name scopes do not:
    tf_cnn_benchmarks' tower_1/v1/ names its variables v1/…)."""
    main = towers[0]
    pairs = {}
    for name, op in ops.items():
        found = _relative(name, towers[1:])
        if found is None:
            continue
        depth, relative = found
        main_scopes = _scopes(main)
        candidates = ([main_scopes[depth] + relative] if depth < len(main_scopes) else []) + [relative]
        for candidate in candidates:
            other = ops.get(candidate)
            if other is not None and other is not op and _relative(candidate, towers[1:]) is None \
                    and _signature(other) == _signature(op) is not None:
                pairs[name] = candidate
                break
    return pairs


def _scopes(tower: Tower) -> list[str]:
    """tower_1/v1/ → [tower_1/v1/, v1/]: the tower's scope and its ends (none for the root)."""
    if tower.prefix == ROOT:
        return []
    parts = tower.prefix.rstrip("/").split("/")
    return ["/".join(parts[i:]) + "/" for i in range(len(parts))]


def _relative(name: str, towers: list[Tower]) -> tuple[int, str] | None:
    """(how many leading components of its tower's scope the name lacks, the rest of the name) for
    a variable named within one of `towers`; else None."""
    best = None
    for tower in towers:
        for depth, scope in enumerate(_scopes(tower)):
            if name.startswith(scope) and (best is None or len(scope) > best[2]):
                best = (depth, name[len(scope):], len(scope))
    return None if best is None else best[:2]
