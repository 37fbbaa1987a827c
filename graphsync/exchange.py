"""How synchronized statistics cross devices: gathered on one device, or all-reduced.

Both strategies offer the same two operations to the splice, per sync group of towers:

    moments(uploads)  every tower's (n, m, M2) → every tower's (N, μ, σ²)   one sync point forward
    sums(values)      every tower's [a, b, …]  → every tower's [Σa, Σb, …]  one sync point backward

`Gather` (the default) sends the statistics to one chosen device, merges them there (Chan et al.,
float64) and sends the result back: the seed's hand-written layout, minus the activations.

`AllReduce` has no central device: each tower packs its statistics into one vector and runs one
`CollectiveReduceV2` per layer and direction. The forward packs float64 [n, n·m, M2 + n·m²]; in
float64 the E[x²]-style cancellation costs ~1e-16·(μ/σ)² relative, below the float32 statistics'
own rounding up to |μ|/σ ≈ 1e4. Collectives span processes too (between-graph replication).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import warnings
import weakref

import tensorflow as tf

from graphsync import stats
from graphsync.errors import GraphsyncError, GraphsyncWarning
from graphsync.tf_private import FastOps, pristine_scope

AGGREGATION_SCOPE = "graphsync"
UPLOAD_GRADIENT = "GraphsyncStatisticsUpload"
ALLREDUCE_GRADIENT = "GraphsyncAllReduce"
COLLECTIVE_TYPES = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveGather", "CollectiveGatherV2",
                    "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
                    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveReduceScatterV2")


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Between-graph replication: this graph is task `index` of `tasks` identical worker graphs,
    whose towers synchronize through cross-process collectives (needs strategy="allreduce")."""

    tasks: int
    index: int
    timeout: float = 0.0   # seconds each cross-process collective waits for its peers; 0: forever

    def __post_init__(self):
        if not 0 <= self.index < self.tasks:
            raise GraphsyncError(f"process group index {self.index} is outside 0..{self.tasks - 1}")
        if self.timeout < 0:
            raise GraphsyncError(f"process group timeout {self.timeout} is negative (0 waits forever)")


@dataclasses.dataclass
class Synchronized:
    """One tower's view of the global statistics of its sync group, shaped like its uploads."""

    count: tf.Tensor      # n_t, float64
    total: tf.Tensor      # N, float64
    mean: tf.Tensor       # μ
    variance: tf.Tensor   # σ² (biased)
    bessel: tf.Tensor     # σ²·N/(N−1), what a fused op reports as its batch variance


# ---------------------------------------------------------------------------------------- gather

_differentiations = collections.Counter()
_warned_graphs = set()


@tf.RegisterGradient(UPLOAD_GRADIENT)
def _upload_gradient(op, grad):
    """Identity's gradient, counting how many tf.gradients calls pass through a tower's upload.

    One call over the sum of the tower losses passes once per layer. A second pass means one
    tf.gradients per tower after the forward was rewritten: still exact, but each tower's backward
    then runs through every tower (work grows with towers²).
    """
    key = (id(op.graph), op.name)
    _differentiations[key] += 1
    if _differentiations[key] == 2 and id(op.graph) not in _warned_graphs:
        _warned_graphs.add(id(op.graph))
        warnings.warn(
            f"graphsync: {op.name} (and likely every synchronized layer) is differentiated by more than "
            "one tf.gradients call; after a rewrite each per-tower tf.gradients runs through every tower "
            "(work grows with towers squared). Results stay exact. Remedy: call graphsync.rewrite_towers() "
            "after building the gradients, differentiate the sum of the tower losses once, or use "
            "strategy='allreduce'.", GraphsyncWarning, stacklevel=2)
    return grad


class Gather:
    """Statistics of each sync group merged on one device."""

    name = "gather"

    def __init__(self, graph: tf.Graph, device: str, groups):
        self.device, self.groups = device, groups
        self.ops = FastOps(graph)

    def _scope(self, layer, part, g):
        suffix = f"_group{g}" if len(self.groups) > 1 else ""
        return f"{AGGREGATION_SCOPE}/{layer.name}/{part}{suffix}"

    def moments(self, graph, layer, sites, uploads, spread="m2") -> list[Synchronized]:
        out = [None] * len(sites)
        if not layer.has_gradients:  # count later tf.gradients calls, to warn about per-tower ones
            marked = []
            for site, (n, mean, m2) in zip(sites, uploads):
                with pristine_scope(graph, site.device, site.op.name + "_sync"), \
                        graph.gradient_override_map({"Identity": UPLOAD_GRADIENT}):
                    marked.append((n, tf.identity(mean, name="upload_mean"), tf.identity(m2, name="upload_m2")))
            uploads = marked
        for g, members in enumerate(self.groups):
            with pristine_scope(graph, self.device, self._scope(layer, "forward", g)):
                counts, total, mean, variance, bessel = stats.merge_moments(
                    self.ops, *zip(*[uploads[i] for i in members]), spread=spread)
            for i, count in zip(members, counts):
                out[i] = Synchronized(count, total, mean, variance, bessel)
        return out

    def sums(self, graph, layer, sites, values, tag, finish=None, statistics=None) -> list[list]:
        """Cross-tower sums of each tower's values, passed through `finish(sums, statistics)` on
        the aggregation device (once per group) when given."""
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            with pristine_scope(graph, self.device, self._scope(layer, tag, g)):
                totals = [self.ops.add_n([values[i][j] for i in members]) for j in range(len(values[members[0]]))]
                if finish is not None:
                    totals = finish(totals, statistics[members[0]], self.ops)
            for i in members:
                out[i] = totals
        return out


