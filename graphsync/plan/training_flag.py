"""The checks of a layer behind a tensor `training` flag, before any edit: one flag tensor for every
tower, and paired Ifs (control flow v2) that agree; graphsync/splice/stand_in.py then builds it.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.graph import shapes
from graphsync.match.layer_form import LayerForm
from graphsync.plan.data import LayerPlan, Site
from graphsync.stats import Layout


def predicate(pred: tf.Tensor) -> tf.Tensor:
    """A predicate past Identity ops, which copy it without changing it."""
    while pred.op.type == "Identity":
        pred = pred.op.inputs[0]
    return pred


def check_one_flag(name: str, flags: dict) -> None:
    """Refuses a layer whose towers read different flag tensors ({tower label: predicate}), which
    could train some towers and evaluate others in one step."""
    if len({f.ref() if f is not None else None for f in flags.values()}) > 1:
        listed = ", ".join(f"{label} reads {flag.name if flag is not None else 'no flag'}"
                           for label, flag in flags.items())
        raise GraphsyncError(f"layer {name!r} is behind a different training flag in each tower ({listed}): "
                             "feed every tower the same flag tensor")


def layer_plan(name: str, per_tower) -> LayerPlan:
    """One conditional layer: the same If in every tower, reading the same flag."""
    check_one_flag(name, {t.label: predicate(c.op.inputs[0]) for t, c in per_tower})
    signatures = [_signature(c) for _, c in per_tower]
    first = per_tower[0][1].op
    for (_, cand), sig in zip(per_tower[1:], signatures[1:]):
        if sig != signatures[0]:
            diff = ", ".join(f"{k}: {signatures[0][k]} vs {sig[k]}" for k in sig if sig[k] != signatures[0][k])
            raise GraphsyncError(f"{first.name} and {cand.op.name} are paired as layer {name!r} but differ ({diff})")
    counts = {t.label: len(c.parts.grads) for t, c in per_tower}
    if len(set(counts.values())) > 1:
        raise GraphsyncError(
            f"layer {name!r} has a different number of gradient calls per tower ({counts}): "
            "build gradients for every tower, or rewrite before building them")
    sig, node = signatures[0], per_tower[0][1].parts.node
    if sig["rank"] is None:
        raise GraphsyncError(f"{first.name}: the rank of its batch norm's input is unknown; set a static rank")
    sites = tuple(Site(t, c.op, tuple(c.parts.grads), c.parts) for t, c in per_tower)
    return LayerPlan(name, LayerForm.CONDITIONAL, sites, Layout.from_data_format(sig["rank"], sig["data_format"]),
                     node.attr["epsilon"].f, sig["exponential_avg_factor"])


def _x(cand) -> tf.Tensor:
    return cand.op.inputs[cand.parts.operands[0].index]


def _signature(cand) -> dict:
    node, x = cand.parts.node, _x(cand)
    mean = cand.op.outputs[cand.parts.outputs.get(1, 0)]
    return {"kind": node.op, "dtype": x.dtype.name, "rank": x.shape.rank,
            "channels": shapes.dim(mean.shape, 0) if 1 in cand.parts.outputs and mean.shape.rank == 1 else None,
            "epsilon": node.attr["epsilon"].f, "data_format": node.attr["data_format"].s.decode(),
            "exponential_avg_factor": node.attr["exponential_avg_factor"].f
            if "exponential_avg_factor" in node.attr else 1.0,
            "training branch": cand.parts.branch}
