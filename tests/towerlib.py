"""Builds multi-tower training graphs the way TF1 users do, and their single-device reference.

The reference runs the same model on one device over the concatenated batch; each tower's loss is
the same per-example expression summed over that tower's slice, so Σ tower losses = reference loss
and the towers' summed gradients must equal the reference gradient.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

CONFIG = tf1.ConfigProto(device_count={"CPU": 4}, inter_op_parallelism_threads=2,
                         intra_op_parallelism_threads=1, allow_soft_placement=False)
LEARNING_RATE = 0.1


@dataclasses.dataclass
class Built:
    """One training graph and the tensors the comparison reads."""

    graph: tf.Graph
    inputs: list          # placeholders, one per tower
    targets: list
    outputs: list         # model output per tower
    losses: list          # per-tower loss
    grads: list           # per variable: the sum over towers of the tower gradients
    train_op: tf.Operation
    variables: list       # trainable, in a fixed order
    moving: list          # non-trainable (moving statistics), in a fixed order


def build(model_fn, batch_sizes, *, scope="tower_%d", devices=None, gradients="after", rewrite=None,
          dtype=tf.float32, input_shape=(6, 6, 3), grad_divisor=None):
    """Builds towers with `model_fn(x) -> (y, update_ops)`; `rewrite(graph)` is called before or
    after the gradients exist, per `gradients` ('after', 'before', 'before-sum'). `devices`: names,
    or device functions (tf.compat.v1.train.replica_device_setter)."""
    graph = tf.Graph()
    n_towers = len(batch_sizes)
    names = list(scope) if isinstance(scope, (list, tuple)) else \
        [scope % i if "%" in scope else scope for i in range(n_towers)]
    devices = devices or [f"/cpu:{i % 4}" for i in range(n_towers)]
    with graph.as_default():
        tf1.set_random_seed(1)
        inputs, targets, outputs, losses, updates = [], [], [], [], []
        for i in range(n_towers):
            with tf1.device(devices[i]), _scope(names[i]), \
                    tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(dtype, (None,) + tuple(input_shape), name="x")
                y, update_ops = model_fn(x)
                loss_dtype = tf.float64 if dtype == tf.float64 else tf.float32
                t = tf1.placeholder(loss_dtype, [None] + y.shape.as_list()[1:], name="target")
                loss = tf.reduce_sum(tf.square(tf.cast(y, loss_dtype) - t)) * 0.5
                inputs.append(x), targets.append(t), outputs.append(y), losses.append(loss)
                updates.append(update_ops)
        variables = sorted(tf1.trainable_variables(), key=lambda v: v.name)
        moving = sorted(set(tf1.global_variables()) - set(variables), key=lambda v: v.name)
        if gradients == "before" or gradients == "before-sum":
            rewrite and rewrite(graph)
        if gradients == "before-sum":
            summed = tf.gradients(tf.add_n(losses), variables)
        else:
            per_tower = []
            for i, loss in enumerate(losses):
                with tf1.device(devices[i]), _scope(names[i]):
                    per_tower.append(tf.gradients(loss, variables))
            # identity: a consumer the rewrite can reroute (tensors held in Python cannot change)
            summed = [tf.identity(sum_in_order(gs)) for gs in zip(*per_tower)]
        opt = tf1.train.GradientDescentOptimizer(LEARNING_RATE)
        # ref variables (TF1 behaviour) are read without snapshots: no update before every gradient
        reads_refs = any(v.op.type == "VariableV2" for v in variables)
        with tf.control_dependencies(updates[0] + (summed if reads_refs else [])):  # CIFAR10: tower 0's updates
            train_op = opt.apply_gradients(zip([g / (grad_divisor or n_towers) for g in summed], variables))
        if gradients == "after":
            rewrite and rewrite(graph)
        return Built(graph, inputs, targets, outputs, losses, summed, train_op, variables, moving)


def sum_in_order(tensors):
    """(t0 + t1) + t2 + …, the same bits every run; what tf.add_n adds first is not fixed.

    AddN writes its sum into the buffer of the first input it may forward (one no other op still
    holds) and adds the rest to it: with three or more inputs, which one that is decides the order
    of the sum. A synchronized tower's batch-norm scale and offset gradients are also read by the
    all-reduce of the backward, so whether tower 0's buffer is free when AddN runs is up to the
    scheduler: (g2 + g1) + g0 now and then instead of (g0 + g1) + g2, one ulp off. An Add of two
    is commutative bit for bit, whichever input it forwards."""
    tensors = list(tensors)
    total = tensors[0]
    for t in tensors[1:]:
        total = tf.add(total, t)
    return total


def _scope(name):
    return tf1.name_scope(name + "/") if name else contextlib.nullcontext()


def data(batch_sizes, input_shape, out_shape, seed=0, offset=0.0, dtype=np.float32):
    rng = np.random.RandomState(seed)
    total = sum(batch_sizes)
    x = (rng.randn(total, *input_shape) * 2.0 + offset).astype(dtype)
    t = rng.randn(total, *out_shape).astype(np.float64 if dtype == np.float64 else np.float32)
    return x, t


def run_step(built: Built, x, t, batch_sizes, target="", config=None, extra_feed=None):
    """One training step: outputs, losses, summed grads, then moving statistics after the update
    (`extra_feed`: more placeholders to feed, e.g. a training flag)."""
    splits = np.cumsum(batch_sizes)[:-1]
    feed = dict(extra_feed or {})
    for ph, part in zip(built.inputs, np.split(x, splits)):
        feed[ph] = part
    for ph, part in zip(built.targets, np.split(t, splits)):
        feed[ph] = part
    with built.graph.as_default(), tf1.Session(target, graph=built.graph, config=config or CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        outs, losses, grads = sess.run([built.outputs, built.losses, built.grads], feed)
        sess.run(built.train_op, feed)
        moving, variables = sess.run([built.moving, built.variables])
    return {"output": np.concatenate([o.astype(np.float64) for o in outs]),
            "loss": np.array(losses, np.float64), "grads": grads, "moving": moving, "variables": variables}


def variables_after(built: Built, x, t, batch_sizes, steps=3) -> list:
    """Every variable (trainable, then moving statistics) after `steps` training steps."""
    splits = np.cumsum(batch_sizes)[:-1]
    feed = dict(zip(built.inputs, np.split(x, splits)))
    feed.update(zip(built.targets, np.split(t, splits)))
    with tf1.Session(graph=built.graph, config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(steps):
            sess.run(built.train_op, feed)
        return sess.run(built.variables + built.moving)


def executed_nodes(built: Built, batch_sizes) -> set:
    """Names of the ops one training step runs, from TensorFlow's own step statistics."""
    x, t = data(batch_sizes, built.inputs[0].shape[1:].as_list(), built.targets[0].shape[1:].as_list())
    splits = np.cumsum(batch_sizes)[:-1]
    feed = dict(zip(built.inputs, np.split(x, splits)))
    feed.update(zip(built.targets, np.split(t, splits)))
    meta = tf1.RunMetadata()
    with tf1.Session(graph=built.graph, config=CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(built.train_op, feed, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                 run_metadata=meta)
    return {node.node_name for dev in meta.step_stats.dev_stats for node in dev.node_stats}


def reference_step(model_fn, batch_sizes, x, t, **kw):
    """The same model on one device with the concatenated batch; per-tower losses on its slices."""
    ref = build(model_fn, [sum(batch_sizes)], scope="", devices=["/cpu:0"], gradients="after",
                grad_divisor=len(batch_sizes), **kw)
    result = run_step(ref, x, t, [sum(batch_sizes)])
    per_example = np.square(result["output"] - t.astype(np.float64)).reshape(len(x), -1).sum(1) * 0.5
    splits = np.cumsum(batch_sizes)[:-1]
    result["loss"] = np.array([p.sum() for p in np.split(per_example, splits)])
    return result


def reordered_reference_step(model_fn, batch_sizes, x, t, seed=7, **kw):
    """The one-device step on the same examples in another order, results put back in the original
    order: what one device's own summation order changes. Its distance from `reference_step` is the
    noise floor of a comparison with one device, on this machine, with its kernels."""
    order = np.random.RandomState(seed).permutation(len(x))
    result = reference_step(model_fn, batch_sizes, x[order], t[order], **kw)
    result["output"] = result["output"][np.argsort(order)]
    per_example = np.square(result["output"] - t.astype(np.float64)).reshape(len(x), -1).sum(1) * 0.5
    result["loss"] = np.array([p.sum() for p in np.split(per_example, np.cumsum(batch_sizes)[:-1])])
    return result


def unit_roundoff(dtype) -> float:
    """Half the gap between 1 and the next number of `dtype` (bfloat16 keeps 8 significant bits)."""
    dtype = tf.as_dtype(dtype)
    return 2.0 ** -8 if dtype == tf.bfloat16 else float(np.finfo(dtype.as_numpy_dtype).eps) / 2


def tolerance(dtype, noise: float, summed_terms: int) -> float:
    """How far a synchronized step may be from one device, from this run rather than one machine.

    Two bounds, the larger wins:
    - 4 × `noise`, the distance between two one-device runs of the same batch in different orders
      (`reordered_reference_step`): the towers sum the batch in yet another order;
    - 2·u·√n, the random-walk growth of rounding in a sum of n = `summed_terms` products at the
      dtype's unit roundoff u (a filter gradient sums examples × positions). It dominates where a
      kernel rounds half-precision sums in a fixed order, so that reordering alone shows no noise
      (oneDNN's bfloat16 convolutions)."""
    return max(4.0 * noise, 2.0 * unit_roundoff(dtype) * np.sqrt(summed_terms))


_channels_first_probe = {}


def channels_first_conv_gradients() -> bool:
    """Whether this CPU's TensorFlow can differentiate an NCHW convolution: without oneDNN (CPUs
    without AVX-512 run TensorFlow without it by default, or TF_ENABLE_ONEDNN_OPTS=0) the filter
    gradient has only an NHWC kernel ('Conv2DCustomBackpropFilterOp only supports NHWC')."""
    if not _channels_first_probe:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.ones([1, 2, 3, 3])
            w = tf.ones([1, 1, 2, 2])
            y = tf.nn.conv2d(x, w, 1, "SAME", data_format="NCHW")
            grads = tf.gradients(y, [x, w])
        with tf1.Session(graph=graph) as sess:
            try:
                sess.run(grads)
                _channels_first_probe["ok"] = True
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
                _channels_first_probe["ok"] = False
    return _channels_first_probe["ok"]


_fused_probe = {}


def fused_batch_norm_kernels(dtype) -> bool:
    """Whether this CPU's TensorFlow trains a fused batch norm on `dtype` inputs, forward and
    backward: TensorFlow 2.12 without oneDNN has no bfloat16 kernel ('Op does not support bfloat16
    inputs'); 2.21 has one either way."""
    if dtype not in _fused_probe:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.ones([2, 2, 2, 3], dtype)
            y, _, _ = tf1.nn.fused_batch_norm(x, tf.ones([3]), tf.zeros([3]), is_training=True)
            grads = tf.gradients(y, [x])
        with tf1.Session(graph=graph, config=CONFIG) as sess:
            try:
                sess.run(grads)
                _fused_probe[dtype] = True
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, tf.errors.NotFoundError):
                _fused_probe[dtype] = False
    return _fused_probe[dtype]


