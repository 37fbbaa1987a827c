"""Random multi-tower training graphs, written the ways real TF1 code writes them (issue 41).

`spec(seed)` draws a net and how it is trained; `check(seed)` builds it as 2–4 uneven towers,
rewrites it, and compares one training step with one device on the concatenated batch. The only
outcomes allowed: the step equals one device (outputs, per-tower losses, gradients, moving
statistics, updated variables), or graphsync refuses the graph in one line (GraphsyncError).
Anything else, a traceback or a silent difference, is a bug: its seed becomes a named regression
test in tests/test_random_graphs.py.

What a net is drawn from:
    normalization   fused (tf.compat.v1.layers, fused and not, the raw FusedBatchNormV3),
                    tf.nn.moments with tf.nn.batch_normalization, by hand (reduce_mean and
                    Square(x − m), E[x²] − m², tf.math.reduce_variance), tf_keras
                    BatchNormalization
    activation      relu, relu6, leaky relu, elu, tanh, swish, none
    join            none, a residual addition, a concatenation on channels (then a 1×1 convolution)
    pooling         none, max or average pooling (stride 1, SAME)
    training flag   Python True, or a tensor (placeholder_with_default) under control flow v1 or v2
                    for the layers that take one
    towers          2–4, each of 1–4 examples; gradients built after the rewrite, before it per
                    tower, or before it summed; strategy gather or all-reduce
"""
from __future__ import annotations

import dataclasses
import random
import re
import warnings

import numpy as np
import tensorflow as tf

import conditional_models as cm
import graphsync
import handwritten_models as hm
import models
import towerlib as tl

tf1 = tf.compat.v1
SHAPE, WIDTH, CHANNELS = (5, 5, 3), 3, 4

NORMS = ("layers-fused", "layers-unfused", "raw-fused", "moments", "sub-square", "second-moment",
         "reduce-variance", "keras")
TAKES_FLAG = ("layers-fused", "layers-unfused")
ACTIVATIONS = {
    "relu": tf.nn.relu, "relu6": tf.nn.relu6, "leaky": lambda h: tf.nn.leaky_relu(h, 0.1),
    "elu": tf.nn.elu, "tanh": tf.tanh, "swish": lambda h: h * tf.sigmoid(h), "none": lambda h: h,
}
JOINS = ("none", "residual", "concat")
POOLS = ("none", "max", "avg")


@dataclasses.dataclass(frozen=True)
class Block:
    norm: str
    activation: str
    join: str
    pool: str


@dataclasses.dataclass(frozen=True)
class Spec:
    seed: int
    blocks: tuple
    batch_sizes: tuple
    gradients: str        # 'after', 'before', 'before-sum'
    strategy: str         # 'gather', 'allreduce'
    flag: str             # 'python', 'tensor-v1', 'tensor-v2'

    def __str__(self):
        blocks = " → ".join(f"{b.norm}/{b.activation}" + (f"/{b.join}" if b.join != "none" else "") +
                            (f"/{b.pool}pool" if b.pool != "none" else "") for b in self.blocks)
        return (f"seed {self.seed}: towers {list(self.batch_sizes)}, gradients {self.gradients}, "
                f"{self.strategy}, flag {self.flag}: {blocks}")


def spec(seed: int) -> Spec:
    draw = random.Random(seed)
    blocks = tuple(Block(draw.choice(NORMS), draw.choice(list(ACTIVATIONS)), draw.choice(JOINS), draw.choice(POOLS))
                   for _ in range(draw.randint(1, 3)))
    sizes = tuple(draw.randint(1, 4) for _ in range(draw.randint(2, 4)))
    if len(set(sizes)) == 1:   # uneven towers, always
        sizes = sizes[:-1] + (sizes[-1] % 4 + 1,)
    return Spec(seed, blocks, sizes, draw.choice(("after", "before", "before-sum")),
                draw.choice(("gather", "allreduce")), draw.choice(("python", "tensor-v1", "tensor-v2")))


def _reduce_variance_bn(x, name):
    gamma, beta, mm, mv = hm._affine(name, x.shape[-1], x.dtype)
    axes = list(range(x.shape.rank - 1))
    mean, variance = tf.reduce_mean(x, axes), tf.math.reduce_variance(x, axes)
    y = (x - mean) * tf.math.rsqrt(variance + hm.EPSILON) * gamma + beta
    return y, [hm._assign(mm, mean), hm._assign(mv, variance)]


def _normalize(h, norm, name, flag, keras_layers):
    """One normalization layer: (output, its update ops)."""
    if norm in ("layers-fused", "layers-unfused"):
        before = set(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
        training = True if flag == "python" else cm.is_training(h.graph)
        y = tf1.layers.batch_normalization(h, training=training, fused=norm == "layers-fused", name=name,
                                           gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=len(name)))
        return y, [u for u in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if u not in before]
    if norm == "raw-fused":
        return models.raw_fused_bn(h, name)
    if norm == "moments":
        return models.seed_bn(h, name)
    if norm == "sub-square":
        return hm._sub_square(h, name)
    if norm == "second-moment":
        return hm._second_moment(h, name)
    if norm == "reduce-variance":
        return _reduce_variance_bn(h, name)
    if norm == "keras":
        import tf_keras
        if name not in keras_layers:   # one layer object per graph, shared by its towers
            keras_layers[name] = tf_keras.layers.BatchNormalization(
                name=name, gamma_initializer=tf_keras.initializers.RandomUniform(0.5, 1.5, seed=len(name)))
        layer = keras_layers[name]
        seen = len(layer.updates)
        y = layer(h, training=True)
        return y, list(layer.updates[seen:])
    raise ValueError(norm)


