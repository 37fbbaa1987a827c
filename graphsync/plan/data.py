"""The plan: which ops form each synchronized layer, where its aggregation runs and which
gradient ops its backward replaces. Frozen records, made by graphsync/plan/planner.py and only
read by the splice (graphsync/splice/), which returns what it builds instead of writing here.
"""
from __future__ import annotations

import dataclasses
import hashlib

import tensorflow as tf

from graphsync import match
from graphsync.errors import GraphsyncError
from graphsync.graph import shapes, tf_private
from graphsync.match.candidate import ConditionalParts, MomentsParts
from graphsync.match.layer_form import LayerForm
from graphsync.stats import Layout
from graphsync.towers.scopes import Tower, tower_of


@dataclasses.dataclass(frozen=True)
class Site:
    """One layer in one tower: its op (the fused op, or the moments' mean), the other ops of a
    moments subgraph, and one entry per gradient call that differentiates it (a FusedBatchNormGrad
    op, or a `MomentsGrad`)."""

    tower: Tower
    op: tf.Operation
    grad_ops: tuple
    parts: MomentsParts | ConditionalParts | None = None

    @property
    def device(self) -> str:
        return self.op.device


@dataclasses.dataclass(frozen=True)
class MomentsGrad:
    """One gradient call through a moments subgraph: the gradients arriving at its mean and
    variance (None when nothing differentiates that output), and the ops of the call that read
    them (the Mean gradient functions)."""

    call: str
    mean: tf.Tensor | None
    mean_readers: tuple
    variance: tf.Tensor | None
    variance_readers: tuple
    shifted_mean_readers: tuple = ()   # ops of the call that read a shifted mean (match/sufficient.py)


@dataclasses.dataclass(frozen=True)
class ReductionGrad:
    """One gradient call through a synchronized reduction (graphsync/plan/reductions.py): the
    gradient arriving at its output and the ops of its gradient function that read it; for a Max
    or Min, also how many elements its gradient function found equal to the extremum (`ties`), and
    the ops that divide by it."""

    call: str
    entry: tf.Tensor
    readers: tuple
    ties: tf.Tensor | None = None
    ties_readers: tuple = ()


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """One layer to synchronize: the same op in every tower, and its common attributes; for
    reports, the normalization it belongs to (graphsync/plan/normalizations.py: a batch norm
    written by hand is synchronized as several reductions) and how it was found."""

    name: str
    form: LayerForm
    sites: tuple[Site, ...]
    layout: Layout
    epsilon: float
    avg_factor: float
    normalization: str = ""   # the normalization this layer is one reduction of; "": its own
    found_as: str = ""        # for display only: "fused", "tf.nn.moments", "reductions: mean + mean + mean of squares", …

    @property
    def normalization_name(self) -> str:
        """The name reports list this layer under: its normalization's, else its own."""
        return self.normalization or self.name

    @property
    def has_gradients(self) -> bool:
        return bool(self.sites[0].grad_ops)

    @property
    def shown_kind(self) -> LayerForm:
        """What reports call the layer: CONDITIONAL behind a tensor training flag (a v2 If, or a
        fused op inside a v1 tf.cond), else its form."""
        if self.form.fused_kernel and tf_private.control_flow_context(self.sites[0].op) is not None:
            return LayerForm.CONDITIONAL
        return self.form

    @property
    def residual_epsilon(self) -> float | None:
        """The ε of a fused layer's residuals: its statistics kernel uploads Σ(x − m̂)/√(v + ε)
        (graphsync/splice/fused_kernels.py), which the merge scales back; moments residuals are Σ(x − m̂) (None)."""
        return self.epsilon if self.form.fused_kernel else None


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything the splice needs, validated: nothing in it changes once made. What the user
    asked (strategy, process group, recompute) stays in the RewriteOptions (plan/options.py)."""

    towers: tuple[Tower, ...]
    device: str
    layers: tuple[LayerPlan, ...]
    skipped: tuple[tuple[str, str], ...]
    groups: tuple = ()     # tower indices per sync group
    across_processes: bool = False   # between-graph: the towers' peers include other workers' (a process group)
    ps_tasks: tuple = ()   # between-graph: the parameter servers the step uses (plan/shared_tasks.py)
    found_by: str = ""     # how the towers were found: "known name", "structure: gpu_%d", "towers= option"
    calls: tuple = ()      # tower tf.function calls to inline first (splice/inline.py)
    cross_example: tuple = ()   # every op combining examples, with its verdict (plan/rule.py OpVerdict)
    trace_ended: tuple = ()     # (op name, why) where the batch axis's trace ended (batch_axis/)
    unfollowed: tuple = ()      # reductions past those ends the model reads back (batch_axis/unfollowed.py)
    refused: str = ""           # the line a rewrite would refuse with (make_plan(refuse=False): inspect)
    covered: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)  # rule.covered_ops

    @property
    def kept_per_tower(self) -> list[tuple[str, str]]:
        """The skipped batch statistics that train inside one of several towers (or one worker's)
        and stay per tower (match.PerTower reasons): the step is not one device's there."""
        if len(self.towers) < 2 and not self.across_processes:
            return []
        return [(op, why) for op, why in self.skipped
                if isinstance(why, match.PerTower) and tower_of(op, self.towers) is not None]


def check_gradient_calls(what: str, sites) -> None:
    """Every tower of a layer must have been differentiated as often as the others: a layer's
    backward is synchronized call by call (`what` names it in the refusal)."""
    counts = {s.tower.label: len(s.grad_ops) for s in sites}
    if len(set(counts.values())) > 1:
        raise GraphsyncError(f"{what} has a different number of gradient calls per tower ({counts}): "
                             "build gradients for every tower, or rewrite before building them")


def fingerprints(plan: Plan) -> list[str]:
    """One line per synchronized layer with what every worker process of a between-graph job must
    agree on (name, op, dtype, per-example shape, attributes, towers, gradient calls); the batch
    size is left out, workers may differ in it."""
    lines = []
    for layer in plan.layers:
        op = layer.sites[0].op
        x = layer.sites[0].parts.x if isinstance(layer.sites[0].parts, MomentsParts) else op.inputs[0]
        lines.append(f"{layer.name} {op.type} {x.dtype.name} {shapes.text(x.shape[1:])} "
                     f"axes={layer.layout.axes} eps={layer.epsilon:g} avg={layer.avg_factor:g} "
                     f"towers={len(layer.sites)} gradients={len(layer.sites[0].grad_ops)}")
    return lines


def digest(text: str) -> int:
    """A stable 63-bit digest (the same in every process, unlike hash())."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1
