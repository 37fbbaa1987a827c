"""What names alone say about towers: scope families that differ only in an integer index, and
which batch norm of one tower is which of another's.

A family is a set of sibling scopes (same parent scope) whose names become the same template once
one integer run is taken out: `gpu_0`, `gpu_1` → `gpu_%d`; `task_0_tower_1` → `task_0_tower_%d` (and
`task_%d_tower_1`); `t0_gpu` → `t%d_gpu`. Numbering may start at 1. A script that builds its towers
in a loop without a scope of its own gets TensorFlow's unique names, `net`, `net_1`, `net_2` (a
Keras model called once per tower: `model`, `model_1`): the unnumbered sibling is member 0, and
since a Siamese network that calls one model on two inputs is named the same way, such members are
towers only on distinct devices. Without such a sibling, member 0 is the parent scope itself (a
first replica built unscoped, the next ones under `tower_1`, `tower_2`). Whether a family is
towers is decided by the graph (graphsync/towers/structure.py); names only propose.

Layers pair across towers by their name relative to the tower. Frameworks let those names drift:
a Keras model built once per tower uniquifies its layers (`sequential/batch_normalization` in one
tower, `sequential_1/batch_normalization_1` in the next). The drift key drops the `_<n>` suffixes
TensorFlow and Keras add to make names unique; layers with the same drift key pair by creation
order when their exact names differ between towers.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter

DIGITS = re.compile(r"\d+")
_UNIQUIFIED = re.compile(r"_\d+$")
_UNIQUE_SUFFIX = "_%d"      # the suffix TensorFlow and Keras add to a name already taken


@dataclasses.dataclass(frozen=True)
class Family:
    """Sibling scopes `parent + template % index`: index → prefix (ending in '/'); index 0 is
    the unnumbered sibling (`net/` beside `net_1/`) or the parent scope itself when the numbers
    start at 1 (module docstring)."""

    parent: str              # '' or ending in '/'
    template: str            # the scope name with '%d' for the index
    members: tuple           # ((index, prefix), ...) in index order
    unnumbered: bool = False  # member 0 is the unnumbered sibling: only devices tell such towers apart

    @property
    def prefixes(self) -> list[str]:
        return [prefix for _, prefix in self.members]

    def option(self) -> str:
        """The towers= value that picks this family: a regular expression, or the list of
        prefixes when member 0 is unnumbered."""
        head, _, tail = self.template.partition("%d")
        numbered = re.escape(self.parent) + re.escape(head) + r"\d+" + re.escape(tail) + "/"
        if not all(re.fullmatch(numbered, p) for p in self.prefixes):
            return repr(self.prefixes)
        return repr(numbered)

    @property
    def label(self) -> str:
        return self.parent + self.template


def families(op_names) -> list[Family]:
    """Every family of two or more sibling scopes among the scopes of `op_names`, and every
    family numbered from 1, whose member 0 is its unnumbered sibling or else its parent (module
    docstring)."""
    groups: dict[tuple, dict[int, str]] = {}
    scopes = set()
    for name in op_names:
        parts = name.split("/")
        parent = ""
        for component in parts[:-1]:
            for found in DIGITS.finditer(component):
                template = component[:found.start()] + "%d" + component[found.end():]
                members = groups.setdefault((parent, template), {})
                members.setdefault(int(found.group()), parent + component + "/")
            parent += component + "/"
            scopes.add(parent)
    result = []
    for (parent, template), members in groups.items():
        if len(members) < 2 and min(members) != 1:
            continue
        unnumbered = False
        if 0 not in members and min(members) == 1:
            sibling = parent + template[:-len(_UNIQUE_SUFFIX)] + "/"
            unnumbered = template.endswith(_UNIQUE_SUFFIX) and sibling in scopes
            members = {0: sibling if unnumbered else parent, **members}
        result.append(Family(parent, template, tuple(sorted(members.items())), unnumbered))
    return result


def drift_key(relative_name: str) -> str:
    """The name relative to its tower without the uniquifying `_<n>` suffix of any scope."""
    parts = relative_name.split("/")
    return "/".join([_UNIQUIFIED.sub("", p) for p in parts[:-1]] + [_UNIQUIFIED.sub("", parts[-1])])


def pair_by_name(per_tower: dict) -> dict:
    """{layer name: {tower: item}} from {tower: [(relative name, creation order, item), ...]}.

    Exact relative names pair as they are. Within one drift key, when the towers' exact names
    differ but every tower present holds as many layers, they pair in creation order, named as
    in the first tower. Anything else keeps its exact name (a layer some tower lacks)."""
    by_drift: dict[str, dict] = {}
    for tower, entries in per_tower.items():
        for relative, order, item in entries:
            by_drift.setdefault(drift_key(relative), {}).setdefault(tower, []).append((order, relative, item))
    layers: dict[str, dict] = {}
    for towers in by_drift.values():
        lists = [sorted(entries, key=lambda e: e[0]) for entries in towers.values()]
        same_names = len({tuple(sorted(r for _, r, _ in entries)) for entries in lists}) == 1
        if not same_names and len(towers) > 1 and len({len(entries) for entries in lists}) == 1:
            for rank in range(len(lists[0])):
                name = lists[0][rank][1]
                for tower, entries in zip(towers, lists):
                    layers.setdefault(name, {})[tower] = entries[rank][2]
            continue
        for tower, entries in zip(towers, lists):
            for _, relative, item in entries:
                layers.setdefault(relative, {})[tower] = item
    return layers


def layer_counts(relative_names_with_kind) -> Counter:
    """The multiset of (drift key, kind) a tower holds: what two towers must share."""
    return Counter((drift_key(r), kind) for r, kind in relative_names_with_kind)
