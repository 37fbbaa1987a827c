"""Updates of variables on a parameter server, made atomic once the workers step in lockstep.

Unsynchronized between-graph workers reach the ps each at its own pace. Synchronized, they leave
each step's exchange together and apply their gradients to the same ps variables at the same
moment. An update with `use_locking=False` (the TF1 optimizers' default) reads and writes its
variable without the variable's lock, so two workers' read-modify-writes can interleave element
by element and lose one worker's update now and then: 16 elements of 180 million
element-updates, 3 workers applying GradientDescent to one 200k-element ps variable in lockstep,
none with `use_locking=True`. One device loses none, and a synchronized step must equal it: every
update of a variable on one of the step's shared tasks takes the variable's lock.
"""
from __future__ import annotations

import re

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph import tf_private
from graphsync.plan import shared_tasks

_UPDATES = re.compile(r"(Resource)?(Sparse)?Apply|Assign(Add|Sub)?$|(Resource)?Scatter")   # types with use_locking
_LOCKED = attr_value_pb2.AttrValue(b=True)


def lock_shared_updates(graph: tf.Graph, ps_tasks) -> int:
    """Sets use_locking on every update of a variable that lives on one of `ps_tasks` and is
    written unlocked; returns how many."""
    if not ps_tasks:
        return 0
    locked = 0
    for op in graph.get_operations():
        if not _UPDATES.match(op.type) or not op.inputs:
            continue
        try:
            if op.get_attr("use_locking"):
                continue
        except ValueError:   # an op of such a type without the attribute (AssignVariableOp locks itself)
            continue
        if shared_tasks.task_of(op.inputs[0].device) in ps_tasks:
            tf_private.set_attr(op, "use_locking", _LOCKED)
            locked += 1
    return locked
