"""Batch norm behind a tensor `training` flag (control flow v2): planned as one layer per If, then
synchronized outside the If's function bodies, which stay as they are.

Per tower, with p the If's predicate and b the branch that trains:

    gate_i   = Switch(If input i, p)            for every data input of the If
    old If   ← the gates' other outputs          runs only when p ≠ b: the original inference
    stand-in = FusedBatchNormV3(gates' b outputs, is_training=True), the If's training branch
               rebuilt in the main graph, which graphsync/splice/layer.py then synchronizes like any
               fused layer (forward, and backward from each gradient If's dy, gated alike)
    every reader of the If's y, mean, variance (and of a gradient If's dx, dγ, dβ)
             ← Merge(synchronized, original)

A Switch output that is not taken is dead, and TensorFlow runs nothing downstream of a dead tensor
until a Merge: with the flag at inference the stand-in, its statistics exchange and its backward
never run (no op, no byte crosses devices), and the Merge passes the original If's output on;
with the flag at training the original If and its gradient Ifs never run. The gradients
tf.gradients builds later flow through Merge and Switch the same way (their registered
gradients are themselves Switch and Merge).
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph.reroute import reroute_consumers, reroute_control_outputs
from graphsync.graph.tf_private import create_op, pristine_scope, update_input
from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.match.layer_form import LayerForm
from graphsync.plan.data import LayerPlan, Site

STAND_IN_GRADIENT = "GraphsyncConditionalStandIn"   # also in match.GRAPHSYNC_GRADIENTS: never differentiated


@dataclasses.dataclass
class _Gate:
    taken: tf.Tensor   # alive when the layer trains
    other: tf.Tensor   # alive when it does not


def _gate(graph, tensor: tf.Tensor, pred: tf.Tensor, branch: int, device: str) -> _Gate:
    """Switch(tensor, pred), on the tensor's own device for resource handles (placement keeps a
    handle with its variable)."""
    on = tensor.op.device if tensor.dtype == tf.resource else device
    with graph.device(None), graph.device(on):
        switch = create_op(graph, "Switch", [tensor, pred],
                           {"T": attr_value_pb2.AttrValue(type=tensor.dtype.as_datatype_enum),
                            Mark.GATE.value: marks.value(True)}, "gate")
    taken = 1 if branch == 0 else 0   # Switch: output 1 is alive when pred is True
    return _Gate(switch.outputs[taken], switch.outputs[1 - taken])


def _merge(graph, synchronized: tf.Tensor, original: tf.Tensor, name: str) -> tf.Tensor:
    merge = create_op(graph, "Merge", [synchronized, original],
                      {"T": attr_value_pb2.AttrValue(type=original.dtype.as_datatype_enum),
                       "N": attr_value_pb2.AttrValue(i=2)}, name)
    return merge.outputs[0]


def _reroute(old: tf.Tensor, merged: tf.Tensor) -> int:
    return reroute_consumers(old, merged, only=[c for c in old.consumers() if c is not merged.op])


def _operand(graph, operand, gates):
    if operand.how == "input":
        return gates[operand.index].taken
    if operand.how == "read":
        return create_op(graph, "ReadVariableOp", [gates[operand.index].taken],
                         {"dtype": attr_value_pb2.AttrValue(type=operand.dtype.as_datatype_enum)}, "read").outputs[0]
    return tf.constant(operand.value)


def _forward_attrs(node, gradient=None, forward=True) -> dict:
    attrs = {k: node.attr[k] for k in ("T", "epsilon", "data_format")}
    attrs["U"] = node.attr["U"] if "U" in node.attr else attr_value_pb2.AttrValue(type=tf.float32.as_datatype_enum)
    attrs["is_training"] = attr_value_pb2.AttrValue(b=True)
    if forward:
        attrs["exponential_avg_factor"] = node.attr["exponential_avg_factor"] \
            if "exponential_avg_factor" in node.attr else attr_value_pb2.AttrValue(f=1.0)
    if gradient:
        attrs["_gradient_op_type"] = attr_value_pb2.AttrValue(s=gradient.encode())
    return attrs


def _other_gradients(graph, grad, operand_plans, operands, n) -> dict:
    """The gradient If's other outputs (those of the moving statistics, which the training branch
    gives as zeros), merged with zeros shaped like the stand-in's operand: output k differentiates
    the If's input k + 1 (how cond_v2 builds it). Every output then lives in both branches, so
    gradient code that waits for all of them (tf.gradients' gate_gradients tuples) never waits for
    a dead one."""
    taken = {i for i in grad.outputs if i is not None}
    by_input = {plan.index: tensor for plan, tensor in zip(operand_plans, operands) if plan.how != "const"}
    merged = {}
    for k, old in enumerate(grad.op.outputs):
        like = by_input.get(k + 1)
        if k in taken or like is None or like.dtype != old.dtype:
            continue
        zeros = create_op(graph, "ZerosLike", [like], {"T": attr_value_pb2.AttrValue(type=like.dtype.as_datatype_enum)},
                          f"grad_{n}_zeros").outputs[0]
        merged[k] = _merge(graph, zeros, old, f"grad_{n}_merge")
    return merged


def stand_in(graph, layer: LayerPlan) -> tuple[LayerPlan, int]:
    """Gates every tower's If and builds its stand-in fused layer (module docstring); returns a new
    fused LayerPlan of the stand-ins, which graphsync/splice/layer.py synchronizes, and the edges
    moved. The plan's own layer is left as it was."""
    sites, moved = [], 0
    for site in layer.sites:
        op, parts = site.op, site.parts
        node, pred, branch = parts.node, op.inputs[0], parts.branch
        with pristine_scope(graph, site.device, op.name + "_sync"):
            gates = {i: _gate(graph, op.inputs[i], pred, branch, site.device) for i in range(1, len(op.inputs))}
            operands = [_operand(graph, o, gates) for o in parts.operands]
            fused = create_op(graph, "FusedBatchNormV3", operands, _forward_attrs(node, STAND_IN_GRADIENT),
                              "stand_in")
            merged = {k: _merge(graph, fused.outputs[k], op.outputs[i], "merge")
                      for k, i in sorted(parts.outputs.items())}
            grad_ops = []
            for n, grad in enumerate(parts.grads):
                dy = _gate(graph, grad.op.inputs[grad.dy], grad.op.inputs[0], branch, site.device)
                grad_op = create_op(graph, "FusedBatchNormGradV3",
                                    [dy.taken, operands[0], operands[1]] + fused.outputs[3:6],
                                    _forward_attrs(node, forward=False), f"stand_in_grad_{n}")
                grad_merged = {j: _merge(graph, grad_op.outputs[j], grad.op.outputs[i], f"grad_{n}_merge")
                               for j, i in enumerate(grad.outputs) if i is not None}
                others = _other_gradients(graph, grad, parts.operands, operands, n)
                grad_ops.append((grad, dy, grad_op, grad_merged, others))
        for i, gate in gates.items():
            update_input(op, i, gate.other)
        for k, i in parts.outputs.items():
            moved += _reroute(op.outputs[i], merged[k])
        moved += reroute_control_outputs(op, [merged[0].op])
        for grad, dy, grad_op, grad_merged, others in grad_ops:
            update_input(grad.op, grad.dy, dy.other)
            for j, i in enumerate(grad.outputs):
                if i is not None:
                    moved += _reroute(grad.op.outputs[i], grad_merged[j])
            for i, merged_zeros in others.items():
                moved += _reroute(grad.op.outputs[i], merged_zeros)
            moved += reroute_control_outputs(grad.op, [grad_merged[0].op])
        sites.append(Site(site.tower, fused, tuple(g for _, _, g, _, _ in grad_ops)))
    return dataclasses.replace(layer, form=LayerForm.FUSED, sites=tuple(sites)), moved
