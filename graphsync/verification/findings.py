"""What `verify` found, for people (`str(report)`) and programs (`report.to_dict()`)."""
from __future__ import annotations

import dataclasses
import enum

from graphsync.verification.trace import LayerTraffic

SHOWN_LAYERS = 8
CHECKS = (("loss", "sum of the tower losses"), ("gradients", "gradients applied"),
          ("updates", "moving-statistics updates"))
# compared and shown, never judged: writes fed by one tower's scalars (discovery/statistics.py)
APART = (("other_writes", "other writes, not judged"),)


@dataclasses.dataclass
class LayerFigures:
    """One layer's response to the exchange: per statistic ("mean", "variance", a reduction's
    "sum"…, and "update", the moving-statistics writes it feeds), the relative change when examples
    move to other towers and when they are only reordered inside theirs (its rounding)."""

    name: str
    form: str
    synchronized: bool
    changes: dict
    rounding: dict
    members: list = dataclasses.field(default_factory=list)   # a normalization's reductions, listed under it

    def largest(self) -> tuple[str, float]:
        """(what, change) of the statistic that changed most (the update only if nothing else is compared)."""
        statistics = {what: change for what, change in self.changes.items() if what != "update"} or self.changes
        return max(statistics.items(), key=lambda item: item[1])


@dataclasses.dataclass
class Figures:
    """One graph's response to the exchange: the relative change of each fetched quantity (None
    when the graph has none), and what its first run's step statistics show."""

    loss: float | None
    gradients: float | None
    updates: float | None
    counts: dict                  # check → number of tensors compared
    batch_norm_running: list[str]  # per-tower batch-norm ops that executed
    batch_norm_ops: int            # per-tower batch-norm ops in the graph
    layers: list[str]              # synchronized layers (the marks of their exchange)
    traffic: list[LayerTraffic]
    other_bytes: int               # every other cross-device edge (variables, feeds, gradients)
    rounding: dict | None = None   # check → change from reordering examples inside their towers
    exchanges: int = 1             # the changes are medians over this many exchanges
    other_writes: float | None = None   # writes that depend on the examples but on no batch statistic
    layer_figures: list[LayerFigures] = dataclasses.field(default_factory=list)   # in forward order

    @property
    def synchronized_layers(self) -> int:
        """Synchronized batch-norm layers, a normalization written as several reductions counting
        once (from the marks; a graph rewritten without them: its aggregation scopes)."""
        marked = sum(layer.synchronized for layer in self.layer_figures)
        return marked or len(self.layers)

    def largest(self) -> tuple[str, float]:
        """(check, change) of the largest change."""
        found = [(name, getattr(self, name)) for name, _ in CHECKS if getattr(self, name) is not None]
        return max(found, key=lambda item: item[1])

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["traffic"] = [dict(dataclasses.asdict(t), forward=t.forward, backward=t.backward, total=t.total)
                           for t in self.traffic]
        return data


