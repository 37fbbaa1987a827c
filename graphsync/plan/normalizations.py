"""Which planned layers are one normalization, for reports: what the user wrote, not how it is synchronized.

A batch norm written by hand with a mean and `tf.math.reduce_variance`, or `tf.nn.weighted_moments`
with weights per channel, is synchronized exactly as several "reduction" layers, one per `Sum` or
`Mean` (graphsync/plan/reductions.py), which the splice and the between-graph fingerprints handle
one by one. Counted that way, three such batch norms were "9 layers": reports (RewriteReport,
`graphsync inspect`, TensorBoard, `graphsync run`) count and list normalizations instead, each
with its reductions under it. Nothing here changes what is synchronized or how.

The grouping is read from the graph's structure, never from names, on tower 0's sites (layers are
paired across towers already, so it holds in every tower). Reductions over the same axes are one
normalization when

- one reads another's output through elementwise ops (the variance reading the mean: Σ(x − m)²,
  Σw·(x − Σw·x/Σw)²), or
- they reduce the same activation x: walking up from each reduced input through identity-like ops
  (Cast, Identity, StopGradient, …), unary arithmetic (Square, Abs, …) and the statistics' own
  arithmetic (Sub, SquaredDifference, Mul, AddV2, RealDiv, … when an operand is computed from
  another reduction's output) ends at the same floating tensor (a mean of x beside
  `reduce_variance(x)`, whose own mean is a third reduction of x; E[x] beside E[x²]). Binary ops
  whose operands hold no statistic end the walk: a residual sum `x + f(x)` is an activation, so
  batch norms along one residual stream stay apart. Two normalizations that each already hold
  several reductions are never joined this way (two masked batch norms summing the same mask for
  their counts stay two).

Fused and moments layers are their own normalization. A group is named after its members' deepest
common name scope (`handwritten` for `handwritten/Mean`, `handwritten/reduce_variance/Mean`, …),
else, or when another layer or group has that name, after its first member in forward order.
`found_as` says how each layer was found ("fused", "tf.nn.moments", "reductions: mean + mean +
mean of squares").
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.match.candidate import MomentsParts
from graphsync.match.layer_form import LayerForm
from graphsync.plan.data import LayerPlan

IDENTITY_LIKE = frozenset({"Cast", "Identity", "Snapshot", "StopGradient", "PreventGradient", "EnsureShape",
                           "CheckNumerics"})
UNARY = frozenset({"Square", "Abs", "Neg", "Sqrt", "Rsqrt", "Reciprocal"})
BINARY = frozenset({"Add", "AddV2", "AddN", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan",
                    "SquaredDifference", "Pow", "Maximum", "Minimum"})
VALUE_FREE = frozenset({"Const", "ZerosLike", "OnesLike", "Fill", "Shape", "Size", "Rank"})
SQUARING = frozenset({"Square", "SquaredDifference", "Pow"})
_DEPTH = 64   # ops walked up from one reduced input, at most


def grouped(layers) -> tuple[LayerPlan, ...]:
    """`layers` (final, in forward order) with `normalization` and `found_as` filled in."""
    reductions = [layer for layer in layers if layer.form.reduces]
    groups, squares = _groups(reductions)
    names = _names(groups, {layer.name for layer in layers})
    by_layer = {}
    for group, name in zip(groups, names):
        described = [layer.sites[0].op.type.lower() + (" of squares" if squares[layer.name] else "") for layer in group]
        found_as = ("reductions: " if len(group) > 1 else "reduction: ") + " + ".join(described)
        for layer in group:
            by_layer[layer.name] = (name if len(group) > 1 else "", found_as)
    return tuple(dataclasses.replace(layer, normalization=by_layer[layer.name][0], found_as=by_layer[layer.name][1])
                 if layer.name in by_layer else dataclasses.replace(layer, found_as=_form(layer))
                 for layer in layers)


def normalizations(layers) -> list[tuple[str, list]]:
    """[(normalization name, its layers)], in forward order of each normalization's first layer."""
    found: dict[str, list] = {}
    for layer in layers:
        found.setdefault(layer.normalization_name, []).append(layer)
    return list(found.items())


