"""What every matcher returns: one batch-norm op in one tower (or outside all towers)."""
from __future__ import annotations

import dataclasses

import tensorflow as tf


class PerTower(str):
    """A reason to leave batch statistics that train inside a tower per tower: ghost batch norm,
    weights per channel. Unlike the other reasons (inference mode, layer norm, outside the towers)
    the step then differs from one device on the concatenated batch, on purpose or not, so a
    rewrite says so by default (graphsync.plan.Plan.kept_per_tower)."""


@dataclasses.dataclass
class Candidate:
    """One batch-norm op in one tower (or outside all towers) that graphsync may synchronize."""

    op: tf.Operation
    kind: str
    skip_reason: str | None = None
    parts: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.op.name
