"""The four forms a synchronized layer takes, and what each form decides downstream.

A matcher (or graphsync/plan/reductions.py) says which form a layer has; from then on the planner,
the splice, the rewrite's check and `graphsync verify` ask the form what to do instead of
comparing its name, so that what a form means is said here once:

    form         its statistics                          spliced by                      recompute
    fused        one FusedBatchNorm's kernel             splice/layer.py, fused kernel   its normalized output
    moments      spelled out in ops (MomentsParts)       splice/layer.py, local moments  its normalized output
    conditional  a fused batch norm in an If's branches  fused stand-ins first           as fused
    reduction    one Sum, Mean, Max or Min by itself     splice/reduction.py             nothing

A LayerForm is a StrEnum: it equals its value, and its value is what reports, marks, JSON and
TensorBoard show ("fused", …), byte for byte. The matchers' finer spelling (tf.nn.moments, by hand,
weighted, …) is LayerPlan.found_as, a string for display only.
"""
from __future__ import annotations

import enum


class LayerForm(enum.StrEnum):
    FUSED = "fused"
    MOMENTS = "moments"
    CONDITIONAL = "conditional"
    REDUCTION = "reduction"

    @property
    def fused_kernel(self) -> bool:
        """One fused op computes and applies the statistics: the splice runs the fused statistics
        kernel (a Bessel spread, residuals scaled by 1/√(v + ε)) and replaces its gradient ops."""
        return self is LayerForm.FUSED

    @property
    def spelled_out(self) -> bool:
        """The statistics are spelled out in ops (MomentsParts: x, variance, axes): the splice
        computes each tower's moments itself, and gradient calls are paired by tf.gradients' scopes."""
        return self is LayerForm.MOMENTS

    @property
    def in_branches(self) -> bool:
        """A fused batch norm inside an If's branches (ConditionalParts): planned by
        graphsync/plan/training_flag.py and spliced through fused stand-ins built first
        (graphsync/splice/stand_in.py), which are a fused layer from then on."""
        return self is LayerForm.CONDITIONAL

    @property
    def reduces(self) -> bool:
        """A batch statistic by itself, not a normalization: spliced by graphsync/splice/reduction.py,
        and several of them may make one normalization (graphsync/plan/normalizations.py)."""
        return self is LayerForm.REDUCTION

    @property
    def recomputes(self) -> bool:
        """Whether the splice leaves a normalized output the backward may read recomputed
        (graphsync/splice/recompute.py): a reduction leaves nothing to recompute."""
        return not self.reduces

    def replaced(self, site) -> list:
        """(op, outputs) of one spliced tower's old ops that nothing may read any more (the
        rewrite's check): a fused op's reserve spaces stay read by its (dead) gradient ops."""
        if self.spelled_out:
            return [(op, op.outputs[:1]) for op in (site.op, site.parts.variance)]
        if self.reduces:
            return [(site.op, site.op.outputs)]
        return [(site.op, site.op.outputs[:3])] + [(g, g.outputs) for g in site.grad_ops]

    def statistics(self, site) -> dict:
        """What → tensor: the statistics one tower of a layer not yet synchronized normalizes with,
        as its readers read them (what `graphsync verify` compares layer by layer)."""
        op, parts = site.op, site.parts
        if self.spelled_out:
            return {"mean": op.outputs[0], "variance": parts.variance.outputs[0]}
        if self.reduces:
            return {{"Max": "maximum", "Min": "minimum", "Mean": "mean"}.get(op.type, "sum"): op.outputs[0]}
        if self.in_branches:   # an If training one fused op: its batch mean and variance outputs
            return {what: op.outputs[parts.outputs[index]] for what, index in (("mean", 1), ("variance", 2))
                    if index in parts.outputs}
        # a fused op: its reserve outputs hold the batch mean and biased variance it normalizes with
        return {"mean": op.outputs[3], "variance": op.outputs[4]}
