"""The strategy with no central device: each tower packs its statistics into one vector, a
transport (graphsync/exchange/transports.py) sums the vectors over the towers, and each tower
unpacks the totals. The forward packs float64 [n, n·m, M2 + n·m²] (the count travels in the vector;
float32 towers first make m and M2 exact with their residual, as the gathered merge does); in
float64 the E[x²]-style cancellation costs ~1e-16·(μ/σ)² relative, nothing up to |μ|/σ ≈ 1e4.
Packing and unpacking are two small tf.functions traced once per process and called once per tower
(one op each in the graph; TensorFlow inlines them before running, so a step runs the same kernels
as if they were spelled out). The backward stacks the towers' [a, b] and reduces them in their own
dtype. The transports: collectives (graphsync/exchange/collectives.py, in-graph or between worker
processes) and queues on a parameter server (graphsync/exchange/through_ps.py).
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.exchange import library, marking
from graphsync.exchange.merges import Merge
from graphsync.exchange.transports import Transport
from graphsync.exchange.values import Synchronized
from graphsync.exchange.views import sum_view, view
from graphsync.graph.fast_ops import FastOps
from graphsync.graph.tf_private import pristine_scope
from graphsync.stats import Spread


class AllReduce:
    """Statistics packed per tower and summed by `transport`, one sum per layer and direction."""

    def __init__(self, graph: tf.Graph, groups, transport: Transport):
        self.groups, self.transport = groups, transport
        self.ops = FastOps(graph)

    @property
    def name(self) -> str:
        """The strategy reports name: "allreduce", or "ps" through a parameter server."""
        return self.transport.name

    def moments(self, graph, layer, sites, uploads, spread=Spread.M2) -> list[Synchronized]:
        """Each tower packs, all-reduces and unpacks through two library functions (one call op
        each); its statistics always reach it through a view, so gradients built later never
        enter the calls."""
        packed, counts = [], []
        for site, (size, mean, local_spread, *residual) in zip(sites, uploads):
            with pristine_scope(graph, site.device, site.op.name + "_sync"):
                inputs = [size, mean, local_spread]
                if residual and residual[0] is not None:   # a float32 tower: exact moments
                    inputs.append(residual[0])
                    if layer.residual_epsilon is not None:
                        inputs.append(self.ops.constant(float(layer.residual_epsilon), tf.float64))
                pack = library.traced(_pack_moments, (spread,), library.static_specs(inputs))
                vector, n = self.ops.call(pack, inputs, "pack")
            channels = mean.shape.num_elements()
            vector.set_shape([1 + 2 * channels] if channels is not None else [None])
            n.set_shape([])
            packed.append(vector)
            counts.append(n)
        out = []
        reduced = self.transport.reduce(graph, layer, sites, packed, "forward")
        for i, (site, upload, r, n) in enumerate(zip(sites, uploads, reduced, counts)):
            like = upload[1]
            with pristine_scope(graph, site.device, site.op.name + "_sync"), graph.control_dependencies(r.peers):
                unpack = library.traced(_unpack_moments, (spread,), library.static_specs([r.total, like]))
                total, *moments = self.ops.call(unpack, [r.total, like], "unpack")
            total.set_shape([])
            for t in moments[:2]:
                t.set_shape(like.shape)
            if spread is Spread.BESSEL:
                moments[2].set_shape([])
            s = Synchronized(n, total, moments[0], moments[1], None)
            out.append(view(graph, site, s, upload, spread, moments[2] if spread is Spread.BESSEL else None,
                            **self._view_keys(layer, site, r, i)))
        return out

    def _view_keys(self, layer, site, reduced, i):
        """How a view's gradient (graphsync/exchange/views.py) finds tower i's group again, and
        the scope in tower i its sum goes under (a ps transport adds the gradient call's key)."""
        return dict(reduced.keys, member=self.groups[reduced.group].index(i), layer=layer.name,
                    gradient_scope=f"{site.op.name}_sync/backward_statistics")

    def sums(self, graph, layer, sites, values, tag, finish=None) -> list[list]:
        """Cross-tower sums of each tower's values, passed through `finish(sums, tower index, ops)`
        on each tower's device when given. Values of one shape and dtype travel stacked."""
        return [totals for totals, _ in self._sums(graph, layer, sites, values, tag, finish)]

    def shared_sums(self, graph, layer, sites, values, tag="forward") -> list[list]:
        """`sums` whose first total reaches each tower through a view (graphsync/exchange/views.py):
        its gradient, built later, all-reduces the towers' at run time; the other totals are
        constants to the gradients (counts)."""
        out = []
        for i, (totals, reduced) in enumerate(self._sums(graph, layer, sites, values, tag)):
            shared = sum_view(graph, sites[i], totals[0], values[i][0], **self._view_keys(layer, sites[i], reduced, i))
            with pristine_scope(graph, sites[i].device, f"{sites[i].op.name}_sync/unpack_{tag}"):
                out.append([shared] + [tf.stop_gradient(t) for t in totals[1:]])
        return out

    def extrema(self, graph, layer, sites, values, merge: Merge, tag="forward_extremum") -> list[tuple]:
        """Per tower: (the elementwise `merge` (MAX or MIN) of every tower's value, the keys of
        a view of it, graphsync/exchange/views.py)."""
        out = []
        for i, r in enumerate(self.transport.reduce(graph, layer, sites, list(values), tag, merge=merge)):
            with pristine_scope(graph, sites[i].device, f"{sites[i].op.name}_sync/{tag}"), \
                    marking.exchange(graph, layer.name, tag), graph.control_dependencies(r.peers):
                total = tf.identity(r.total, name="extremum")
            total.set_shape(values[i].shape)
            out.append((total, self._view_keys(layer, sites[i], r, i)))
        return out

    def _sums(self, graph, layer, sites, values, tag, finish=None) -> list[tuple]:
        """Per tower: (its totals, what the transport's reduce returned for it)."""
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
        for i, (site, vals, r, layout) in enumerate(zip(sites, values, self.transport.reduce(
                graph, layer, sites, packed, tag), layouts)):
            vector = r.total
            with pristine_scope(graph, site.device, f"{site.op.name}_sync/unpack_{tag}"), \
                    graph.control_dependencies(r.peers):
                if layout is None:
                    totals = ops.unstack(vector, len(vals)) if len(vals) > 1 else [ops.unary("Identity", vector)]
                else:
                    pieces = tf.split(vector, [size for _, size, _ in layout])
                    totals = [tf.cast(tf.reshape(p, shape), dt) for p, (shape, _, dt) in zip(pieces, layout)]
            with pristine_scope(graph, site.device, f"{site.op.name}_sync/unpack_{tag}"):
                out.append((finish(list(totals), i, ops) if finish is not None else list(totals), r))
        return out


def _flat(ops, t, dtype):
    """t as a float vector: one Cast, plus a Reshape unless t already is a vector."""
    return ops.cast(t if t.shape.rank == 1 else ops.reshape(t, [-1]), dtype)


def _pack_moments(spread):
    def pack(size, mean, spread_value, *refinement):
        """float64 [n, n·m, M2 + n·m²] of one tower (count first) and its n; M2 = v·(n − 1) for a
        Bessel spread. MulNoNan: an empty tower's NaN statistics weigh nothing.

        A float32 tower also passes its residual Σ(x − m̂) — a fused one Σy and ε, Σ(x − m̂) = s·Σy —
        and its m̂, M̂2 are made exact as in stats.refine_moments, expanded into the packed sums to
        spare ops on every tower: with Σ(x − m̂) = n·d, n·m = n·m̂ + n·d and
        M2 + n·m² = M̂2 + m̂·(n·m̂ + 2·n·d). Σ(M2 + n·m²) − N·μ² then loses ~1e-16·(μ/σ)² relative
        in float64, nothing at |μ|/σ ≤ 1e4."""
        ops, f64 = FastOps(tf.compat.v1.get_default_graph()), tf.float64
        m, v = _flat(ops, mean, f64), _flat(ops, spread_value, f64)
        channels = m.shape.num_elements() or ops.cast(tf.size(m), f64)
        n = ops.binary("RealDiv", ops.cast(size, f64), float(channels) if isinstance(channels, int) else channels)
        weight = ops.unary("Relu", ops.binary("Sub", n, 1.0)) if spread is Spread.BESSEL else ops.unary("Sign", n)
        m2 = ops.binary("MulNoNan", v, weight)
        weighted = ops.binary("MulNoNan", m, n)
        cross = weighted
        if refinement:
            residual, *epsilon = refinement
            shift = _flat(ops, residual, f64)   # n·d
            if epsilon:
                scale = ops.unary("Sqrt", ops.binary("AddV2", ops.binary("DivNoNan", m2, n), epsilon[0]))
                shift = ops.binary("MulNoNan", scale, shift)   # s·Σy = n·d
            weighted = ops.binary("AddV2", weighted, shift)
            cross = ops.binary("AddV2", weighted, shift)
        second = ops.binary("AddV2", m2, ops.binary("MulNoNan", m, cross))
        return ops.concat([ops.reshape(n, [1]), weighted, second]), n
    return pack


def _unpack_moments(spread):
    def unpack(vector, like):
        """(N, μ, σ² and, for a Bessel spread, N/(N−1)) from an all-reduced [N, Σn·m, Σ(M2 + n·m²)],
        the statistics shaped like `like`, all but N in its dtype."""
        ops = FastOps(tf.compat.v1.get_default_graph())
        channels = like.shape.num_elements()
        if channels is not None:
            count, sums, squares = ops.split(vector, [1, channels, channels])
        else:
            size = tf.size(like)
            count, sums, squares = tf.split(vector, tf.stack([1, size, size]), num=3)
        total = ops.reshape(count, [])
        mean = ops.binary("DivNoNan", sums, total)
        second = ops.binary("DivNoNan", squares, total)
        variance = ops.unary("Relu", ops.binary("Sub", second, ops.unary("Square", mean)))
        if like.shape.rank == 1:
            shaped = (mean, variance)
        else:
            shape = like.shape.as_list() if like.shape.is_fully_defined() else tf.shape(like)
            shaped = tuple(tf.reshape(t, shape) for t in (mean, variance))
        out = (total,) + tuple(ops.cast(t, like.dtype) for t in shaped)
        if spread is Spread.BESSEL:
            out += (ops.cast(ops.binary("RealDiv", total, ops.binary("Maximum", ops.binary("Sub", total, 1.0), 1.0)),
                             like.dtype),)
        return out
    return unpack


def _shape_of(t: tf.Tensor):
    """The static shape when fully known (keeps static shapes downstream), else the dynamic one."""
    return t.shape.as_list() if t.shape.is_fully_defined() else tf.shape(t)
