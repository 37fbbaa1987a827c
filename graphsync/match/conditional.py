"""Batch norm behind a tensor-valued `training` flag under control flow v2: an `If`/`StatelessIf`
whose branches are one fused batch norm each, training in one branch, inference in the other,
and the gradient `If`s `tf.gradients` builds for it.

    y, mean, variance, … = If(pred, γ, β, moving_mean, moving_variance, x)     (any input order)
        then: FusedBatchNormV3(x, read(γ), read(β), …, is_training=True)  → outputs 0–2, intermediates
        else: FusedBatchNormV3(x, …, is_training=False)
    dγ, dβ, …, dx = If(pred, dy, …, intermediates)                           (gradient If)
        then: FusedBatchNormGradV3(dy, …)

Everything is read from the function bodies, never from names: which branch trains, which If input
each operand of the fused op comes from (directly, through Identity, through ReadVariableOp of a
resource argument, or a constant), which If output carries y, the batch mean and the batch
variance, and for each gradient If which input is dy and which outputs are dx, dγ, dβ. The bodies
are never edited (graphsync/splice/stand_in.py builds the synchronized layer outside them).
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.graph import by_type, marks, tf_private
from graphsync.match.candidate import Candidate, ConditionalParts
from graphsync.match.layer_form import LayerForm
from graphsync.match.fused import FUSED_TYPES
from graphsync.graph.marks import Mark

IF_TYPES = ("If", "StatelessIf")
STARTS = IF_TYPES   # the op types candidates() starts from (see match.starting_types)
_FORWARD_OUTPUTS = {"y": 0, "batch_mean": 1, "batch_variance": 2}
_GRAD_OUTPUTS = {"x_backprop": 0, "scale_backprop": 1, "offset_backprop": 2}
_PASS_THROUGH = ("Identity",)


@dataclasses.dataclass(frozen=True)
class Operand:
    """How an operand of the hidden fused op is made from the If's inputs: `If.inputs[index]`
    itself ("input"), a ReadVariableOp of it ("read", of `dtype`), or a constant ("const")."""

    how: str
    index: int = -1
    dtype: tf.DType | None = None
    value: object = None


@dataclasses.dataclass(frozen=True)
class GradientIf:
    """One gradient If of a conditional batch norm: its op, the input index of dy and the output
    index of dx, dγ and dβ (None where it has none)."""

    op: tf.Operation
    dy: int
    outputs: tuple   # (dx, dγ, dβ) output indices
    node: str = ""   # the FusedBatchNormGrad's name in the body


def _parse(ref: str):
    """'node:out_arg:k' → (node, out_arg, k); an argument name → (name, None, None)."""
    parts = ref.split(":")
    return (parts[0], None, None) if len(parts) == 1 else (parts[0], parts[1], int(parts[2]))


class _Body:
    """One function body, with its inputs resolved through pass-through ops."""

    def __init__(self, fdef):
        self.fdef = fdef
        self.nodes = {n.name: n for n in fdef.node_def}
        self.args = [a.name for a in fdef.signature.input_arg]
        self.outputs = [fdef.ret[a.name] for a in fdef.signature.output_arg]

    def source(self, ref: str, through=_PASS_THROUGH):
        """(node or None, out_arg, k, arg index or None) of `ref` past pass-through ops."""
        while True:
            name, out, k = _parse(ref)
            if out is None:
                return None, None, None, self.args.index(name) if name in self.args else None
            node = self.nodes[name]
            if node.op not in through:
                return node, out, k, None
            ref = node.input[0]

    def operand(self, ref: str) -> Operand | None:
        node, _, _, arg = self.source(ref)
        if arg is not None:
            return Operand("input", arg + 1)
        if node is None:
            return None
        if node.op == "Const":
            return Operand("const", value=tf.make_ndarray(node.attr["value"].tensor))
        if node.op == "ReadVariableOp":
            _, _, _, arg = self.source(node.input[0])
            if arg is not None:
                return Operand("read", arg + 1, tf.as_dtype(node.attr["dtype"].type))
        return None

    def fused(self, op_types, training: bool) -> list:
        return [n for n in self.nodes.values() if n.op in op_types and n.attr["is_training"].b == training]


def _branches(op: tf.Operation, library: dict):
    names = [op.node_def.attr[k].func.name for k in ("then_branch", "else_branch")]
    if not all(n in library for n in names):
        return None
    return [_Body(library[n]) for n in names]


def _forward(op: tf.Operation, library: dict):
    """(training branch index: 0 then / 1 else, FusedBatchNorm NodeDef, operands, output map) of
    an If that is one conditional batch norm, or a reason it is not, or None (no batch norm)."""
    bodies = _branches(op, library)
    if bodies is None:
        return None
    found = [(i, body, body.fused(FUSED_TYPES, True)) for i, body in enumerate(bodies)]
    found = [f for f in found if f[2]]
    if not found:
        return None
    if len(found) > 1 or len(found[0][2]) > 1:
        return "runs more than one training batch norm in its branches"
    branch, body, (node,) = found[0]
    operands = [body.operand(ref) for ref in node.input[:5]]
    if operands[0] is None or operands[0].how != "input" or any(o is None for o in operands[1:]):
        return "its batch norm's operands do not come straight from the If's inputs"
    outputs = {}
    for index, ref in enumerate(body.outputs):
        src, out, _, _ = body.source(ref)
        if src is node and out in _FORWARD_OUTPUTS:
            outputs.setdefault(_FORWARD_OUTPUTS[out], index)
    if 0 not in outputs:
        return "its batch norm's output does not leave the If"
    return branch, node, tuple(operands), outputs


def _gradient_ifs(op: tf.Operation, branch: int, library: dict) -> list | str:
    """The gradient Ifs that read `op`'s outputs and run a training FusedBatchNormGrad, in
    creation order."""
    readers = {c for t in op.outputs for c in t.consumers() if c.type in IF_TYPES and c is not op}
    grads = []
    for grad in sorted(readers, key=tf_private.creation_order):
        bodies = _branches(grad, library)
        if bodies is None:
            continue
        body = bodies[branch]
        nodes = body.fused(("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"), True)
        if not nodes:
            continue
        if len(nodes) > 1:
            return f"its gradient {grad.name} runs more than one batch-norm gradient"
        node = nodes[0]
        _, _, _, dy = body.source(node.input[0])
        outputs = [None, None, None]
        for index, ref in enumerate(body.outputs):
            src, out, _, _ = body.source(ref)
            if src is not None and src.op == "AddN":
                for term in src.input:
                    term_src, term_out, _, _ = body.source(term)
                    if term_src is node:
                        src, out = term_src, term_out
            if src is node and out in _GRAD_OUTPUTS and outputs[_GRAD_OUTPUTS[out]] is None:
                outputs[_GRAD_OUTPUTS[out]] = index
        if dy is None or outputs[0] is None:
            return f"cannot tell dy and dx of its gradient {grad.name}"
        grads.append(GradientIf(grad, dy + 1, tuple(outputs), node.name))
    return grads


def is_rewritten(op: tf.Operation, parts: ConditionalParts) -> bool:
    """graphsync gates a rewritten If's inputs with marked Switch ops."""
    x = op.inputs[parts.operands[0].index]
    return x.op.type == "Switch" and marks.has(x.op, Mark.GATE)   # stand_in.py put it before a rewritten If


def candidates(graph: tf.Graph) -> list[Candidate]:
    """Every If that is one conditional batch norm (see the module docstring)."""
    library = tf_private.function_library(graph)
    if not library:
        return []
    found = []
    for op in by_type.ops_of_types(graph, IF_TYPES):
        forward = _forward(op, library)
        if forward is None:
            continue
        if isinstance(forward, str):
            found.append(Candidate(op, LayerForm.CONDITIONAL, forward))
            continue
        branch, node, operands, outputs = forward
        grads = _gradient_ifs(op, branch, library)
        if isinstance(grads, str):
            found.append(Candidate(op, LayerForm.CONDITIONAL, grads))
            continue
        parts = ConditionalParts(branch, node, tuple(operands), outputs, tuple(grads))
        reason = "already synchronized" if is_rewritten(op, parts) else None
        found.append(Candidate(op, LayerForm.CONDITIONAL, reason, parts))
    return found
