"""What a training step changes: the gradients the optimizer applies, the assignments it makes
(moving statistics), and every variable's initial value (so each run starts alike)."""
from __future__ import annotations

import dataclasses
import re

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.graph import walks
from graphsync.graph.op_types import WRITE_TYPES

VARIABLE_TYPES = ("VarHandleOp", "VariableV2", "Variable")
_SAVER_SCOPE = re.compile(r"(^|/)save(_\d+)?/")


@dataclasses.dataclass
class Variable:
    name: str            # the variable op
    initializer: str     # the op that assigns its initial value
    initial_value: str   # the tensor it assigns (fed with a snapshot so every run starts alike)


def gradients(graph: tf.Graph, notes: list[str]) -> list[str]:
    """The gradient input of every dense optimizer op (ApplyGradientDescent's `delta`, the `grad`
    of the others)."""
    found, sparse = [], 0
    for op in graph.get_operations():
        if "Apply" not in op.type:
            continue
        args = [arg.name for arg in op.op_def.input_arg]
        if "indices" in args:
            sparse += 1
            continue
        key = "grad" if "grad" in args else "delta" if "delta" in args else None
        if key is not None and len(args) == len(op.inputs):
            found.append(op.inputs[args.index(key)].name)
    if sparse:
        notes.append(f"{sparse} sparse optimizer updates (embeddings) not compared")
    return found


def writes(graph: tf.Graph) -> list:
    """Assignments of floating values outside initializers and savers."""
    initializers = {v.initializer for v in variables(graph)}
    return [op for op in graph.get_operations()
            if op.type in WRITE_TYPES and op.name not in initializers and not _SAVER_SCOPE.search(op.name)
            and len(op.inputs) > 1 and op.inputs[1].dtype.is_floating]


def variables(graph: tf.Graph) -> list[Variable]:
    """Every variable and the assignment of its initial value (`<variable>/Assign`, which is how
    tf.Variable, get_variable and tf_keras create them)."""
    found = []
    for op in graph.get_operations():
        if op.type not in VARIABLE_TYPES:
            continue
        inits = [c for c in op.outputs[0].consumers() if c.type in ("Assign", "AssignVariableOp")
                 and c.inputs[0] is op.outputs[0]]
        init = next((c for c in inits if c.name == op.name + "/Assign"), None)
        init = init or next((c for c in inits if c.name.startswith(op.name + "/")), None)
        if init is None:
            raise GraphsyncError(f"cannot tell how variable {op.name} is initialized (no {op.name}/Assign)")
        found.append(Variable(op.name, init.name, init.inputs[1].name))
    return found


def downstream(graph: tf.Graph, fed: set) -> set:
    """Ops whose value depends on a fed tensor."""
    return walks.descendants([c for name in fed for c in graph.get_tensor_by_name(name).consumers()])
