"""From the runs to the verdict: how much each check changed when examples moved between towers,
whether that is more than float rounding, and the one-line reason the report gives.
"""
from __future__ import annotations

import numpy as np

from graphsync.verification import run, trace
from graphsync.verification.findings import APART, CHECKS, Figures

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


def figures_of(subject, drawn, exchanged: list, metadata) -> Figures:
    ran = trace.executed(metadata)
    traffic, other = trace.traffic(metadata, subject.layers, subject.towers)
    return Figures(
        **changes(drawn, exchanged),
        counts={"loss": len(subject.loss), "gradients": len(subject.gradients), "updates": len(subject.updates),
                "other_writes": len(subject.other_writes)},
        batch_norm_running=[name for name in subject.batch_norm_ops if name in ran],
        batch_norm_ops=len(subject.batch_norm_ops), layers=subject.layers, traffic=traffic, other_bytes=other)


def measure_rounding(runner, batch, drawn, figures: Figures) -> None:
    """When a change exceeds the tolerance: is it float rounding? Some models amplify rounding
    enormously in their backward pass (deep batch-norm nets at initialization, tiny batches:
    reordering the examples *inside* each tower, which changes no statistic, then moves their
    gradients by up to 1e-1). The figures become the medians over ROUNDING_RUNS exchanges, each
    compared with the median over ROUNDING_RUNS reorderings inside the towers."""
    exchanged = [runner.run(batch.permutation)] + [runner.run(p) for p in batch.other_exchanges(ROUNDING_RUNS - 1)]
    reordered = [runner.run(p) for p in batch.reorders(ROUNDING_RUNS)]
    for check, value in changes(drawn, exchanged).items():
        setattr(figures, check, value)
    figures.rounding = changes(drawn, reordered)
    figures.exchanges = ROUNDING_RUNS


def _limit(figures: Figures, check: str, tolerance: float) -> float:
    """The largest change of `check` that passes: the tolerance, or ROUNDING_FACTOR times what
    reordering inside the towers changes (up to ROUNDING_CAP)."""
    rounding = (figures.rounding or {}).get(check)
    if rounding is None:
        return tolerance
    return max(tolerance, min(ROUNDING_FACTOR * max(rounding, ROUNDING_FLOOR), ROUNDING_CAP))


def verdict(figures: Figures, batch, tolerance: float) -> tuple[bool, str]:
    moved = f"moving {batch.moved} of {batch.examples} examples to other towers"
    checks = [(c, getattr(figures, c)) for c, _ in CHECKS if getattr(figures, c) is not None]
    for check, change in checks:
        if change == float("inf"):
            return False, f"the graph computes non-finite {dict(CHECKS)[check]} (NaN or infinity)"
    failing = [(check, change) for check, change in checks if change > _limit(figures, check, tolerance)]
    if failing:
        check, change = max(failing, key=lambda item: item[1])
        rounding = (figures.rounding or {}).get(check)
        hint = "" if figures.layers else "; it has no synchronized layer: rewrite it first"
        if rounding is not None and ROUNDING_FACTOR * rounding > ROUNDING_CAP:
            return False, (f"inconclusive: {moved} changes the {dict(CHECKS)[check]} by {change:.1e}, but reordering "
                           f"examples inside their towers already changes them by {rounding:.1e} (float rounding, "
                           "amplified by this model): try --batch-size 16 or trained weights")
        scale = f"float rounding: {rounding:.1e}" if rounding is not None else f"tolerance {tolerance:.0e}"
        return False, f"not synchronized: {moved} changes the {dict(CHECKS)[check]} by {change:.1e} ({scale}){hint}"
    if figures.batch_norm_running:
        return False, (f"{len(figures.batch_norm_running)} per-tower batch-norm ops still run each step "
                       f"(e.g. {figures.batch_norm_running[0]}): something still reads them")
    check, change = figures.largest()
    if not figures.layers and not figures.batch_norm_ops:
        return True, f"{moved} changes nothing (largest change {change:.1e}); the towers have no batch norm"
    if change > tolerance:
        return True, (f"synchronized: {moved} changes the {dict(CHECKS)[check]} by {change:.1e} (median of "
                      f"{figures.exchanges}), as much as float rounding does here (reordering examples inside "
                      f"their towers: {figures.rounding[check]:.1e})")
    return True, (f"synchronized: {moved} changes nothing beyond float rounding "
                  f"(largest change {change:.1e}, tolerance {tolerance:.0e})")