# ------------------------------------------------------------------------------------- all-reduce

class CollectiveKeys:
    """Group and instance keys no collective in the graph uses yet, handed out in a deterministic
    order, so identical graphs in several processes agree on them."""

    def __init__(self, graph: tf.Graph):
        used = [0]
        for op in graph.get_operations():
            if op.type in COLLECTIVE_TYPES:
                for name in ("group_key", "instance_key"):
                    value = _key_of(op, name)
                    used.append(value if value is not None else 0)
        self._next = itertools.count(max(max(used) + 1, 1 << 20))

    def new(self) -> int:
        return next(self._next)


def _key_of(op, name):
    """A collective's group or instance key: an attr (v1 ops) or a constant input (V2 ops)."""
    if name in op.node_def.attr:
        return int(op.get_attr(name))
    inputs = [arg.name for arg in op.op_def.input_arg]
    value = tf.get_static_value(op.inputs[inputs.index(name)]) if name in inputs else None
    return int(value) if value is not None else None


_allreduce_keys = weakref.WeakKeyDictionary()   # graph → CollectiveKeys (for gradients built later)
_backward_keys = weakref.WeakKeyDictionary()    # graph → {(forward instance key, k): instance key}
_times_differentiated = weakref.WeakKeyDictionary()


def all_reduce(x: tf.Tensor, group_size: int, group_key: int, instance_key: int, name=None,
               timeout: float = 0.0) -> tf.Tensor:
    """Sum of x over the group, with a gradient that all-reduces the incoming gradient; fails with
    DeadlineExceeded after `timeout` seconds without all peers (0: waits forever)."""
    with x.graph.gradient_override_map({"CollectiveReduceV2": ALLREDUCE_GRADIENT}):
        return tf.raw_ops.CollectiveReduceV2(
            input=x, group_size=tf.constant(group_size), group_key=tf.constant(group_key),
            instance_key=tf.constant(instance_key), ordering_token=[], merge_op="Add", final_op="Id",
            timeout_seconds=float(timeout), name=name)


@tf.RegisterGradient(ALLREDUCE_GRADIENT)
def _all_reduce_gradient(op, grad):
    """The gradient of a sum over towers is the sum of the towers' gradients: another all-reduce.

    Each tower's k-th differentiation of the same collective gets the same new instance key, so
    the towers' gradient collectives pair up even when each tower calls tf.gradients itself.
    """
    graph = op.graph
    forward_key = int(tf.get_static_value(op.inputs[3]))
    seen = _times_differentiated.setdefault(graph, collections.Counter())
    k = seen[op.name]
    seen[op.name] += 1
    keys = _backward_keys.setdefault(graph, {})
    if (forward_key, k) not in keys:
        allocator = _allreduce_keys.get(graph) or _allreduce_keys.setdefault(graph, CollectiveKeys(graph))
        keys[(forward_key, k)] = allocator.new()
    group_size, group_key = (int(tf.get_static_value(t)) for t in op.inputs[1:3])
    return [all_reduce(grad, group_size, group_key, keys[(forward_key, k)], timeout=op.get_attr("timeout_seconds"))] \
        + [None] * (len(op.inputs) - 1)


