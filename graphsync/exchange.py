"""How synchronized statistics cross devices: gathered on one device, or all-reduced.

Both strategies offer the same two operations to the splice, per sync group of towers:

    moments(uploads)  every tower's (n, m, spread) → every tower's (N, μ, σ²)   one sync point forward
    sums(values)      every tower's [a, b, …]  → every tower's [Σa, Σb, …]     one sync point backward

`Gather` (the default) sends the statistics to one chosen device, merges them there (Chan et al.,
float64) and sends the result back: the seed's hand-written layout, minus the activations.

`AllReduce` has no central device: each tower packs its statistics into one vector and runs one
`CollectiveReduceV2` per layer and direction. The forward packs float64 [n, n·m, M2 + n·m²] (the
count travels in the vector); in float64 the E[x²]-style cancellation costs ~1e-16·(μ/σ)²
relative, below the float32 statistics' own rounding up to |μ|/σ ≈ 1e4. Packing and unpacking
are two small tf.functions traced once per process and called once per tower (one op each in
the graph; TensorFlow inlines them before running, so a step runs the same kernels as if they
were spelled out). The backward stacks the towers' [a, b] and reduces them in their own dtype.
Collectives span processes too (between-graph replication).

Rewritten before its gradients, a layer hands each tower its statistics through a *view*: one
`IdentityN` per tower (μ, σ², N, and the tower's own size, m, spread as pass-through inputs)
whose gradient sums the towers' gradients at run time — gather: one `AddN` on the aggregation
device whose inputs each tower's tf.gradients call fills in; all-reduce: one collective — and
returns the gradient of the tower's own (m, spread). A fused layer's normalization carries its
tower's whole synchronized backward instead and exchanges its (a, b) the same way
(`summed_gradient`, graphsync/splice.py). The merge itself is never differentiated, so each
tower's tf.gradients stays inside its tower plus one exchange per layer: with one call per tower
or one over the summed losses, the ops added per tower do not grow with the number of towers.
The gradient each tower receives is that of the sum of all towers' losses (as after a rewrite of
built gradients), so every tower's loss must be differentiated; a gathered sum that some tower
never joined fails at run time with a message that says so.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync import stats
from graphsync.errors import GraphsyncError
from graphsync.tf_private import FastOps, create_op, pristine_scope, update_input

AGGREGATION_SCOPE = "graphsync"
UPLOAD_GRADIENT = "GraphsyncStatisticsUpload"
VIEW_GRADIENT = "GraphsyncStatisticsView"
ALLREDUCE_GRADIENT = "GraphsyncAllReduce"
COLLECTIVE_TYPES = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveGather", "CollectiveGatherV2",
                    "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
                    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveReduceScatterV2")
MISSING_TOWER = ("graphsync: a synchronized layer's gradient was built for only some towers of its sync "
                 "group; differentiate every tower's loss (one tf.gradients per tower, or one over their sum)")


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


# ------------------------------------------------------------------------------ statistics views

_times_differentiated = weakref.WeakKeyDictionary()   # graph → Counter(op name → calls so far)
_gathered_gradients = weakref.WeakKeyDictionary()     # graph → {(merged μ, k): AddN being filled}


def _view(graph, site, s: Synchronized, upload, spread: str, factor=None, **keys) -> Synchronized:
    """Tower `site`'s statistics through an IdentityN whose gradient is `_view_gradient`; `keys`
    (ints) say how its gradient finds the other towers: members and member (gather), or members,
    group_key, instance_key and timeout_ms (all-reduce). With `factor` (N/(N−1), a scalar) the tower's
    Bessel-corrected variance is σ²·factor, computed on the tower only when something reads it,
    its gradient reaching σ² through the Mul."""
    size, local_mean, local_spread, *_ = upload   # fused uploads may carry more (stats.merge_moments)
    inputs = [s.mean, s.variance, s.total, size, local_mean, local_spread]   # only μ, σ², N cross devices
    attrs = {"T": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                 type=[t.dtype.as_datatype_enum for t in inputs])),
             "_gradient_op_type": attr_value_pb2.AttrValue(s=VIEW_GRADIENT.encode()),
             "_graphsync_spread": attr_value_pb2.AttrValue(s=spread.encode())}
    attrs.update({f"_graphsync_{name}": attr_value_pb2.AttrValue(i=int(value)) for name, value in keys.items()})
    with pristine_scope(graph, site.device, site.op.name + "_sync"):
        view = create_op(graph, "IdentityN", inputs, attrs, "statistics")
        bessel = None if factor is None else create_op(
            graph, "Mul", [view.outputs[1], factor], {"T": attr_value_pb2.AttrValue(
                type=factor.dtype.as_datatype_enum)}, "bessel_variance").outputs[0]
    return Synchronized(s.count, s.total, view.outputs[0], view.outputs[1], bessel)


def differentiation(op) -> int:
    """How many earlier tf.gradients calls went through `op`: the k-th call of every tower pairs
    with the k-th call of the others."""
    seen = _times_differentiated.setdefault(op.graph, collections.Counter())
    k = seen[op.name]
    seen[op.name] += 1
    return k


@tf.RegisterGradient(VIEW_GRADIENT)
def _view_gradient(op, d_mean, d_variance, *_unused):
    """With D_μ, D_σ² the towers' summed gradients at μ and σ²:
    ∂/∂m_t = n_t/N·(D_μ + 2·(m_t − μ)·D_σ²),  ∂/∂M2_t = D_σ²/N  (Chan's merge differentiated;
    Σ n_s·(m_s − μ) = 0 drops the path through μ), M2_t = v_t·(n_t − 1) for a Bessel spread."""
    graph = op.graph
    mean, _, total, size, local_mean, _ = op.inputs
    k = differentiation(op)
    with pristine_scope(graph, op.device, graph.get_name_scope()):
        dtype = mean.dtype
        count = tf.cast(size, tf.float64) / tf.cast(tf.size(local_mean), tf.float64)
        d_mean = tf.zeros_like(mean) if d_mean is None else d_mean
        d_variance = tf.zeros_like(mean) if d_variance is None else d_variance
        summed = summed_gradient(op, tf.stack([d_mean, d_variance]), k)
        sum_mean, sum_variance = tf.unstack(summed)
        share = tf.cast(tf.math.divide_no_nan(count, total), dtype)
        d_local_mean = tf.math.multiply_no_nan(sum_mean + 2.0 * (local_mean - mean) * sum_variance, share)
        bessel = op.get_attr("_graphsync_spread") == b"bessel"
        weight = tf.nn.relu(count - 1.0) if bessel else tf.minimum(count, 1.0)
        d_local_spread = sum_variance * tf.cast(tf.math.divide_no_nan(weight, total), dtype)
    return [None] * 4 + [d_local_mean, d_local_spread]


def summed_gradient(op, contribution, k):
    """Σ over the towers of the sync group of view `op` of their `contribution` to the gradient
    call `k` (the k-th differentiation, or any key that pairs the towers' calls), at run time."""
    graph = op.graph
    if "_graphsync_group_key" in op.node_def.attr:
        members, group_key, forward_key, timeout_ms = (op.get_attr(f"_graphsync_{name}")
                                                       for name in ("members", "group_key", "instance_key", "timeout_ms"))
        site = op.name.rsplit("_sync/", 1)[0]
        with pristine_scope(graph, op.device, f"{site}_sync/backward_statistics"):
            return all_reduce(contribution, members, group_key, _backward_key(graph, forward_key, k),
                              timeout=timeout_ms / 1000)
    merged = op.inputs[0]
    table = _gathered_gradients.setdefault(graph, {})
    if (merged.name, k) not in table:
        scope, _, phase = merged.op.name.rpartition("/")[0].rpartition("/")
        members = op.get_attr("_graphsync_members")
        with pristine_scope(graph, merged.device, f"{scope}/{phase.replace('forward', 'backward_statistics', 1)}"):
            missing = _missing_tower(contribution)
            table[(merged.name, k)] = create_op(
                graph, "AddN", [missing] * members,
                {"T": attr_value_pb2.AttrValue(type=contribution.dtype.as_datatype_enum),
                 "N": attr_value_pb2.AttrValue(i=members)}, "sum")
    total = table[(merged.name, k)]
    update_input(total, op.get_attr("_graphsync_member"), contribution)
    return total.outputs[0]


def _missing_tower(like: tf.Tensor) -> tf.Tensor:
    """What a tower that never built this gradient contributes: an error at run time."""
    if like.shape.is_fully_defined():
        nan = tf.constant(np.full(like.shape.as_list(), np.nan), like.dtype)
    else:
        nan = tf.fill(tf.shape(like), tf.constant(np.nan, like.dtype))
    return tf.debugging.check_numerics(nan, MISSING_TOWER, name="missing_tower")


@tf.RegisterGradient(UPLOAD_GRADIENT)
def _upload_gradient(op, grad):
    """Identity's gradient: graphs rewritten before their gradients by earlier graphsync versions
    marked each tower's upload with it."""
    return grad


# ---------------------------------------------------------------------------------------- gather

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
        for g, members in enumerate(self.groups):
            with pristine_scope(graph, self.device, self._scope(layer, "forward", g)):
                counts, total, mean, variance, bessel = stats.merge_moments(
                    self.ops, *zip(*[uploads[i] for i in members]), spread=spread, epsilon=layer.epsilon)
                factor = None
                if spread == "bessel" and not layer.has_gradients:   # each tower's σ²·N/(N−1), see _view
                    ops = self.ops
                    factor = ops.cast(ops.binary("RealDiv", total, ops.binary(
                        "Maximum", ops.binary("Sub", total, 1.0), 1.0)), variance.dtype, name="bessel_factor")
            for member, (i, count) in enumerate(zip(members, counts)):
                out[i] = Synchronized(count, total, mean, variance, bessel)
                if not layer.has_gradients:
                    out[i] = _view(graph, sites[i], out[i], uploads[i], spread, factor,
                                   members=len(members), member=member)
        return out

    def sums(self, graph, layer, sites, values, tag, finish=None) -> list[list]:
        """Cross-tower sums of each tower's values, passed through `finish(sums, tower index, ops)`
        on the aggregation device (once per group, with its first tower) when given."""
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            with pristine_scope(graph, self.device, self._scope(layer, tag, g)):
                totals = [self.ops.add_n([values[i][j] for i in members]) for j in range(len(values[members[0]]))]
                if finish is not None:
                    totals = finish(totals, members[0], self.ops)
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


def _backward_key(graph, forward_key: int, k) -> int:
    """The instance key of the k-th differentiation of a forward collective, the same in every
    tower (and in every process that builds the same gradients in the same order)."""
    keys = _backward_keys.setdefault(graph, {})
    if (forward_key, k) not in keys:
        allocator = _allreduce_keys.get(graph) or _allreduce_keys.setdefault(graph, CollectiveKeys(graph))
        keys[(forward_key, k)] = allocator.new()
    return keys[(forward_key, k)]


def all_reduce(x: tf.Tensor, group_size: int, group_key: int, instance_key: int, name=None, ops=None,
               timeout: float = 0.0) -> tf.Tensor:
    """Sum of x over the group, with a gradient that all-reduces the incoming gradient; fails with
    DeadlineExceeded after `timeout` seconds without all peers (0: waits forever). `ops` (a
    FastOps) shares the key constants across layers."""
    constant = ops.constant if ops is not None else (lambda value, dtype: tf.constant(value, dtype))
    keys = [constant(value, tf.int32) for value in (group_size, group_key, instance_key)]
    attrs = {"T": attr_value_pb2.AttrValue(type=x.dtype.as_datatype_enum),
             "merge_op": attr_value_pb2.AttrValue(s=b"Add"), "final_op": attr_value_pb2.AttrValue(s=b"Id"),
             "Nordering_token": attr_value_pb2.AttrValue(i=0),
             "timeout_seconds": attr_value_pb2.AttrValue(f=float(timeout)),
             "_gradient_op_type": attr_value_pb2.AttrValue(s=ALLREDUCE_GRADIENT.encode())}
    return create_op(x.graph, "CollectiveReduceV2", [x] + keys, attrs, name or "CollectiveReduceV2").outputs[0]


@tf.RegisterGradient(ALLREDUCE_GRADIENT)
def _all_reduce_gradient(op, grad):
    """The gradient of a sum over towers is the sum of the towers' gradients: another all-reduce.

    Each tower's k-th differentiation of the same collective gets the same new instance key, so
    the towers' gradient collectives pair up even when each tower calls tf.gradients itself.
    """
    forward_key = int(tf.get_static_value(op.inputs[3]))
    group_size, group_key = (int(tf.get_static_value(t)) for t in op.inputs[1:3])
    key = _backward_key(op.graph, forward_key, differentiation(op))
    return [all_reduce(grad, group_size, group_key, key, timeout=op.get_attr("timeout_seconds"))] \
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
        """All-reduces each tower's packed vector. Returns, per tower, the reduced vector and what
        its first reader must wait for: one NoOp (on the group's first device) after every
        collective of the group, so fetching one tower's result never leaves another tower's
        collective unrun. A barrier costs 2·(towers − 1) cross-device control edges per layer and
        direction where every tower waiting on every peer cost towers·(towers − 1) (+8 % step
        time at 4 towers, measured)."""
        out = [None] * len(sites)
        for g, members in enumerate(self.groups):
            instance = self.keys.new()
            reduced = {}
            for i in members:
                with pristine_scope(graph, sites[i].device, f"{sites[i].op.name}_sync/{name}"):
                    reduced[i] = all_reduce(packed[i], len(members) * self.scale, self.group_keys[g], instance,
                                            ops=self.ops, timeout=self.timeout)
            first = sites[members[0]]
            with pristine_scope(graph, first.device, f"{first.op.name}_sync/{name}"), \
                    graph.control_dependencies([reduced[i].op for i in members]):
                barrier = tf.no_op(name="all_reduced")
            for i in members:
                out[i] = (reduced[i], [barrier], g, instance)
        return out

    def moments(self, graph, layer, sites, uploads, spread="m2") -> list[Synchronized]:
        """Each tower packs, all-reduces and unpacks through two library functions (one call op
        each); its statistics always reach it through a view, so gradients built later never
        enter the calls."""
        packed, counts = [], []
        for site, (size, mean, local_spread, *residual) in zip(sites, uploads):
            with pristine_scope(graph, site.device, site.op.name + "_sync"):
                inputs = [size, mean, local_spread]
                if residual and residual[0] is not None:   # a fused float32 tower: exact moments
                    inputs += [residual[0], self.ops.constant(float(layer.epsilon), tf.float64)]
                vector, n = self.ops.call(_library(_pack_moments, spread, inputs), inputs, "pack")
            channels = mean.shape.num_elements()
            vector.set_shape([1 + 2 * channels] if channels is not None else [None])
            n.set_shape([])
            packed.append(vector)
            counts.append(n)
        out = []
        reduced = self._reduce(graph, sites, packed, "forward")
        for site, upload, (vector, peers, g, instance), n in zip(sites, uploads, reduced, counts):
            like = upload[1]
            with pristine_scope(graph, site.device, site.op.name + "_sync"), graph.control_dependencies(peers):
                total, *moments = self.ops.call(_library(_unpack_moments, spread, [vector, like]), [vector, like],
                                                "unpack")
            total.set_shape([])
            for t in moments[:2]:
                t.set_shape(like.shape)
            if spread == "bessel":
                moments[2].set_shape([])
            s = Synchronized(n, total, moments[0], moments[1], None)
            out.append(_view(graph, site, s, upload, spread, moments[2] if spread == "bessel" else None,
                             members=len(self.groups[g]) * self.scale, group_key=self.group_keys[g],
                             instance_key=instance, timeout_ms=round(self.timeout * 1000)))
        return out

    def sums(self, graph, layer, sites, values, tag, finish=None) -> list[list]:
        """Cross-tower sums of each tower's values, passed through `finish(sums, tower index, ops)`
        on each tower's device when given. Values of one shape and dtype travel stacked."""
        ops, packed, layouts = self.ops, [], []
        for site, vals in zip(sites, values):
            stackable = all(v.dtype == vals[0].dtype and v.shape.is_fully_defined() and v.shape == vals[0].shape
                            for v in vals)
            with pristine_scope(graph, site.device, f"{site.op.name}_sync/pack_{tag}"):
                if stackable:
                    packed.append(vals[0] if len(vals) == 1 else ops.stack(vals))
                    layouts.append(None)
                else:
                    dtype = vals[0].dtype
                    packed.append(tf.concat([tf.reshape(tf.cast(v, dtype), [-1]) for v in vals], 0))
                    layouts.append([(_shape_of(v), tf.size(v), v.dtype) for v in vals])
        out = []
        for i, (site, vals, (vector, peers, _, _), layout) in enumerate(zip(sites, values, self._reduce(
                graph, sites, packed, tag), layouts)):
            with pristine_scope(graph, site.device, f"{site.op.name}_sync/unpack_{tag}"), \
                    graph.control_dependencies(peers):
                if layout is None:
                    totals = ops.unstack(vector, len(vals)) if len(vals) > 1 else [ops.unary("Identity", vector)]
                else:
                    pieces = tf.split(vector, [size for _, size, _ in layout])
                    totals = [tf.cast(tf.reshape(p, shape), dt) for p, (shape, _, dt) in zip(pieces, layout)]
            with pristine_scope(graph, site.device, f"{site.op.name}_sync/unpack_{tag}"):
                out.append(finish(list(totals), i, ops) if finish is not None else list(totals))
        return out


def cross_process_group_key(fingerprint: int, group: int) -> int:
    """The group key of sync group `group` between worker processes: derived from the fingerprint
    of the synchronized layers, so workers that built different layers (different scripts) wait
    for each other in vain (and time out) instead of averaging unrelated statistics. Keys lie in
    [2^29, 2^30): clear of CollectiveKeys' counter and of int32 overflow."""
    return (1 << 29) + (fingerprint + group) % (1 << 28)


_traced = {}   # (body, spread, input dtypes) → ConcreteFunction, traced once per process


def _library(body, spread: str, inputs):
    """`body(spread)` as a tf.function traced for inputs of any shape with these dtypes, in a graph
    of its own so that no device or scope of the caller leaks into its definition."""
    key = (body.__name__, spread, tuple(t.dtype for t in inputs))
    if key not in _traced:
        with tf.Graph().as_default():
            _traced[key] = tf.function(body(spread), input_signature=[tf.TensorSpec(None, t.dtype) for t in inputs],
                                       autograph=False).get_concrete_function()
    return _traced[key]


def _pack_moments(spread):
    def pack(size, mean, spread_value, *refinement):
        """float64 [n, n·m, M2 + n·m²] of one tower (count first) and its n; M2 = v·(n − 1) for a
        Bessel spread. MulNoNan: an empty tower's NaN statistics weigh nothing. With a fused
        float32 tower's (residual, ε), m and M2 are first made exact (stats.refine_moments):
        Σ(M2 + n·m²) − N·μ² then loses ~1e-16·(μ/σ)² relative in float64, nothing at |μ|/σ ≤ 1e4."""
        ops, f64 = FastOps(tf.compat.v1.get_default_graph()), tf.float64
        m = ops.cast(ops.reshape(mean, [-1]), f64)
        v = ops.cast(ops.reshape(spread_value, [-1]), f64)
        n = ops.binary("RealDiv", ops.cast(size, f64), ops.cast(tf.size(m), f64))
        weight = ops.unary("Relu", ops.binary("Sub", n, 1.0)) if spread == "bessel" else ops.binary("Minimum", n, 1.0)
        m2 = ops.binary("MulNoNan", v, weight)
        if refinement:
            residual, epsilon = refinement
            m, m2 = stats.refine_moments(ops, n, m, m2, ops.cast(ops.reshape(residual, [-1]), f64), epsilon)
        weighted = ops.binary("MulNoNan", m, n)
        return ops.concat([ops.reshape(n, [1]), weighted, ops.binary("AddV2", m2, ops.binary("MulNoNan", m, weighted))]), n
    return pack


def _unpack_moments(spread):
    def unpack(vector, like):
        """(N, μ, σ² and, for a Bessel spread, N/(N−1)) from an all-reduced [N, Σn·m, Σ(M2 + n·m²)],
        the statistics shaped like `like`, all but N in its dtype."""
        ops = FastOps(tf.compat.v1.get_default_graph())
        channels = tf.size(like)
        count, sums, squares = tf.split(vector, tf.stack([1, channels, channels]), num=3)
        total = ops.reshape(count, [])
        mean = ops.binary("DivNoNan", sums, total)
        second = ops.binary("DivNoNan", squares, total)
        variance = ops.unary("Relu", ops.binary("Sub", second, ops.unary("Square", mean)))
        shape = tf.shape(like)
        out = (total,) + tuple(ops.cast(tf.reshape(t, shape), like.dtype) for t in (mean, variance))
        if spread == "bessel":
            out += (ops.cast(ops.binary("RealDiv", total, ops.binary("Maximum", ops.binary("Sub", total, 1.0), 1.0)),
                             like.dtype),)
        return out
    return unpack


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