def max_rel_error(got, want):
    """Largest |got − want| over the largest |want| of each compared array."""
    worst = 0.0
    for g, w in zip(_flat(got), _flat(want)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape, (g.shape, w.shape)
        scale = max(np.abs(w).max(), 1e-12) if w.size else 1.0
        worst = max(worst, float(np.abs(g - w).max() / scale) if w.size else 0.0)
    return worst


def _flat(value):
    if isinstance(value, dict):
        for k in sorted(value):
            yield from _flat(value[k])
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _flat(v)
    else:
        yield value


def import_tf_slim():
    """tf_slim, whose batch_norm reaches TensorFlow's lazily loaded tf_keras.legacy_tf_layers, which
    tf_keras 2.21 ships as tf_keras.src.legacy_tf_layers (up to TensorFlow 2.15, TensorFlow's own
    Keras serves tf_slim: conftest.py names it tf_keras for the tests)."""
    import importlib
    import sys
    if importlib.import_module("tf_keras").__name__ == "tf_keras":   # the package, not tf.keras named so
        for name in ("", ".base", ".core", ".convolutional", ".normalization", ".pooling"):
            sys.modules.setdefault("tf_keras.legacy_tf_layers" + name,
                                   importlib.import_module("tf_keras.src.legacy_tf_layers" + name))
    import tf_slim
    return tf_slim
