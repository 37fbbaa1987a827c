"""Reads of TF1 ref variables that race their own update in the same step.

A `VariableV2` (what `disable_v2_behavior()` builds) is read through ops that alias its buffer, and
optimizers update that buffer in place as soon as the update's inputs are ready. A read that
neither comes before the update nor after it in the graph may see either value. The classic case
is ungated differentiation, `tf.gradients(loss, params)` applied at once: a dense or conv layer's
∂L/∂x reads its kernel, which feeds the gradients of the layers below but not the kernel's own
update. Nothing orders that read before the update, and synchronized towers or workers run in
lockstep, where the update often wins (a step then uses a weight half old, half new).
`optimizer.compute_gradients` gates each gradient op by default (GATE_OP) and has no such race.

A race is a reader R of variable V's buffer and an update U of V such that

    R is not an ancestor of U (R is not known to run before U),
    R is not a descendant of U (R is not meant to read the new value), and
    R and U reach a common op (one fetch runs both: e.g. R's gradients and U under train_op), and
    R does not read V through a v1 cond's branch that U is not in, on the same predicate
    (a training flag's cond reads the variable at evaluation and updates it in training).

The last condition leaves out the initializers and separate evaluation or summary passes. One pass
over the graph in each direction with an integer bitset per op (a bit per update, a bit per sink),
and only for graphs that update ref variables: resource variables copy on write and never race.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.graph import order
from graphsync.graph.tf_private import control_flow_context, is_ref

VARIABLE_TYPES = ("VariableV2", "Variable", "TemporaryVariable")
ALIASING_TYPES = ("Identity", "RefIdentity", "Switch", "RefSwitch", "Enter", "RefEnter")
NOT_READING = ("IsVariableInitialized",)   # takes the reference, never reads the value
REF_READERS = ("IsVariableInitialized", "RefIdentity", "RefSwitch", "RefEnter", "RefExit", "RefMerge",
               "RefNextIteration", "RefSelect", "DebugGradientRefIdentity", "DestroyTemporaryVariable")


@dataclasses.dataclass(frozen=True)
class Race:
    reader: str
    variable: str
    update: str

    def line(self) -> str:
        return (f"{self.reader} reads the TF1 ref variable {self.variable} while its update {self.update} "
                "may already have written it")


def find_races(graph: tf.Graph, fetched_together: bool = True) -> list[Race]:
    """Every (reader, update) race of the module docstring, readers in the order they run.
    fetched_together=False drops the last condition: also the reads and updates no op runs both of
    yet (the updates of a graph whose train op is still to be built)."""
    updates, readers = {}, {}   # variable op → its in-place updates / the ops reading its buffer
    for op in _variable_ops(graph):
        updates[op], readers[op] = _updates_and_readers(op)
    pairs = [(v, u) for v, us in updates.items() for u in us if readers[v]]
    if not pairs:
        return []
    index = order.positions(graph.get_operations())
    ops = sorted(index, key=index.get)
    update_bit = {u: 1 << i for i, u in enumerate({u for _, u in pairs})}
    before, after, sinks = _reachability(ops, [[index[s] for s in order.reads(op)] for op in ops], update_bit)
    races = []
    for variable, update in pairs:
        bit = update_bit[update]
        for reader in readers[variable]:
            r, u = index[reader], index[update]
            if not before[r] & bit and not after[r] & bit and (sinks[r] & sinks[u] or not fetched_together) \
                    and not _exclusive(chain(reader, variable) or [], update):
                races.append((r, Race(reader.name, variable.name, update.name)))
    return [race for _, race in sorted(races, key=lambda pair: pair[0])]


def chain(reader: tf.Operation, variable: tf.Operation):
    """The alias chain from `variable` to `reader`: [(op, index of its output the chain goes on
    through)…, (reader, index of its input)], or None if the reader reads no alias of it."""
    for index, tensor in enumerate(reader.inputs):
        links = []
        while tensor.op is not variable and tensor.op.type in ALIASING_TYPES:
            links.append((tensor.op, tensor.value_index))
            tensor = tensor.op.inputs[0]
        if tensor.op is variable:
            return [(variable, 0)] + links[::-1] + [(reader, index)]
    return None


def _exclusive(chain: list, update: tf.Operation) -> bool:
    """Whether the read passes a v1 cond's Switch on the branch the update is not in, on the same
    predicate (a training flag's cond reading the moving statistics at evaluation, updating them in
    training): no step runs both."""
    switches = [(op, output) for op, output in chain[:-1] if op.type in ("Switch", "RefSwitch")]
    context = control_flow_context(update)
    while switches and context is not None:
        pred, branch = getattr(context, "pred", None), getattr(context, "branch", None)
        if pred is not None and any(_source(op.inputs[1]) is _source(pred) and output != branch
                                    for op, output in switches):
            return True
        context = context.outer_context
    return False


def _source(tensor: tf.Tensor) -> tf.Tensor:
    """A predicate past the Identity ops each v1 cond puts on it (pred_id)."""
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor


def aliases_a_variable(tensor: tf.Tensor) -> bool:
    """Whether `tensor` is a ref variable's buffer, read through aliasing ops without a copy."""
    while not is_ref(tensor) and tensor.op.type in ALIASING_TYPES:
        tensor = tensor.op.inputs[0]
    return is_ref(tensor)


