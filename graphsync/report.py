"""What a rewrite did, for people (`str(report)`) and programs (`report.to_dict()`)."""
from __future__ import annotations

import dataclasses
import enum

from graphsync.match.layer_form import LayerForm


class Backward(enum.StrEnum):
    """How a synchronized layer's backward was synchronized: its value is what reports print."""

    REWRITTEN = "rewritten"   # its gradient ops were replaced
    AUTODIFF = "autodiff"     # gradients built later differentiate the synchronized forward


@dataclasses.dataclass(frozen=True)
class LayerReport:
    """One synchronized layer (a normalization): its tower-independent name, form (`kind`), and the op in
    each tower; a batch norm written by hand that is synchronized as several reductions is one
    layer, `reductions` naming them (the op in each tower is its first's; graphsync/plan/normalizations.py)."""

    name: str
    kind: LayerForm   # as shown: CONDITIONAL for a fused op behind a tensor training flag too
    tower_ops: tuple[str, ...]
    backward: Backward
    found_as: str = ""   # for display only: "fused", "tf.nn.moments", "reductions: mean + mean + mean of squares", …
    reductions: tuple[str, ...] = ()   # the reduction layers it was synchronized as (none: fused, moments)

    def to_dict(self) -> dict:
        """Plain data, the enums as their values (what JSON and TensorBoard show)."""
        return {**dataclasses.asdict(self), "kind": self.kind.value, "backward": self.backward.value}


@dataclasses.dataclass(frozen=True)
class SkippedReport:
    op: str
    reason: str


@dataclasses.dataclass
class RewriteReport:
    towers: list[str]
    device: str
    layers: list[LayerReport] = dataclasses.field(default_factory=list)
    skipped: list[SkippedReport] = dataclasses.field(default_factory=list)
    edges_moved: int = 0
    grad_ops_replaced: int = 0
    strategy: str = "gather"
    groups: list = dataclasses.field(default_factory=list)
    process_group: tuple | None = None
    fingerprints: list = dataclasses.field(default_factory=list)   # per layer, between-graph only
    inlined: list = dataclasses.field(default_factory=list)   # tf.function calls inlined first (graphsync/splice/inline.py)
    recompute: str = ""       # "layers" (rewrite_towers(recompute=True)) or "segments"
    recomputed: int = 0       # tensors (all towers) the backward reads recomputed (graphsync/splice/recompute.py)
    recompute_deferred: int = 0   # layers rewritten before their gradients: recomputed when those are built
    shared_moving: str = ""   # between-graph: moving statistics on a ps left to worker 0 (graphsync/splice/shared_averages.py)

    @property
    def where(self) -> str:
        """Where the aggregation runs, in words."""
        if self.strategy == "ps":
            return f"through queues on {self.device} across {self.process_group[0]} worker processes"
        if self.strategy == "allreduce":
            span = f" across {self.process_group[0]} worker processes" if self.process_group else ""
            return f"by all-reduce on the towers' devices{span}"
        return f"on {self.device or 'the default device'}"

    @property
    def changed(self) -> bool:
        return bool(self.layers)

    @property
    def summary(self) -> str:
        if not self.layers:
            already = sum("already synchronized" in s.reason for s in self.skipped)
            why = f"{already} batch-norm ops already synchronized" if already else "no batch norm to synchronize"
            return f"nothing changed: {why} ({len(self.towers)} towers)"
        kinds = sorted({layer.kind.value for layer in self.layers})
        grads = "gradients rewritten" if any(l.backward is Backward.REWRITTEN for l in self.layers) \
            else "gradients not built yet"
        groups = f" in {len(self.groups)} groups of {len(self.groups[0])}" if len(self.groups) > 1 else ""
        layers = f"{len(self.layers)} layer{'s' if len(self.layers) != 1 else ''}"
        towers = f"{len(self.towers)} tower{'s' if len(self.towers) != 1 else ''}"
        return (f"{layers} × {towers} synchronized{groups} {self.where}"
                f" ({', '.join(kinds)}; {grads})")

    def to_dict(self) -> dict:
        return {"summary": self.summary, "towers": self.towers, "device": self.device,
                "strategy": self.strategy, "groups": self.groups, "process_group": self.process_group,
                "fingerprints": self.fingerprints, "inlined": self.inlined,
                "layers": [l.to_dict() for l in self.layers],
                "skipped": [dataclasses.asdict(s) for s in self.skipped],
                "edges_moved": self.edges_moved, "grad_ops_replaced": self.grad_ops_replaced,
                "recompute": self.recompute, "recomputed": self.recomputed,
                "recompute_deferred": self.recompute_deferred, "shared_moving": self.shared_moving}

    def __str__(self) -> str:
        lines = [self.summary]
        if self.layers:
            width = max(len("layer"), max(len(l.name) for l in self.layers))
            kinds = max(6, max(len(l.kind) for l in self.layers))
            lines.append(f"  {'layer':<{width}}  {'kind':<{kinds}}  backward   towers")
            for l in self.layers:
                row = f"  {l.name:<{width}}  {l.kind.value:<{kinds}}  {l.backward.value:<9}  {len(l.tower_ops)}"
                lines.append(f"{row}  {l.found_as}" if l.reductions else row)
                lines.extend(f"    {r}" for r in listed_reductions(l.name, l.reductions))
        if self.recompute:
            later = f"; {self.recompute_deferred} layers when their gradients are built" \
                if self.recompute_deferred else ""
            how = ", whole forward segments" if self.recompute == "segments" else ""
            lines.append(f"  recomputed in the backward: {self.recomputed} tensors{how}{later}")
        if self.shared_moving:
            lines.append(f"  {self.shared_moving}")
        if self.inlined:
            shown = ", ".join(self.inlined[:3]) + (", …" if len(self.inlined) > 3 else "")
            calls = f"{len(self.inlined)} tf.function call{'s' * (len(self.inlined) != 1)}"
            lines.append(f"  inlined {calls} first: {shown}")
        for s in self.skipped:
            lines.append(f"  skipped {s.op}: {s.reason}")
        return "\n".join(lines)


def listed_reductions(name: str, reductions) -> tuple:
    """The reductions a listing shows under a layer: none when it is one reduction of its own name."""
    return () if tuple(reductions) in ((), (name,)) else tuple(reductions)
