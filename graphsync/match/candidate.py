"""What every matcher returns: one batch-norm op in one tower (or outside all towers)."""
from __future__ import annotations

import dataclasses

import tensorflow as tf


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
