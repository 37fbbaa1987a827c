"""Which name scopes are towers: the known names (a fast path) and the towers= option.

Towers are found by structure (graphsync/towers/structure.py, over the names tower_names.py
proposes) whenever these names do not settle it. Scopes, not devices, identify towers (slim's
`clone_on_cpu` puts every clone on one device). The known names:

    tower_0/…          the TensorFlow CIFAR10 multi-GPU example
    tower_0/v0/…       tf_cnn_benchmarks (variable scope v<i> inside the tower's name scope)
    tower0/…           tensorpack
    clone_0/…          slim model_deploy
    replica_1/…        MirroredStrategy in graph mode (replica 0 unscoped)

Code that leaves its first replica unscoped (MirroredStrategy, DeepLab) gets the root as tower 0
when the numbered towers start at 1 and the root holds their counterparts.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence

from graphsync.errors import GraphsyncError

ROOT = ""

_TOWER_COMPONENT = re.compile(r"^(?P<stem>tower_?|clone_?|replica_?)(?P<index>\d+)$")


@dataclasses.dataclass(frozen=True)
class Tower:
    """One replica of the model: the name prefix (ending in '/', or '' for the root) of its ops."""

    index: int
    prefix: str

    @property
    def label(self) -> str:
        return self.prefix.rstrip("/") or "(root)"


def conventional_prefix(name: str) -> tuple[str, str] | None:
    """(prefix, family) when `name` lies in a conventionally named tower, else None.

    The family (parent scope + stem) keeps `tower_0/` and `clone_0/` from being mixed.
    """
    parts = name.split("/")
    for i, part in enumerate(parts[:-1]):
        found = _TOWER_COMPONENT.match(part)
        if found:
            end = i + 1
            if end < len(parts) - 1 and parts[end] == "v" + found.group("index"):
                end += 1  # tf_cnn_benchmarks' per-tower variable scope
            family = "/".join(parts[:i] + [found.group("stem")])
            return "/".join(parts[:end]) + "/", family
    return None


def _natural_key(prefix: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", prefix)]


def _ordered(prefixes: Iterable[str]) -> list[Tower]:
    unique = sorted(set(prefixes), key=lambda p: (p != ROOT, _natural_key(p)))
    return [Tower(i, p) for i, p in enumerate(unique)]


def _normalized(prefix: str) -> str:
    return prefix if prefix == ROOT or prefix.endswith("/") else prefix + "/"


def find_towers(op_names: Sequence[str], towers=None) -> list[Tower]:
    """The towers among `op_names` (the names of the batch-norm candidates).

    `towers` overrides discovery: a list of scope prefixes ('' is the root) or a regular expression
    whose match at the start of an op name is that op's tower prefix.
    """
    if towers is None:
        return _discover(op_names)
    if isinstance(towers, (str, re.Pattern)):
        try:
            pattern = re.compile(towers)
        except re.error as exc:
            raise GraphsyncError(f"towers={towers!r} is not a valid regular expression: {exc}") from None
        found = set()
        for name in op_names:
            match = pattern.match(name)
            if match and match.group(0):
                found.add(_normalized(match.group(0)))
        return _ordered(found)
    prefixes = [_normalized(str(p)) for p in towers]
    if len(set(prefixes)) != len(prefixes):
        raise GraphsyncError(f"towers={list(towers)!r} names a tower twice")
    return _ordered(prefixes)


def conventional_families(op_names: Sequence[str]) -> dict[str, set[str]]:
    """family (parent scope + stem) → the tower prefixes of that convention among `op_names`."""
    families: dict[str, set[str]] = {}
    for name in op_names:
        found = conventional_prefix(name)
        if found:
            families.setdefault(found[1], set()).add(found[0])
    return families


def _discover(op_names: Sequence[str]) -> list[Tower]:
    families = conventional_families(op_names)
    if not families:
        return []
    # Several conventions in one graph: the one with most towers is the replication.
    family = max(families, key=lambda f: (len(families[f]), f))
    prefixes = families[family]
    indices = {int(re.search(r"(\d+)/(?:v\d+/)?$", p).group(1)) for p in prefixes}
    if 0 not in indices:
        prefixes = prefixes | {ROOT}  # kept only if the root holds counterparts (see pairing)
    return _ordered(prefixes)


def known_convention(towers: Sequence[Tower]) -> str:
    """How the known names found `towers`, for inspect: e.g. 'known name tower_%d' ('/v%d' for
    tf_cnn_benchmarks, '+ (root)' for an unscoped first replica)."""
    scoped = [t.prefix for t in towers if t.prefix != ROOT]
    if not scoped:
        return "known name"
    template = re.sub(r"\d+", "%d", scoped[0].rstrip("/"))
    return f"known name {template}" + (" + (root)" if len(scoped) < len(towers) else "")


def tower_of(name: str, towers: Sequence[Tower]) -> Tower | None:
    """The tower whose prefix is the longest one `name` starts with (the root takes the rest)."""
    best = None
    for tower in towers:
        if name.startswith(tower.prefix) and (best is None or len(tower.prefix) > len(best.prefix)):
            best = tower
    return best