def model_fn(s: Spec):
    per_graph: dict = {}

    def model(x):
        keras_layers = per_graph.setdefault(x.graph, {})
        updates, h = [], x
        for i, block in enumerate(s.blocks):
            skip = h
            h = models._conv_as(h, CHANNELS, f"conv{i}")
            h, up = _normalize(h, block.norm, f"norm{i}", s.flag, keras_layers)
            updates += up
            h = ACTIVATIONS[block.activation](h)
            if block.join == "residual" and skip.shape[-1] == h.shape[-1]:
                h = h + skip
            elif block.join != "none":
                h = tf.concat([h, skip], -1)
                w = tf1.get_variable(f"join{i}/w", [1, 1, h.shape[-1], CHANNELS], h.dtype,
                                     tf1.glorot_uniform_initializer(seed=i))
                h = tf.nn.conv2d(h, w, 1, "SAME")
            if block.pool == "max":
                h = tf.nn.max_pool2d(h, 2, 1, "SAME")
            elif block.pool == "avg":
                h = tf.nn.avg_pool2d(h, 3, 1, "SAME")
        pooled = tf.reduce_mean(h, [1, 2])
        w = tf1.get_variable("head/w", [pooled.shape[-1], WIDTH], h.dtype, tf1.glorot_uniform_initializer(seed=9))
        return tf.matmul(pooled, w), updates

    return model


@dataclasses.dataclass
class Outcome:
    spec: Spec
    refused: str = ""          # GraphsyncError's message
    error: float = 0.0         # max relative error against one device
    tolerance: float = 0.0
    layers: int = 0            # layers the report synchronized
    unsynchronized: float = 0.0   # the same towers without the rewrite, against one device

    @property
    def ok(self) -> bool:
        return bool(self.refused) or self.error <= self.tolerance

    def __str__(self):
        if self.refused:
            return f"{self.spec}\n  refused: {self.refused}"
        verdict = "equals one device" if self.ok else "DIFFERS from one device"
        return f"{self.spec}\n  {verdict}: {self.error:.1e} (tolerance {self.tolerance:.1e}), {self.layers} layers"


def _in_reference_order(built):
    """Variables and their gradients, and the moving statistics, in the reference's order: a
    tf_keras layer built in tower 0 names its variables under tower 0's scope (tower_0/norm0/gamma
    where the reference has norm0/gamma), which sorts them elsewhere."""
    def unscoped(v):
        return re.sub(r"^tower_\d+/", "", v.name)
    order = sorted(range(len(built.variables)), key=lambda i: unscoped(built.variables[i]))
    built.variables = [built.variables[i] for i in order]
    built.grads = [built.grads[i] for i in order]
    built.moving = sorted(built.moving, key=unscoped)
    return built


def check(seed: int) -> Outcome:
    """Builds, rewrites and runs the net of `seed`. Raises what graphsync raises other than
    GraphsyncError (the test reports it as the failure it is)."""
    s = spec(seed)
    outcome = Outcome(s)
    sizes = list(s.batch_sizes)
    x, t = tl.data(sizes, SHAPE, (WIDTH,), seed=seed)
    with cm.control_flow("v1" if s.flag == "tensor-v1" else "v2"):
        ref = tl.reference_step(model_fn(s), sizes, x, t, input_shape=SHAPE)
        # one device's own noise: the largest change three other orders of the batch make (with
        # towers of one or two examples, two orders measured it 4.3 times below the rewrite's)
        noise = max(tl.max_rel_error(reordered[k], ref[k]) for order in (7, 8, 9)
                    for reordered in [tl.reordered_reference_step(model_fn(s), sizes, x, t, seed=order,
                                                                  input_shape=SHAPE)]
                    for k in ref)
        outcome.tolerance = tl.tolerance(tf.float32, noise, sum(sizes) * SHAPE[0] * SHAPE[1])
        reports = []

        def rewrite(graph):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", graphsync.GraphsyncWarning)
                reports.append(graphsync.rewrite_towers(graph, strategy=s.strategy))

        try:
            built = tl.build(model_fn(s), sizes, gradients=s.gradients, rewrite=rewrite, input_shape=SHAPE)
        except graphsync.GraphsyncError as exc:
            outcome.refused = str(exc)
            return outcome
        got = tl.run_step(_in_reference_order(built), x, t, sizes)
        plain = tl.run_step(_in_reference_order(tl.build(model_fn(s), sizes, input_shape=SHAPE)), x, t, sizes)
    outcome.unsynchronized = max(tl.max_rel_error(plain[k], ref[k]) for k in ref)
    outcome.layers = len(reports[0].layers)
    outcome.error = max(tl.max_rel_error(got[k], ref[k]) for k in ref)
    return outcome

