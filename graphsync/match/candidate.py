"""What every matcher returns: one batch-norm op in one tower (or outside all towers)."""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.match.layer_form import LayerForm


class PerTower(str):
    """A reason to leave batch statistics that train inside a tower per tower: ghost batch norm.
    Unlike the other reasons (inference mode, layer norm, outside the towers)
    the step then differs from one device on the concatenated batch, on purpose or not, so a
    rewrite says so by default (graphsync.plan.data.Plan.kept_per_tower)."""


@dataclasses.dataclass(frozen=True)
class MomentsParts:
    """What a moments form (LayerForm.MOMENTS) captured: batch statistics of x over `axes`, spelled out in ops.
    The forms differ in how they are found, never in what they hand on."""

    x: tf.Tensor                      # the activation whose statistics these are
    variance: tf.Operation            # the op whose output is the (biased) variance; the mean is the candidate's op
    axes: tuple
    keep_dims: bool
    sqdiff: tf.Operation | None = None          # tf.nn.moments' SquaredDifference (shape-only readers move to x)
    stop_gradient: tf.Operation | None = None   # tf.nn.moments' StopGradient of the mean
    statistics: tuple | None = None   # every op computing the statistics (hand-written forms: gradients found by them)
    variance_reads_mean: bool = False   # the variance reads the mean unstopped (its gradient flows into the mean)
    weights: tf.Tensor | None = None    # weighted moments: the weights (graphsync/match/weighted.py)
    shift: tf.Tensor | None = None          # sufficient statistics with a shift s (graphsync/match/sufficient.py):
    shifted_mean: tf.Tensor | None = None   # E[x − s], which gradient ops read, and
    square: tf.Operation | None = None      # the Square of the shifted mean


@dataclasses.dataclass(frozen=True)
class ConditionalParts:
    """What graphsync/match/conditional.py captured of an If whose branches train or infer one
    fused batch norm."""

    branch: int        # the branch that trains
    node: object       # the training branch's FusedBatchNorm NodeDef
    operands: tuple    # how each of its inputs reaches it (an If input, a variable read, a constant)
    outputs: dict      # fused output index → If output index
    grads: tuple       # the gradient Ifs that differentiate it


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One batch-norm op in one tower (or outside all towers) that graphsync may synchronize."""

    op: tf.Operation
    form: LayerForm
    skip_reason: str | None = None
    parts: MomentsParts | ConditionalParts | None = None

    @property
    def name(self) -> str:
        return self.op.name
