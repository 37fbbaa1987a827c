"""Towers found by the graph's structure, whatever their scopes are called.

A family of sibling scopes whose names differ only in an integer index (graphsync/towers/names.py)
is towers when the graph says they are replicas of one model trained data-parallel:

    same layers   every member holds the same batch norms under the same relative names (drift
                  allowed); a member missing some of them makes the family qualify only partly
    parallel      no member's batch norm depends, in the forward pass, on a batch norm outside it
                  (sequential blocks feed each other; a GAN's discriminator reads the generator)
    replicas      for `net/`, `net_1/` (TensorFlow's unique names, no index of the script's own),
                  each trained member's batch norms on devices no other one uses (a Siamese network
                  calls its model on two inputs in one place, a tower loop on one device each), and
                  fused ones on the same scale and offset variables (two streams built alike on two
                  devices keep weights of their own)
    own examples  no two members read the same data tensor (branches of one network share their
                  input); slicing a shared batch inside each member is reading its own part
    trained       when some members are differentiated, those that are not are evaluation towers:
                  they are left alone, and are not counted

Families inside a tower whose members together hold all of that tower's batch norms are nested
replicas (`gpu_0/replica_0`): their members are the towers. Several families that qualify, or one
that qualifies partly, is a GraphsyncError naming them and the towers= option that picks one.

Cost: one backward walk per member over the forward ops that feed its batch norms, and memoized
walks from its entry points; names only are looked at for every other family.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter

import tensorflow as tf

from graphsync import match
from graphsync.graph import shapes
from graphsync.match.layer_form import LayerForm
from graphsync.towers import names as tower_names
from graphsync.errors import GraphsyncError
from graphsync.graph.tf_private import is_ref
from graphsync.towers.scopes import Tower
from graphsync.graph.backward import is_backward

SLICING_TYPES = ("StridedSlice", "Slice", "Split", "SplitV", "Unpack", "GatherV2", "Gather", "ResourceGather")
PARAMETERS = ("VariableV2", "Variable", "VarHandleOp", "Const")
_STATEFUL_READS = ("ReadVariableOp",)
_HANDLE_DTYPES = (tf.resource, tf.variant, tf.string)


@dataclasses.dataclass
class Found:
    """Towers found by structure: how (the family's template), and evaluation towers left out."""

    towers: list[Tower]
    how: str
    left_out: list = dataclasses.field(default_factory=list)   # (prefix, reason)


@dataclasses.dataclass
class _Verdict:
    family: tower_names.Family
    members: list            # [(index, prefix)] the trained members
    complete: bool
    left_out: list
    missing: str = ""        # for a partial family: what is missing where
    complete_members: list = dataclasses.field(default_factory=list)


def discover(graph: tf.Graph, live: list) -> Found | None:
    """The towers among the live batch-norm candidates, by structure; None when there are none.
    Raises GraphsyncError when several families qualify or one qualifies only partly."""
    analysis = _Analysis(live)
    families = tower_names.families(analysis.names)
    covered = {f: len(analysis.ops_of(f)) for f in families}
    accepted: list[_Verdict] = []
    for family in sorted(families, key=lambda f: (-covered[f], f.label)):
        if any(_inside(family, v) for v in accepted):
            continue
        verdict = analysis.judge(family)
        if verdict is not None:
            accepted.append(verdict)
    if not accepted:
        return None
    if len(accepted) > 1:
        raise GraphsyncError(
            "several families of scopes look like towers: "
            + "; ".join(f"{v.family.label} ({', '.join(p or '(root)' for _, p in v.members)}) with "
                        f"towers={v.family.option()}" for v in accepted)
            + ": pick one with that towers= option")
    verdict = accepted[0]
    if not verdict.complete:
        raise GraphsyncError(
            f"the scopes {verdict.family.label} ({', '.join(p or '(root)' for _, p in verdict.members)}) look "
            f"like towers but qualify only partly: {verdict.missing}; pick the towers with "
            f"towers={_option(verdict.complete_members)} (the complete ones), or make every tower build the same layers")
    prefixes, how = _nested(analysis, families, verdict)
    towers = [Tower(i, p) for i, p in enumerate(prefixes)]
    return Found(towers, f"structure: {how}", verdict.left_out)


def parallel_scopes(graph: tf.Graph, live: list) -> str | None:
    """A one-line description of sibling scopes that hold the same batch norms in parallel, each on
    its own examples, but whose names differ by more than an index (not taken as towers); None."""
    analysis = _Analysis(live)
    children: dict[str, dict[str, list]] = {}
    for name in analysis.names:
        parts = name.split("/")
        for depth in range(len(parts) - 1):
            parent = "/".join(parts[:depth]) + "/" if depth else ""
            children.setdefault(parent, {}).setdefault(parent + parts[depth] + "/", []).append(name)
    for parent, scopes in children.items():
        by_layers: dict = {}
        for prefix, names in scopes.items():
            key = frozenset(tower_names.layer_counts(
                (n[len(prefix):], analysis.kind[n]) for n in names).items())
            by_layers.setdefault(key, []).append(prefix)
        for prefixes in by_layers.values():
            if len(prefixes) < 2:
                continue
            family = tower_names.Family(parent, "", tuple(enumerate(sorted(prefixes))))
            verdict = analysis.judge(family, need_same_layers=True)
            if verdict is not None and verdict.complete:
                return (f"the scopes {', '.join(prefixes)} hold the same batch norms in parallel, each on its "
                        f"own examples, but their names differ by more than an index; if they are towers, "
                        f"pass towers={_option(sorted(prefixes))}")
    return None


def _option(prefixes) -> str:
    """The towers= value naming exactly these prefixes: a regular expression, or a list when
    the root is one of them."""
    if "" in prefixes:
        return repr(list(prefixes))
    return repr("|".join(re.escape(p) for p in prefixes))


def _inside(family, verdict) -> bool:
    return any(p and family.parent.startswith(p) for _, p in verdict.members)


def _nested(analysis, families, verdict) -> tuple[list[str], str]:
    """The towers of an accepted family: its members, or the members of the families nested in
    each of them that hold all of that member's batch norms (recursively)."""
    inner_verdicts = []
    for _, prefix in verdict.members:
        if not prefix:
            break
        whole = set(analysis.under(prefix))
        inner = [f for f in families if f.parent.startswith(prefix) and f is not verdict.family
                 and f.parent not in f.prefixes and set(analysis.ops_of(f)) == whole]
        judged = [v for v in (analysis.judge(f) for f in inner) if v is not None and v.complete
                  and set(analysis.ops_of_members(v.members)) == whole]
        if len(judged) != 1:
            break
        inner_verdicts.append(judged[0])
    if not inner_verdicts or len(inner_verdicts) != len(verdict.members) or \
            len({len(v.members) for v in inner_verdicts}) != 1:
        return _extended(analysis, verdict.members), verdict.family.label
    prefixes, how = [], ""
    for inner in inner_verdicts:
        more, how = _nested(analysis, families, inner)
        prefixes += more
    return prefixes, verdict.family.label + "/" + how[len(inner_verdicts[0].family.parent):]


def _extended(analysis, members) -> list[str]:
    """Member prefixes, each extended by the one scope all its batch norms sit in when that scope
    carries the member's index too (tf_cnn_benchmarks' `tower_0/v0/`), as the known names do."""
    prefixes = [p for _, p in members]
    extended, templates = [], set()
    for index, prefix in members:
        relatives = [n[len(prefix):] for n in analysis.under(prefix)]
        scopes = {r.split("/")[0] for r in relatives if "/" in r}
        if not prefix or len(scopes) != 1 or any("/" not in r for r in relatives):
            return prefixes
        scope = scopes.pop()
        runs = [m for m in tower_names.DIGITS.finditer(scope) if int(m.group()) == index]
        if len(runs) != 1:
            return prefixes
        templates.add(scope[:runs[0].start()] + "%d" + scope[runs[0].end():])
        extended.append(prefix + scope + "/")
    return extended if len(templates) == 1 else prefixes


class _Analysis:
    """The live batch norms of one graph and memoized walks over their forward ancestors."""

    def __init__(self, live):
        self.op = {c.name: c.op for c in live}
        self.names = sorted(self.op)
        self.kind = {c.name: _signature(c) for c in live}
        self.candidate = {c.name: c for c in live}
        self._bn_ops = set(self.op.values())
        self._no_bn_upstream: set = set()
        self._parameter: dict = {}
        self._judged: dict = {}
        self._under = None

    def under(self, prefix: str) -> list[str]:
        """The batch norms whose names start with the scope `prefix` ('' or ending in '/')."""
        if self._under is None:
            self._under = {"": self.names}
            for name in self.names:
                end = name.find("/")
                while end != -1:
                    self._under.setdefault(name[:end + 1], []).append(name)
                    end = name.find("/", end + 1)
        return self._under.get(prefix, [])

    def ops_of(self, family) -> list[str]:
        return self.ops_of_members(family.members)

    def ops_of_members(self, members) -> list[str]:
        return [n for _, p in members if p for n in self.under(p)]

    # -- the verdict on one family --------------------------------------------------------

    def judge(self, family, need_same_layers=False) -> _Verdict | None:
        key = (family, need_same_layers)
        if key not in self._judged:
            self._judged[key] = self._judge(family, need_same_layers)
        return self._judged[key]

    def _judge(self, family, need_same_layers) -> _Verdict | None:
        scoped = [p for _, p in family.members if p != family.parent]
        members = family.members
        if len(scoped) == len(members):
            members = list(zip([i for i, _ in members], _extended(self, members)))
        per_member = {}
        for index, prefix in members:
            if prefix == family.parent and len(scoped) < len(family.members):
                names = [n for n in self.under(prefix) if not any(n.startswith(p) for p in scoped)]
            else:
                names = self.under(prefix)
            per_member[index, prefix] = names
        counts = {m: tower_names.layer_counts((n[len(m[1]):], self.kind[n]) for n in names)
                  for m, names in per_member.items()}
        if len(scoped) < len(family.members):   # an unscoped member 0 keeps the counterparts only
            root = next(m for m in per_member if m[1] == family.parent)
            numbered = Counter()
            for m, c in counts.items():
                if m != root:
                    numbered |= c
            per_member[root] = [n for n in per_member[root]
                                if (tower_names.drift_key(n[len(root[1]):]), self.kind[n]) in numbered]
            counts[root] = counts[root] & numbered
            if not per_member[root]:
                return None
        common = None
        for c in counts.values():
            common = c if common is None else common & c
        largest = max(sum(c.values()) for c in counts.values())
        if not common or 2 * sum(common.values()) < largest:
            return None
        if need_same_layers and any(c != common for c in counts.values()):
            return None
        if family.unnumbered and len(set().union(*map(self._devices, per_member.values()))) < 2:
            return None      # one place: not towers whichever members train (the walks below cost more)
        if not self._parallel(family, per_member):
            return None
        members = list(per_member)
        trained = [m for m in members if any(self._differentiated(n) for n in per_member[m])]
        left_out = []
        if trained and len(trained) < len(members):
            left_out = [(m[1], "not differentiated: an evaluation tower, left alone")
                        for m in members if m not in trained]
            members = trained
        if len(members) < 2 or family.unnumbered and not self._replicas([per_member[m] for m in members]):
            return None
        union = Counter()
        for m in members:
            union |= counts[m]
        lacking = [(m, union - counts[m]) for m in members if union - counts[m]]
        if not lacking:
            return _Verdict(family, members, True, left_out)
        (index, prefix), what = lacking[0]
        more = f" (and from {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        missing = f"layer {next(iter(what))[0]!r} is missing from {prefix or '(root)'}{more}"
        complete = [p for m, p in members if not union - counts[m, p]]
        return _Verdict(family, members, False, left_out, missing, complete)

    def _replicas(self, members_names) -> bool:
        """Whether members named only by TensorFlow's unique names are replicas: each member's
        batch norms placed, on devices no other member's use, and (fused ones) scaling and
        shifting by the same variables (two streams built alike keep weights of their own)."""
        taken: set = set()
        weights = []
        for names in members_names:
            devices = self._devices(names)
            if not all(devices) or devices & taken:
                return False
            taken |= devices
            weights.append({v for n in names for v in _weights(self.op[n])} if all(
                self.candidate[n].form.fused_kernel for n in names) else None)
        return None in weights or all(w == weights[0] for w in weights)

    def _devices(self, names) -> set:
        return {tf.DeviceSpec.from_string(self.op[n].device).to_string() for n in names}

    def _parallel(self, family, per_member) -> bool:
        prefixes = [p for _, p in family.members]
        seen_examples: dict = {}
        for (index, prefix), names in per_member.items():
            others = [p for p in prefixes if p != prefix and p.startswith(prefix)]
            inside = (lambda op, prefix=prefix, others=others:
                      op.name.startswith(prefix) and not any(op.name.startswith(o) for o in others))
            for tensor, entry, reader in self._entries([self.op[n] for n in names], inside):
                if self._reaches_bn(entry):
                    return False
                if tensor is not None and reader.type not in SLICING_TYPES and self._is_example(tensor):
                    if seen_examples.setdefault(tensor.ref(), prefix) != prefix:
                        return False
        return True

    # -- walks ------------------------------------------------------------------------------

    @staticmethod
    def _entries(start, inside):
        """(tensor or None for a control edge, op outside, reader inside) for every edge entering
        the region `inside` on the way back from the ops `start`."""
        seen, stack, found = set(start), list(start), []
        while stack:
            op = stack.pop()
            edges = [(tensor, tensor.op) for tensor in op.inputs] + [(None, source) for source in op.control_inputs]
            for tensor, source in edges:
                if source in seen:
                    continue
                if inside(source):
                    seen.add(source)
                    stack.append(source)
                else:
                    found.append((tensor, source, op))
        return found

    def _reaches_bn(self, op) -> bool:
        """Whether `op` is, or depends in the forward pass on, a live batch norm."""
        if op in self._no_bn_upstream:
            return False
        seen, stack = {op}, [op]
        while stack:
            current = stack.pop()
            if current in self._bn_ops:
                return True
            for source in [t.op for t in current.inputs] + list(current.control_inputs):
                if source not in seen and source not in self._no_bn_upstream:
                    seen.add(source)
                    stack.append(source)
        self._no_bn_upstream |= seen
        return False

    def _is_example(self, tensor) -> bool:
        """Data with a batch dimension: not a handle, not a scalar, not computed from variables
        and constants only."""
        if tensor.dtype in _HANDLE_DTYPES or is_ref(tensor) or tensor.shape.rank == 0:
            return False
        return not self._is_parameter(tensor.op)

    def _is_parameter(self, op, depth=0) -> bool:
        if op in self._parameter:
            return self._parameter[op]
        if op.type in PARAMETERS:
            result = True
        elif not op.inputs or depth > 50 or (op.op_def.is_stateful and op.type not in _STATEFUL_READS):
            result = False
        else:
            result = all(self._is_parameter(t.op, depth + 1) for t in op.inputs)
        self._parameter[op] = result
        return result

    def _differentiated(self, name: str) -> bool:
        cand = self.candidate[name]
        if cand.form.fused_kernel:
            return bool(match.fused_gradient_ops(cand.op))
        readers = [c for t in cand.op.inputs[:1] for c in t.consumers()]
        return any(is_backward(c) for c in readers)


def _weights(op: tf.Operation) -> set:
    """The variables a fused batch norm's scale and offset are read from (through reads,
    identities and casts)."""
    found = set()
    for tensor in op.inputs[1:3]:
        source = tensor.op
        for _ in range(4):
            if source.type in ("VariableV2", "Variable", "VarHandleOp"):
                found.add(source.name)
                break
            if source.type not in ("ReadVariableOp", "Identity", "Cast", "Enter") or not source.inputs:
                break
            source = source.inputs[0].op
    return found


def _signature(cand) -> tuple:
    """What paired layers must share for names to pair them: fused and the channels, else (a
    moments or conditional layer) moments and the statistics' shape."""
    op = cand.op
    if cand.form.fused_kernel:
        channels = shapes.dim(op.inputs[1].shape, 0) if op.inputs[1].shape.rank == 1 else None
        return (LayerForm.FUSED.value, channels)
    return (LayerForm.MOMENTS.value, shapes.text(op.outputs[0].shape[1:]))