class AllReduce:
    """Statistics summed by one collective per layer and direction on the towers' own devices."""

    name = "allreduce"

    def __init__(self, graph: tf.Graph, groups, process_group: ProcessGroup | None = None, fingerprint: int = 0):
        self.groups, self.process_group = groups, process_group
        self.keys = _allreduce_keys.setdefault(graph, CollectiveKeys(graph))
        self.ops = FastOps(graph)
        self.group_keys = [self.keys.new() for _ in groups]
        if process_group is not None:   # workers whose layers differ never join the same groups
            self.group_keys = [cross_process_group_key(fingerprint, g) for g in range(len(groups))]
        self.scale = process_group.tasks if process_group else 1
        self.timeout = process_group.timeout if process_group else 0.0

    def _reduce(self, graph, sites, packed, name):
        """All-reduces each tower's packed vector; outputs wait for every local collective of the
        group, so fetching one tower's result never leaves another tower's collective unrun."""
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            instance = self.keys.new()
            reduced = {}
            for i in members:
                with pristine_scope(graph, sites[i].device, f"{sites[i].op.name}_sync/{name}"):
                    reduced[i] = all_reduce(packed[i], len(members) * self.scale, self.group_keys[g], instance,
                                            timeout=self.timeout)
            for i in members:
                with pristine_scope(graph, sites[i].device, f"{sites[i].op.name}_sync/{name}"), \
                        graph.control_dependencies([reduced[j].op for j in members if j != i]):
                    out[i] = tf.identity(reduced[i], name="all_reduced")
        return out

    def moments(self, graph, layer, sites, uploads, spread="m2") -> list[Synchronized]:
        packed, counts = [], []
        for site, (size, mean, m2) in zip(sites, uploads):
            with pristine_scope(graph, site.device, site.op.name + "_sync/pack"):
                n = tf.cast(size, tf.float64) / tf.cast(tf.size(mean), tf.float64)
                mean64, m2_64 = tf.cast(mean, tf.float64), tf.cast(m2, tf.float64)
                if spread == "bessel":
                    m2_64 = m2_64 * tf.maximum(n - 1.0, 1.0)
                weighted = n * mean64
                packed.append(tf.concat([tf.reshape(n, [1]), tf.reshape(weighted, [-1]),
                                         tf.reshape(m2_64 + weighted * mean64, [-1])], 0))
                counts.append(n)
        reduced = self._reduce(graph, sites, packed, "forward")
        out = []
        for site, (_, mean, _), vector, n in zip(sites, uploads, reduced, counts):
            with pristine_scope(graph, site.device, site.op.name + "_sync/unpack"):
                total = vector[0]
                channels = (tf.size(vector) - 1) // 2
                shape = _shape_of(mean)
                global_mean = tf.math.divide_no_nan(tf.reshape(vector[1:1 + channels], shape), total)
                second = tf.math.divide_no_nan(tf.reshape(vector[1 + channels:], shape), total)
                variance = tf.maximum(second - tf.square(global_mean), 0.0)
                bessel = variance * total / tf.maximum(total - 1.0, 1.0)
                out.append(Synchronized(n, total, tf.cast(global_mean, mean.dtype, name="mean"),
                                        tf.cast(variance, mean.dtype, name="variance"),
                                        tf.cast(bessel, mean.dtype, name="bessel_variance")))
        return out

    def sums(self, graph, layer, sites, values, tag, finish=None, statistics=None) -> list[list]:
        """Cross-tower sums of each tower's values, passed through `finish(sums, statistics)` on
        each tower's device when given."""
        packed, shapes = [], []
        for site, vals in zip(sites, values):
            with pristine_scope(graph, site.device, f"{site.op.name}_sync/pack_{tag}"):
                dtype = vals[0].dtype
                packed.append(tf.concat([tf.reshape(tf.cast(v, dtype), [-1]) for v in vals], 0))
                shapes.append([(_shape_of(v), tf.size(v), v.dtype) for v in vals])
        reduced = self._reduce(graph, sites, packed, tag)
        out = []
        for site, vector, parts in zip(sites, reduced, shapes):
            with pristine_scope(graph, site.device, f"{site.op.name}_sync/unpack_{tag}"):
                pieces = tf.split(vector, [size for _, size, _ in parts])
                totals = [tf.cast(tf.reshape(p, shape), dt) for p, (shape, _, dt) in zip(pieces, parts)]
                out.append(finish(totals, statistics[len(out)], self.ops) if finish is not None else totals)
        return out


def cross_process_group_key(fingerprint: int, group: int) -> int:
    """The group key of sync group `group` between worker processes: derived from the fingerprint
    of the synchronized layers, so workers that built different layers (different scripts) wait
    for each other in vain (and time out) instead of averaging unrelated statistics. Keys lie in
    [2^29, 2^30): clear of CollectiveKeys' counter and of int32 overflow."""
    return (1 << 29) + (fingerprint + group) % (1 << 28)


def _shape_of(t: tf.Tensor):
    """The static shape when fully known (keeps static shapes downstream), else the dynamic one."""
    return t.shape.as_list() if t.shape.is_fully_defined() else tf.shape(t)


def make_exchange(graph, strategy: str, device: str, groups, process_group=None, fingerprint: int = 0):
    if strategy == "gather":
        if process_group is not None:
            raise GraphsyncError("between-graph replication (process_group=) needs strategy='allreduce'")
        return Gather(graph, device, groups)
    if strategy == "allreduce":
        return AllReduce(graph, groups, process_group, fingerprint)
    raise GraphsyncError(f"unknown strategy {strategy!r}: use 'gather' or 'allreduce'")