class Outcome(enum.Enum):
    """What verify concludes: the rewritten graph's statistics are the whole batch's (PASS), are not
    (FAIL), or float rounding amplified by the model hides which (INCONCLUSIVE: exit status and
    report as a failure, with a remedy)."""
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclasses.dataclass
class VerifyReport:
    """The verdict on one graph (`rewritten`), and the same figures for the un-rewritten graph
    (`original`) when it was given."""

    graph: str
    towers: list[str]
    inputs: list[dict]
    loss: list[str]
    loss_source: str
    examples: int
    per_tower: int | list        # examples per tower (a list when the towers differ)
    moved: int
    seed: int
    tolerance: float
    rewritten: Figures
    original: Figures | None
    outcome: Outcome
    reason: str
    group_size: int | None = None
    devices: dict = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    copies: str = ""             # which per-tower variable copies started equal, and how they were found

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS

    @property
    def summary(self) -> str:
        return ("PASS: " if self.passed else "FAIL: ") + self.reason

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["outcome"], data["passed"] = self.outcome.value, self.passed
        data["rewritten"] = self.rewritten.to_dict()
        data["original"] = self.original.to_dict() if self.original else None
        data["summary"] = self.summary
        return data

    def __str__(self) -> str:
        return self.format()

    def format(self, verbose: bool = False) -> str:
        """The report as text; `verbose` lists every layer's traffic (else the largest few), layers
        in forward order."""
        lines = [f"{self.graph}: {len(self.towers)} towers ({', '.join(self.towers)}), "
                 f"{_count(self.rewritten.synchronized_layers, 'synchronized layer')}"]
        for device, cpu in self.devices.items():
            lines.append(f"  runs {device} as {cpu}")
        sizes = self.per_tower if isinstance(self.per_tower, int) else "/".join(map(str, self.per_tower))
        lines.append(f"inputs: {sizes} random examples per tower (seed {self.seed})")
        for item in self.inputs:
            lines.append(f"  {item['name']}  {item['dtype']} {item['shape']}"
                         + (f", classes 0..{item['classes'] - 1} ({item['classes_from']})" if item["classes"] else "")
                         + (f", fixed {item['value']}" if item["kind"] == "fixed" else "")
                         + (f"  ({item['origin']})" if item.get("origin") else ""))
        loss = ", ".join(self.loss) if len(self.loss) <= 4 else f"{self.loss[0]} and {len(self.loss) - 1} more"
        lines.append(f"loss: {loss} ({self.loss_source})" if self.loss else "loss: none found (pass --loss NAME)")
        if self.copies:
            lines.append(f"variables: {self.copies}")
        within = f" (within groups of {self.group_size})" if self.group_size else ""
        lines.extend(self._layer_table(verbose))
        lines.append(f"moving {self.moved} of {self.examples} examples to other towers{within} changes, end to end:")
        lines.extend(self._table())
        lines.extend(self._traffic(verbose))
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(self.summary)
        return "\n".join(lines)

    def _table(self) -> list[str]:
        columns = [("rewritten" if self.original else "exchanged", self.rewritten, None)]
        if self.rewritten.rounding:
            columns.append(("reordered", self.rewritten, self.rewritten.rounding))
        if self.original:
            columns.append(("original", self.original, None))
        rows = []
        for name, label in CHECKS + APART:
            values = [(rounding or {}).get(name) if rounding is not None else getattr(f, name)
                      for _, f, rounding in columns]
            if all(v is None for v in values):
                continue
            count = self.rewritten.counts.get(name, 0)
            rows.append((f"{label} ({count})" if name != "loss" else label, [_relative(v) for v in values]))
        rows.append(("per-tower batch-norm ops still running",
                     ["" if rounding is not None else f"{len(f.batch_norm_running)} of {f.batch_norm_ops}"
                      for _, f, rounding in columns]))
        width = max(len(label) for label, _ in rows)
        lines = []
        if len(columns) > 1:
            lines.append(f"  {'':<{width}}  " + "  ".join(f"{title:>10}" for title, _, _ in columns))
        for label, cells in rows:
            lines.append((f"  {label:<{width}}  " + "  ".join(f"{c:>10}" for c in cells)).rstrip())
        if self.rewritten.rounding:
            lines.append(f"  (medians of {self.rewritten.exchanges}; reordered: examples shuffled only inside their towers)")
        return lines

    def _layer_table(self, verbose: bool) -> list[str]:
        """Each layer's largest change (the statistic that changed most), beside its rounding and,
        given the original, the same layer's there: the first few layers and those that changed
        most against their rounding, in forward order (`verbose`: every layer)."""
        layers = self.rewritten.layer_figures
        if not layers:
            return []
        original = {layer.name: layer for layer in (self.original.layer_figures if self.original else [])}

        def against_rounding(i):
            what, change = layers[i].largest()
            return change / max(layers[i].rounding.get(what, 0.0), 1.2e-7)
        shown = set(range(len(layers))) if verbose or len(layers) <= SHOWN_LAYERS else \
            set(range(SHOWN_LAYERS // 2)) | set(sorted(range(len(layers)), key=against_rounding)[-(SHOWN_LAYERS // 2):])
        rows = []
        for i in sorted(shown):
            layer = layers[i]
            what, change = layer.largest()
            cells = [layer.form + ("" if layer.synchronized else ", per tower"), what, _relative(change),
                     _relative(layer.rounding.get(what))]
            if self.original:
                cells.append(_relative(original[layer.name].largest()[1]) if layer.name in original else "-")
            rows.append((layer.name, cells))
            for key in (k for k in layer.changes if layer.members and k != "update"):   # "mean (reduction)"
                what, _, member = key.partition(" (")
                rows.append((f"  {member.rstrip(')')}", ["", what, _relative(layer.changes[key]),
                                                          _relative(layer.rounding.get(key))]
                             + ([""] if self.original else [])))
        width = max(len(name) for name, _ in rows)
        titles = ["form", "statistic", "moved", "reordered"] + (["original"] if self.original else [])
        widths = [max(len(titles[k]), *(len(cells[k]) for _, cells in rows)) for k in range(len(titles))]
        lines = [f"layers, in forward order: how much moving {self.moved} of {self.examples} examples to other towers "
                 "changes their statistics (reordered: only inside their towers)",
                 f"  {'layer':<{width}}  " + "  ".join(f"{t:>{w}}" for t, w in zip(titles, widths))]
        lines += [f"  {name:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths)) for name, cells in rows]
        if len(shown) < len(layers):
            lines.append(f"  … {len(layers) - len(shown)} more layers (the first and the most changed shown; --verbose: all)")
        return lines

    def _traffic(self, verbose: bool) -> list[str]:
        traffic = self.rewritten.traffic
        if not traffic:
            return []
        largest = sorted(range(len(traffic)), key=lambda i: -traffic[i].total)[:SHOWN_LAYERS]
        shown = traffic if verbose or len(traffic) <= SHOWN_LAYERS else [traffic[i] for i in sorted(largest)]
        width = max(len(t.layer) for t in shown)
        reduced = any(t.forward_reduced or t.backward_reduced for t in traffic)
        lines = ["bytes across devices per step and synchronized layer, "
                 + ("all-reduced (every tower's share, summed):" if reduced
                    else "up to the aggregation device / back:"),
                 f"  {'layer':<{width}}  {'forward':>13}  {'backward':>13}"]
        for t in shown:
            cells = [(t.forward_reduced, t.forward_up, t.forward_down), (t.backward_reduced, t.backward_up, t.backward_down)]
            lines.append(f"  {t.layer:<{width}}  " + "  ".join(
                f"{(str(r) if reduced else f'{up}/{down}'):>13}" for r, up, down in cells))
        if len(shown) < len(traffic):
            lines.append(f"  … {len(traffic) - len(shown)} more layers (the {len(shown)} largest shown)")
        total = sum(t.total for t in traffic)
        lines.append(f"  all {_count(len(traffic), 'layer')}: {total:,} bytes; everything else: "
                     f"{self.rewritten.other_bytes:,} bytes")
        return lines


def _relative(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.1e}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"
