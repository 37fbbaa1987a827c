"""From the runs to the verdict: how much each layer's statistics and each end-to-end check
changed when examples moved between towers, whether that is more than float rounding, and the
one-line reason the report gives.

Layers are judged first, in forward order, each against its own rounding (the same examples
reordered inside their towers, which changes no statistic, global or per tower): a layer whose
statistics change beyond it is not synchronized, and the first such layer is named. The
end-to-end checks (loss, gradients applied, moving statistics) come second: they also catch what
no layer shows, but a deep model at initialization amplifies rounding there by up to 1e6, which
can hide everything; only then, and only when even the layers' own rounding hides the exchange,
is the verdict inconclusive.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from graphsync.verification import run, trace
from graphsync.verification.findings import APART, CHECKS, Figures, LayerFigures, Outcome

# float32 rounding moves these figures by ~1e-7 on small models and up to ~1e-4 on MobileNetV2 (measured:
# tests/test_verify.py); per-tower statistics move them by 1e-3 and (much) more.
DEFAULT_TOLERANCE = 1e-3
ROUNDING_RUNS = 3       # exchanges and reorderings when a change exceeds the tolerance
ROUNDING_FACTOR = 10    # a change passes when within this factor of what reordering inside the towers changes…
ROUNDING_CAP = 0.1      # …up to this: per-tower statistics change the figures by 0.5 and more
ROUNDING_FLOOR = 1.2e-7  # float32's epsilon: reordering may happen to change a figure by exactly 0 (e.g. the
                         # loss when the statistics are accurate); one rounding step is still rounding


def changes(drawn, others) -> dict:
    """check → the median over `others` of its relative change from `drawn` (None: nothing to compare)."""
    changes = {}
    for check, _ in CHECKS + APART:
        if check == "loss":
            total = lambda fetched: [sum(float(np.sum(v)) for v in fetched.loss)]  # noqa: E731
            values = [run.relative_change(total(drawn), total(o)) for o in others] if drawn.loss else [None]
        else:
            values = [run.relative_change(getattr(drawn, check), getattr(o, check)) for o in others]
        changes[check] = None if values[0] is None else float(np.median(values))
    return changes


def figures_of(subject, drawn, exchanged: list, reordered: list, metadata) -> Figures:
    ran = trace.executed(metadata)
    traffic, other = trace.traffic(metadata, subject.layers, trace.exchanges(subject.graph))
    traffic = _per_normalization(traffic, subject.layer_statistics)
    return Figures(
        **changes(drawn, exchanged),
        counts={"loss": len(subject.loss), "gradients": len(subject.gradients), "updates": len(subject.updates),
                "other_writes": len(subject.other_writes)},
        batch_norm_running=[name for name in subject.batch_norm_ops if name in ran],
        batch_norm_ops=len(subject.batch_norm_ops), layers=subject.layers, traffic=traffic, other_bytes=other,
        layer_figures=layer_figures(subject, drawn, exchanged, reordered))


def _per_normalization(traffic: list, layers: list) -> list:
    """One traffic entry per normalization: its reductions' bytes summed, in the first one's place."""
    normalization = {member: layer.name for layer in layers if layer.synchronized for member in layer.members}
    merged = {}
    for entry in traffic:
        name = normalization.get(entry.layer, entry.layer)
        if name not in merged:
            merged[name] = dataclasses.replace(entry, layer=name)
            continue
        for field in dataclasses.fields(entry):
            if field.name != "layer":
                setattr(merged[name], field.name, getattr(merged[name], field.name) + getattr(entry, field.name))
    return list(merged.values())


def layer_figures(subject, drawn, exchanged: list, reordered: list) -> list[LayerFigures]:
    """Per layer: the median relative change of each statistic (all towers' together) and of the
    moving-statistics writes it feeds, when examples move (`exchanged`) and when they are only
    reordered inside their towers (`reordered`). A mean is measured against the activation's own
    scale, √(μ² + σ²) per channel (`_mean_change`), not against itself: a layer whose channels
    have means near 0 would otherwise show rounding as a change of order 1."""
    update_index = {name: i for i, name in enumerate(subject.updates)}
    found, start = [], 0
    for layer in subject.layer_statistics:
        places = {}
        for what, tensors in layer.statistics.items():
            places[what] = ("statistics", list(range(start, start + len(tensors))))
            start += len(tensors)
        if layer.updates:
            places["update"] = ("updates", [update_index[n] for n in layer.updates])

        def change(what, other, places=places):
            group, at = places[what]
            before, after = [getattr(drawn, group)[i] for i in at], [getattr(other, group)[i] for i in at]
            if what == "mean" and "variance" in places:
                return _mean_change(before, after, [drawn.statistics[i] for i in places["variance"][1]])
            return run.relative_change(before, after)

        def median(others, places=places):
            return {what: float(np.median([change(what, o) for o in others])) for what in places}
        found.append(LayerFigures(layer.name, layer.shown_as, layer.synchronized, median(exchanged), median(reordered),
                                  list(layer.members)))
    return found


def _mean_change(before: list, after: list, variance: list) -> float:
    """‖Δμ‖ / ‖√(μ² + σ²)‖ over every tower and channel: how far the mean moved in units of the
    activation's own size (its root mean square)."""
    mean = np.concatenate([np.asarray(m, np.float64).ravel() for m in before])
    moved = np.concatenate([np.asarray(m, np.float64).ravel() for m in after]) - mean
    spread = np.concatenate([np.asarray(v, np.float64).ravel() for v in variance])
    if not (np.all(np.isfinite(moved)) and np.all(np.isfinite(spread))):
        return float("inf")
    scale = np.sqrt(np.sum(mean ** 2 + np.abs(spread)))
    difference = np.linalg.norm(moved)
    return float(difference / scale) if scale > 0 else (0.0 if difference == 0 else float("inf"))


def measure_rounding(runner, batch, drawn, figures: Figures, subject) -> None:
    """When a change exceeds its limit: is it float rounding? Some models amplify rounding
    enormously in their backward pass (deep batch-norm nets at initialization, tiny batches:
    reordering the examples *inside* each tower, which changes no statistic, then moves their
    gradients by up to 1e-1). The figures become the medians over ROUNDING_RUNS exchanges, each
    compared with the median over ROUNDING_RUNS reorderings inside the towers."""
    exchanged = [runner.run(batch.permutation)] + [runner.run(p) for p in batch.other_exchanges(ROUNDING_RUNS - 1)]
    reordered = [runner.run(p) for p in batch.reorders(ROUNDING_RUNS)]
    for check, value in changes(drawn, exchanged).items():
        setattr(figures, check, value)
    figures.rounding = changes(drawn, reordered)
    figures.layer_figures = layer_figures(subject, drawn, exchanged, reordered)
    figures.exchanges = ROUNDING_RUNS


def needs_rounding(figures: Figures, tolerance: float) -> bool:
    """Whether a first exchange moved anything beyond what passes outright."""
    return figures.largest()[1] > tolerance or any(_beyond(layer, what, tolerance) for layer in figures.layer_figures
                                                   for what in layer.changes)


def _limit(rounding: float | None, tolerance: float) -> float:
    """The largest change that passes: the tolerance, or ROUNDING_FACTOR times what reordering
    inside the towers changes (up to ROUNDING_CAP)."""
    if rounding is None:
        return tolerance
    return max(tolerance, min(ROUNDING_FACTOR * max(rounding, ROUNDING_FLOOR), ROUNDING_CAP))


def _hidden(rounding: float | None) -> bool:
    """Rounding so large that no change beyond it can be told from it."""
    return rounding is not None and ROUNDING_FACTOR * rounding > ROUNDING_CAP


def _beyond(layer: LayerFigures, what: str, tolerance: float) -> bool:
    return layer.changes[what] > _limit(layer.rounding.get(what), tolerance)


def _judge_layers(figures: Figures, moved: str, tolerance: float):
    """(outcome, reason) from the layers, or None when every layer holds. The first layer (in
    forward order) whose statistics change beyond their rounding fails; a layer whose own
    rounding hides the change makes the verdict inconclusive only when no layer fails."""
    hidden = None
    for layer in figures.layer_figures:
        beyond = [what for what in layer.changes if _beyond(layer, what, tolerance)]
        if not beyond:
            continue
        what = max(beyond, key=lambda w: (w != "update", layer.changes[w]))   # a statistic before the update
        change, rounding = layer.changes[what], layer.rounding.get(what)
        if change == float("inf"):
            return Outcome.FAIL, f"layer `{layer.name}` computes non-finite statistics (NaN or infinity)"
        if _hidden(rounding):
            hidden = hidden or (layer, what)
            continue
        why = "" if layer.synchronized else "; it has no synchronized layer: rewrite it first" if not figures.layers \
            else "; graphsync did not rewrite it"
        return Outcome.FAIL, (f"layer `{layer.name}` is not synchronized: {_its(what)} changes by {change:.1e} when "
                       f"{moved} (rounding {f'{rounding:.1e}' if rounding else '0'}){why}")
    if hidden is not None:
        layer, what = hidden
        return Outcome.INCONCLUSIVE, (f"layer `{layer.name}`: {_its(what)} changes by {layer.changes[what]:.1e} when "
                       f"{moved}, but reordering examples inside their towers already changes it by "
                       f"{layer.rounding[what]:.1e} (float rounding, amplified by this model)")
    return None


def _its(what: str) -> str:
    return {"mean": "its batch mean", "variance": "its batch variance", "update": "its moving-statistics update",
            "sum": "its sum over the batch", "maximum": "its maximum over the batch",
            "minimum": "its minimum over the batch"}.get(what, f"its {what}")


def verdict(figures: Figures, batch, tolerance: float, fixed_batch: bool = False) -> tuple[Outcome, str]:
    """(outcome, the one-line reason the report gives: an inconclusive one says so first and ends
    with its remedy)."""
    outcome, reason = _verdict(figures, batch, tolerance)
    if outcome is Outcome.INCONCLUSIVE:
        return outcome, f"inconclusive: {reason}{_remedy(fixed_batch)}"
    return outcome, reason


def _verdict(figures: Figures, batch, tolerance: float) -> tuple[Outcome, str]:
    moved = f"moving {batch.moved} of {batch.examples} examples to other towers"
    moving = f"{batch.moved} of {batch.examples} examples move"
    checks = [(c, getattr(figures, c)) for c, _ in CHECKS if getattr(figures, c) is not None]
    for check, change in checks:
        if change == float("inf"):
            return Outcome.FAIL, f"the graph computes non-finite {dict(CHECKS)[check]} (NaN or infinity)"
    judged = _judge_layers(figures, moving, tolerance)
    if judged is not None:
        return judged
    layers_hold = bool(figures.layer_figures)
    failing = [(check, change) for check, change in checks
               if change > _limit((figures.rounding or {}).get(check), tolerance)]
    hidden = [(check, change) for check, change in failing if _hidden((figures.rounding or {}).get(check))]
    if failing and not (layers_hold and len(hidden) == len(failing)):
        check, change = max(failing, key=lambda item: item[1])
        rounding = (figures.rounding or {}).get(check)
        hint = "" if figures.layers else "; it has no synchronized layer: rewrite it first"
        if _hidden(rounding):
            return Outcome.INCONCLUSIVE, (
                f"{moved} changes the {dict(CHECKS)[check]} by {change:.1e}, but reordering examples inside their "
                f"towers already changes them by {rounding:.1e} (float rounding, amplified by this model)")
        scale = f"float rounding: {rounding:.1e}" if rounding is not None else f"tolerance {tolerance:.0e}"
        held = (f"; every one of its {len(figures.layer_figures)} layers holds: something else in the towers "
                "depends on which tower an example sits in") if layers_hold else ""
        return Outcome.FAIL, f"not synchronized: {moved} changes the {dict(CHECKS)[check]} by {change:.1e} ({scale}){hint}{held}"
    if figures.batch_norm_running:
        return Outcome.FAIL, (f"{len(figures.batch_norm_running)} per-tower batch-norm ops still run each step "
                       f"(e.g. {figures.batch_norm_running[0]}): something still reads them")
    check, change = figures.largest()
    if not figures.layers and not figures.batch_norm_ops and not figures.layer_figures:
        return Outcome.PASS, f"{moved} changes nothing (largest change {change:.1e}); the towers have no batch norm"
    if layers_hold:
        layer = max(figures.layer_figures, key=lambda layer: layer.largest()[1])
        what = layer.largest()[0]
        end = (f"; the {dict(CHECKS)[check]} change by {change:.1e}, as much as reordering examples inside their "
               f"towers does ({figures.rounding[check]:.1e})" if change > tolerance else
               f"; end to end, the largest change is {change:.1e}")
        return Outcome.PASS, (f"synchronized: {moved} leaves the statistics of every one of {_count(figures)} "
                      f"unchanged beyond rounding (largest change {layer.changes[what]:.1e}){end}")
    if change > tolerance:
        return Outcome.PASS, (f"synchronized: {moved} changes the {dict(CHECKS)[check]} by {change:.1e} (median of "
                      f"{figures.exchanges}), as much as float rounding does here (reordering examples inside "
                      f"their towers: {figures.rounding[check]:.1e})")
    return Outcome.PASS, (f"synchronized: {moved} changes nothing beyond float rounding "
                  f"(largest change {change:.1e}, tolerance {tolerance:.0e})")


def _count(figures: Figures) -> str:
    n = len(figures.layer_figures)
    return f"its {n} layers" if n != 1 else "its 1 layer"


def _remedy(fixed_batch: bool) -> str:
    """Only what the graph accepts: more examples per tower where the graph does not fix them."""
    if fixed_batch:
        return "; the graph fixes its examples per tower: build it with more to tell"
    return ": try --batch-size 16"