def _form(layer: LayerPlan) -> str:
    """How a fused or moments layer was found."""
    parts = layer.sites[0].parts
    if layer.shown_kind is LayerForm.CONDITIONAL:   # a conditional layer, or a fused one in a v1 tf.cond
        return "fused, behind a tensor training flag"
    if not isinstance(parts, MomentsParts):
        return layer.form.value
    if parts.weights is not None:
        return "tf.nn.weighted_moments"
    if parts.shift is not None:
        return "tf.nn.sufficient_statistics with a shift"
    if parts.sqdiff is not None:
        return "tf.nn.moments"
    return "mean and variance by hand"


def _groups(reductions) -> tuple[list[list], dict]:
    """The reduction layers in groups, each in forward order, groups in order of their first; and
    {layer name: whether what it reduces is squared}."""
    ops = {layer.sites[0].op: i for i, layer in enumerate(reductions)}
    parent = list(range(len(reductions)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i, j):
        i, j = root(i), root(j)
        if i != j:
            parent[max(i, j)] = min(i, j)

    walks = [_walk(layer.sites[0].op.inputs[0], ops) for layer in reductions]
    axes = [layer.layout.axes for layer in reductions]
    for i, (_, read, _) in enumerate(walks):   # one reads another's output
        for op in read:
            if axes[ops[op]] == axes[i]:
                join(i, ops[op])
    first_of = {}   # the same activation, never joining two groups of several
    size = {}
    for i in range(len(reductions)):
        size[root(i)] = size.get(root(i), 0) + 1
    for i, (leaves, _, _) in enumerate(walks):
        for x in leaves:
            j = first_of.setdefault((x.ref(), axes[i]), i)
            a, b = root(i), root(j)
            if a != b and min(size[a], size[b]) == 1:
                join(a, b)
                size[root(a)] = size[a] + size[b]
    groups: dict[int, list] = {}
    for i, layer in enumerate(reductions):
        groups.setdefault(root(i), []).append(layer)
    return list(groups.values()), {layer.name: walk[2] for layer, walk in zip(reductions, walks)}


def _walk(reduced: tf.Tensor, reductions: dict) -> tuple[list, set, bool]:
    """(the floating tensors `reduced` is computed from, up through the ops of the module docstring;
    the reduction ops among `reductions` whose outputs it reads on the way; whether it squares on
    the way)."""
    leaves, read, seen, squares = [], set(), set(), False
    stack = [reduced]
    while stack and len(seen) < _DEPTH:
        t = stack.pop()
        if t.ref() in seen:
            continue
        seen.add(t.ref())
        op = t.op
        if op in reductions:
            read.add(op)
            continue
        if op.type in VALUE_FREE:
            continue
        if op.type in IDENTITY_LIKE or op.type in UNARY or _squares(op):
            stack.append(op.inputs[0])
        elif op.type in BINARY and any(_reads_a_reduction(i, reductions) for i in op.inputs):
            stack.extend(op.inputs)
        else:
            if t.dtype.is_floating:
                leaves.append(t)
            continue
        squares = squares or op.type in SQUARING or _squares(op)
    return leaves, read, squares


def _squares(op: tf.Operation) -> bool:
    """Mul(d, d)."""
    return op.type == "Mul" and op.inputs[0].ref() == op.inputs[1].ref()


def _reads_a_reduction(t: tf.Tensor, reductions: dict) -> bool:
    """Whether `t` is computed from a reduction's output through elementwise ops."""
    stack, seen = [t], set()
    while stack and len(seen) < _DEPTH:
        t = stack.pop()
        if t.ref() in seen:
            continue
        seen.add(t.ref())
        if t.op in reductions:
            return True
        if t.op.type in IDENTITY_LIKE or t.op.type in UNARY or t.op.type in BINARY:
            stack.extend(t.op.inputs)
    return False


def _names(groups, taken: set) -> list[str]:
    """Each group's name: its members' deepest common name scope, unless empty or shared with
    another group or layer; else its first member's name."""
    scopes = [_common_scope([layer.name for layer in group]) if len(group) > 1 else "" for group in groups]
    return [scope if scope and scopes.count(scope) == 1 and scope not in taken else group[0].name
            for scope, group in zip(scopes, groups)]


def _common_scope(names) -> str:
    parts = [name.split("/")[:-1] for name in names]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return "/".join(common)
