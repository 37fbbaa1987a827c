"""What `verify` feeds and fetches, found in the graph itself.

    towers        the same discovery as the rewrite (tower_0/, tower0/, clone_0/, replica_1/, or --towers)
    inputs        placeholders the fetches depend on, grouped by their name inside each tower; or the
                  tensors the user names (any tensor can be fed, so in-graph input pipelines work)
    loss          --loss; else the `losses` collection; else a float scalar named total_loss, loss or
                  *_loss present in every tower; else one at the root
    gradients     what the optimizer applies: the `grad`/`delta` input of every dense Apply* op
    updates       what the graph would write into its state that depends on the inputs: the value of
                  every assignment outside initializers and savers (the moving mean and variance)
    batch norms   the per-tower batch-norm ops (fused forward and gradient ops, moments' Mean ops) that
                  compute per-tower statistics; after a rewrite none of them may run
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import tensorflow as tf

from graphsync import match
from graphsync.errors import GraphsyncError
from graphsync.plan import make_plan
from graphsync.towers import Tower, find_towers, tower_of
from graphsync.verification import trace

VARIABLE_TYPES = ("VarHandleOp", "VariableV2", "Variable")
WRITE_TYPES = ("Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
               "AssignSubVariableOp")
PASS_THROUGH = ("Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
                "ToInt64", "ToInt32")
_SAVER_SCOPE = re.compile(r"(^|/)save(_\d+)?/")
_GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")
_LOSS_NAMES = (("total_loss", re.compile(r"(^|/)total_loss$")),
               ("loss", re.compile(r"(^|/)loss$")),
               ("*_loss", re.compile(r"(^|/|_)loss(es)?$")))


@dataclasses.dataclass
class Input:
    """One input to feed.

    kind:  "per_tower"  the same tensor in every tower; examples move between towers
           "shared"     one tensor holding the whole multi-tower batch (split inside the graph)
           "fixed"      not batch-shaped (a flag, a learning rate): fed the same value in both runs
    """

    kind: str
    tensors: list[str]
    dtype: tf.DType
    example_shape: tuple       # shape of one example ("fixed": the whole value's shape)
    static_batch: int | None   # the batch dimension when the graph fixes it
    classes: int | None = None  # integer inputs: values drawn from [0, classes)
    classes_from: str = ""
    value: object = None       # "fixed": what is fed

    @property
    def label(self) -> str:
        return self.tensors[0] if self.kind != "per_tower" else _tower_pattern(self.tensors)


@dataclasses.dataclass
class Variable:
    name: str            # the variable op
    initializer: str     # the op that assigns its initial value
    initial_value: str   # the tensor it assigns (fed with a snapshot so every run starts alike)


@dataclasses.dataclass
class Subject:
    """A graph and everything verify runs in it (names, so the same names can be found in the
    un-rewritten graph)."""

    graph: tf.Graph
    towers: list[Tower]
    inputs: list[Input]
    loss: list[str]
    loss_source: str
    gradients: list[str]
    updates: list[str]
    batch_norm_ops: list[str]
    layers: list[str]
    variables: list[Variable]
    notes: list[str]


def discover(graph: tf.Graph, *, towers=None, inputs=None, loss=None, num_classes=None, feeds=None,
             losses_collection=None) -> Subject:
    """Finds towers, inputs, loss, gradients, updates and batch-norm ops; raises GraphsyncError with
    the option to pass when something cannot be found."""
    notes: list[str] = []
    found_towers = _towers(graph, towers)
    loss_tensors, loss_source = _loss(graph, found_towers, loss, losses_collection)
    gradients = _gradients(graph, notes)
    fed_by_user = [_resolve_input(graph, found_towers, name) for name in (inputs or [])]
    fixed_by_user = {_tensor(graph, name).name: value for name, value in (feeds or {}).items()}
    user_tensors = {t for group in fed_by_user for t in group[1]} | set(fixed_by_user)
    writes = _writes(graph)
    fetches = [graph.get_tensor_by_name(n) for n in loss_tensors + gradients] or [w.inputs[1] for w in writes]
    placeholders = _placeholders_needed(fetches, user_tensors)
    found_inputs = _inputs(graph, found_towers, fed_by_user, placeholders, fixed_by_user, num_classes)
    if not any(i.kind in ("per_tower", "shared") for i in found_inputs):
        raise GraphsyncError("found no batch input to feed (no placeholder in the towers): name the "
                             "tensors that carry each tower's examples with --input NAME")
    fed = {t for i in found_inputs for t in i.tensors}
    downstream = _downstream(graph, fed)
    updates = [w.inputs[1].name for w in writes if w.inputs[1].op in downstream]
    if not (loss_tensors or gradients or updates):
        raise GraphsyncError("nothing to compare: found no loss, no optimizer and no moving statistics "
                             "that depend on the inputs; name the loss with --loss NAME")
    return Subject(graph, found_towers, found_inputs, loss_tensors, loss_source, gradients, updates,
                   batch_norm_ops(graph, found_towers), synchronized_layers(graph, found_towers), variables(graph), notes)


# ---------------------------------------------------------------------------------------------
# Towers


def _towers(graph: tf.Graph, towers) -> list[Tower]:
    found = []
    try:
        found = make_plan(graph, towers).towers
    except GraphsyncError:
        pass
    if len(found) < 2:
        found = find_towers([op.name for op in graph.get_operations()], towers)
    if len(found) < 2:
        what = "no towers" if not found else f"a single tower ({found[0].label})"
        raise GraphsyncError(f"found {what}: verify exchanges examples between towers (expected name "
                             "scopes like tower_0/, tower_1/; name yours with --towers REGEX)")
    return found


def _relative(name: str, towers: list[Tower]) -> tuple[Tower | None, str]:
    tower = tower_of(name, towers)
    return (tower, name[len(tower.prefix):]) if tower is not None else (None, name)


def _tower_pattern(names: list[str]) -> str:
    """'tower_0/images:0', 'tower_1/images:0' → 'tower_*/images:0' (the names' common shape)."""
    first = names[0]
    if len(names) < 2:
        return first
    pieces = re.split(r"(\d+)", first)
    for i in range(1, len(pieces), 2):
        if any(re.split(r"(\d+)", n)[i:i + 1] != [pieces[i]] for n in names[1:]):
            pieces[i] = "*"
    return "".join(pieces)


# ---------------------------------------------------------------------------------------------
# Loss


def _tensor(graph: tf.Graph, name: str) -> tf.Tensor:
    name = name if ":" in name else name + ":0"
    try:
        return graph.get_tensor_by_name(name)
    except (KeyError, ValueError):
        raise GraphsyncError(f"the graph has no tensor {name}") from None


def _has_tensor(graph: tf.Graph, name: str) -> bool:
    try:
        graph.get_tensor_by_name(name)
        return True
    except (KeyError, ValueError):
        return False


def _per_tower(graph: tf.Graph, towers: list[Tower], name: str) -> list[str] | None:
    """`name` (relative to a tower, or inside one) as a tensor name in every tower, if all exist."""
    name = name if ":" in name else name + ":0"
    _, relative = _relative(name, towers)
    names = [t.prefix + relative for t in towers]
    return names if all(_has_tensor(graph, n) for n in names) else None


def _loss(graph, towers, loss, losses_collection) -> tuple[list[str], str]:
    if loss:
        per_tower = _per_tower(graph, towers, loss)
        if per_tower:
            return per_tower, "--loss, in every tower"
        return [_tensor(graph, loss).name], "--loss"
    if losses_collection:
        return list(losses_collection), "the `losses` collection"
    candidates = [op.outputs[0] for op in graph.get_operations()
                  if op.outputs and op.outputs[0].dtype.is_floating and op.outputs[0].shape.rank == 0
                  and op.type not in ("Const", "Placeholder", "PlaceholderWithDefault", "ReadVariableOp")
                  and not _GRADIENT_SCOPE.search(op.name) and not op.name.startswith("graphsync/")]
    by_relative: dict[str, dict] = {}
    at_root = []
    for tensor in candidates:
        tower, relative = _relative(tensor.op.name, towers)
        if tower is None:
            at_root.append(tensor)
        else:
            by_relative.setdefault(relative, {})[tower] = tensor
    for label, pattern in _LOSS_NAMES:
        names = sorted((r for r, found in by_relative.items() if pattern.search(r) and len(found) == len(towers)),
                       key=lambda r: (len(r), r))
        if names:
            chosen = by_relative[names[0]]
            return [chosen[t].name for t in towers], f"named {label} in every tower"
    for label, pattern in _LOSS_NAMES:
        rooted = sorted((t for t in at_root if pattern.search(t.op.name)), key=lambda t: (len(t.name), t.name))
        if rooted:
            return [rooted[0].name], f"named {label}, outside the towers"
    return [], ""


# ---------------------------------------------------------------------------------------------
# Gradients and updates


def _gradients(graph: tf.Graph, notes: list[str]) -> list[str]:
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


def _writes(graph: tf.Graph) -> list:
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


# ---------------------------------------------------------------------------------------------
# Inputs


def _resolve_input(graph, towers, name) -> tuple[str, list[str]]:
    """--input NAME: per tower when NAME exists in every tower (given relative to the tower or as
    one tower's tensor), else one tensor."""
    per_tower = _per_tower(graph, towers, name)
    if per_tower:
        return "per_tower", per_tower
    return "shared", [_tensor(graph, name).name]


def _placeholders_needed(fetches, stop_at: set) -> list:
    """The placeholders the fetches depend on, not looking past tensors that are fed anyway."""
    seen, stack, found = set(), [t.op for t in fetches], []
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type == "Placeholder":
            found.append(op)
        stack.extend(t.op for t in op.inputs if t.name not in stop_at)
        stack.extend(op.control_inputs)
    return sorted(found, key=lambda op: op.name)


def _downstream(graph: tf.Graph, fed: set) -> set:
    """Ops whose value depends on a fed tensor."""
    stack = [c for name in fed for c in graph.get_tensor_by_name(name).consumers()]
    seen = set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(c for t in op.outputs for c in t.consumers())
    return seen


def _inputs(graph, towers, by_user, placeholders, fixed, num_classes) -> list[Input]:
    inputs = []
    covered = set(fixed)
    for kind, names in by_user:
        inputs.append(_batch_input(graph, kind, names, num_classes))
        covered |= set(names)
    groups: dict[str, dict] = {}
    outside = []
    for op in placeholders:
        name = op.outputs[0].name
        if name in covered:
            continue
        tower, relative = _relative(name, towers)
        if tower is None:
            outside.append(name)
        else:
            groups.setdefault(relative, {})[tower] = name
    for relative, members in sorted(groups.items()):
        tensor = graph.get_tensor_by_name(next(iter(members.values())))
        if len(members) == len(towers) and tensor.shape.rank:
            inputs.append(_batch_input(graph, "per_tower", [members[t] for t in towers], num_classes))
        else:
            outside.extend(members.values())
    has_batch = any(i.kind != "fixed" for i in inputs)
    for name in sorted(outside):
        tensor = graph.get_tensor_by_name(name)
        if not has_batch and tensor.shape.rank and tensor.shape[0] is None:
            inputs.append(_batch_input(graph, "shared", [name], num_classes))
        else:
            inputs.append(_fixed_input(tensor))
    for name, value in fixed.items():
        tensor = graph.get_tensor_by_name(name)
        try:
            array = np.asarray(value, tensor.dtype.base_dtype.as_numpy_dtype)
        except (TypeError, ValueError):
            raise GraphsyncError(f"cannot feed {value!r} to {name} ({tensor.dtype.base_dtype.name})") from None
        inputs.append(Input("fixed", [name], tensor.dtype.base_dtype, array.shape, None, value=array))
    return inputs


def _batch_input(graph, kind, names, num_classes) -> Input:
    tensor = graph.get_tensor_by_name(names[0])
    shape = tensor.shape
    if shape.rank is None or shape.rank == 0:
        raise GraphsyncError(f"{tensor.name} has {'unknown rank' if shape.rank is None else 'no batch axis'}: "
                             "feed a batch-shaped tensor (first axis = examples)")
    dtype = tensor.dtype.base_dtype
    if not (dtype.is_floating or dtype.is_integer or dtype == tf.bool):
        raise GraphsyncError(f"cannot make random {dtype.name} data for {tensor.name}: name the numeric "
                             "tensors computed from it with --input")
    batches = {graph.get_tensor_by_name(n).shape[0] for n in names}
    static = batches.pop() if len(batches) == 1 else None
    if batches:
        raise GraphsyncError(f"{_tower_pattern(names)} has different fixed batch sizes in different towers")
    classes, source = None, ""
    if dtype.is_integer:
        if num_classes:
            classes, source = int(num_classes), "--num-classes"
        else:
            classes, source = _class_count(tensor)
        if not classes:
            raise GraphsyncError(f"cannot tell the range of integer input {_tower_pattern(names)}: "
                                 "pass --num-classes K")
    return Input(kind, list(names), dtype, tuple(shape[1:].as_list()), static, classes, source)


def _fixed_input(tensor: tf.Tensor) -> Input:
    """A value for a placeholder without a batch axis: True for flags, 1 for numbers."""
    if not tensor.shape.is_fully_defined():
        raise GraphsyncError(f"cannot tell what to feed {tensor.name} (shape {tensor.shape}, outside the "
                             "towers): pass its value with --feed NAME=VALUE or name it with --input")
    dtype = tensor.dtype.base_dtype
    if dtype == tf.bool:
        value = True
    elif dtype.is_floating or dtype.is_integer:
        value = 1
    else:
        raise GraphsyncError(f"cannot tell what to feed {tensor.name} ({dtype.name}): pass --feed NAME=VALUE")
    array = np.full(tensor.shape.as_list(), value, dtype.as_numpy_dtype)
    return Input("fixed", [tensor.name], dtype, tuple(array.shape), None, value=array)


def _class_count(tensor: tf.Tensor) -> tuple[int | None, str]:
    """The number of classes an integer input indexes, from what reads it (through casts and
    reshapes): the logits' width of a sparse softmax cross entropy, a one-hot depth, a gather's
    table size, an in-top-k's predictions."""
    found = []
    stack, seen = [(tensor, 0)], set()
    while stack:
        t, depth = stack.pop()
        if t.ref() in seen or depth > 8:
            continue
        seen.add(t.ref())
        for op in t.consumers():
            index = next(i for i, x in enumerate(op.inputs) if x is t)
            if op.type in PASS_THROUGH and index == 0:
                stack.extend((out, depth + 1) for out in op.outputs)
            elif op.type == "SparseSoftmaxCrossEntropyWithLogits" and index == 1:
                found.append((op.inputs[0].shape[-1], "the logits' width"))
            elif op.type == "OneHot" and index == 0:
                found.append((tf.get_static_value(op.inputs[1]), "a one-hot depth"))
            elif op.type in ("InTopK", "InTopKV2") and index == 1:
                found.append((op.inputs[0].shape[-1], "the predictions' width"))
            elif op.type in ("GatherV2", "Gather") and index == 1:
                found.append((op.inputs[0].shape[0], "a gather's table size"))
            elif op.type == "ResourceGather" and index == 1:
                found.append((_variable_rows(op.inputs[0]), "a gather's table size"))
    sizes = [(int(n), why) for n, why in found if n is not None]
    return min(sizes) if sizes else (None, "")


def _variable_rows(handle: tf.Tensor):
    op = handle.op
    if op.type == "VarHandleOp":
        shape = tf.TensorShape(op.get_attr("shape"))
        return shape[0] if shape.rank else None
    return None


# ---------------------------------------------------------------------------------------------
# Batch norm


def batch_norm_ops(graph: tf.Graph, towers: list[Tower]) -> list[str]:
    """Per-tower batch-norm ops that compute per-tower statistics: training-mode fused ops and
    their gradient ops, and the two Mean ops of `tf.nn.moments` over the batch axis (also once
    graphsync rerouted them: their StopGradient then reads `<mean op>_sync/…`)."""
    names = []
    for op in graph.get_operations():
        if op.type in match.FUSED_TYPES and match.is_training(op):
            names.append(op.name)
            names.extend(g.name for g in match.fused_gradient_ops(op))
        elif op.type == "SquaredDifference":
            names.extend(_moments_ops(graph, op))
    return sorted({n for n in names if tower_of(n, towers) is not None and not n.startswith("graphsync/")
                   and "_sync/" not in n and "_sync_grad_" not in n})


def _moments_ops(graph: tf.Graph, sqdiff: tf.Operation) -> list[str]:
    """The Mean ops of a `tf.nn.moments` over the batch axis around this SquaredDifference(x,
    StopGradient(·)): its variance (the Mean reading it) and its mean (the Mean of x over the same
    axes), however a rewrite rewired the StopGradient."""
    x, stopped = sqdiff.inputs
    if stopped.op.type != "StopGradient":
        x, stopped = stopped, x
    if stopped.op.type != "StopGradient":
        return []
    found = []
    for variance in sqdiff.outputs[0].consumers():
        if variance.type != "Mean" or not _reduces_batch(variance):
            continue
        axes = _axes(variance)
        means = [c for c in x.consumers() if c.type == "Mean" and _axes(c) == axes
                 and c.get_attr("keep_dims") == variance.get_attr("keep_dims")]
        if means:
            found += [variance.name] + [m.name for m in means]
    return found


def _axes(op: tf.Operation):
    axes = tf.get_static_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if axes is None or not rank:
        return None
    return tuple(sorted({int(a) % rank for a in (axes.ravel() if hasattr(axes, "ravel") else [axes])}))


def _reduces_batch(op: tf.Operation) -> bool:
    axes = _axes(op)
    return axes is not None and op.inputs[0].shape.rank >= 2 and 0 in axes


def synchronized_layers(graph: tf.Graph, towers: list[Tower]) -> list[str]:
    """The layers graphsync synchronized: from their aggregation scopes (graphsync/<layer>/…) or,
    all-reduced, from the collectives in the towers' <layer>_sync/ scopes."""
    layers = set()
    for op in graph.get_operations():
        if op.name.startswith("graphsync/") or op.type.startswith("Collective"):
            found = trace.layer_of(op.name, towers)
            if found:
                layers.add(found[0])
    return sorted(layers)