def _variable_ops(graph: tf.Graph) -> list:
    """The graph's ref variables: from its variable collections when it has any (a live graph's
    variables are listed there; resource variables make the list empty at once), else from a
    scan of every op (a graph imported without its collections)."""
    keys = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    listed = [v for key in keys for v in graph.get_collection(key)]
    if listed:
        return list({v.op: None for v in listed if getattr(v, "op", None) is not None and v.op.type in VARIABLE_TYPES})
    return [op for op in graph.get_operations() if op.type in VARIABLE_TYPES]


def _updates_and_readers(variable: tf.Operation) -> tuple[list, list]:
    """The ops writing `variable` in place, and those reading its buffer through aliasing ops.
    An alias on another device is a copy (Send/Recv), whose readers cannot race."""
    updates, readers = [], []
    frontier = [variable.outputs[0]]
    while frontier:
        tensor = frontier.pop()
        for consumer in tensor.consumers():
            if consumer.type in ALIASING_TYPES and _same_device(consumer, tensor.op):
                frontier += consumer.outputs
            elif is_ref(tensor) and consumer.type not in REF_READERS and input_arg(consumer, tensor).is_ref:
                updates.append(consumer)
            elif consumer.type not in NOT_READING and not _ignored(consumer, tensor):
                # (an alias on another device reads it to copy it)
                readers.append(consumer)
    return updates, readers


def _ignored(op: tf.Operation, tensor: tf.Tensor) -> bool:
    """Inputs an op takes but does not read: a training-mode fused batch norm's moving mean and
    variance, unless its exponential_avg_factor blends them into its outputs."""
    if not op.type.startswith("FusedBatchNorm") or op.type.endswith("Grad") or not op.get_attr("is_training"):
        return False
    blends = op.type == "FusedBatchNormV3" and op.get_attr("exponential_avg_factor") != 1.0
    return not blends and all(t is not tensor for t in op.inputs[:3])


def input_arg(op: tf.Operation, tensor: tf.Tensor):
    """The OpDef argument `tensor` enters `op` by (ref variables enter single arguments)."""
    position = next(i for i, t in enumerate(op.inputs) if t is tensor)
    args = op.op_def.input_arg
    return args[min(position, len(args) - 1)]


def _same_device(op: tf.Operation, source: tf.Operation) -> bool:
    return not op.device or not source.device or \
        tf.DeviceSpec.from_string(op.device) == tf.DeviceSpec.from_string(source.device)


def _reachability(ops: list, inputs: list, update_bit: dict) -> tuple[list, list, list]:
    """Per op of `ops`, in topological order (inputs: their inputs' places in it): the updates it
    reaches (it runs before them), the updates reaching it (it runs after them), and the sinks it
    reaches that an update reaches too, as integer bitsets."""
    before, after, sinks = [0] * len(ops), [0] * len(ops), [0] * len(ops)
    consumed = [False] * len(ops)
    for i, op in enumerate(ops):
        after[i] |= update_bit.get(op, 0)
        for j in inputs[i]:
            after[i] |= after[j]
            consumed[j] = True
    next_sink = 0
    for i in range(len(ops) - 1, -1, -1):
        before[i] |= update_bit.get(ops[i], 0)
        if not consumed[i] and after[i]:   # only sinks an update reaches can be common to one
            sinks[i], next_sink = 1 << next_sink, next_sink + 1
        for j in inputs[i]:
            before[j] |= before[i]
            sinks[j] |= sinks[i]
    return before, after, sinks
