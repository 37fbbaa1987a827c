"""Small models in the flavours real TF1 code uses, each `model(x) -> (output, update_ops)`."""
from __future__ import annotations

import tensorflow as tf

tf1 = tf.compat.v1


def _conv(x, channels, name, data_format="NHWC"):
    cin = x.shape[1] if data_format == "NCHW" else x.shape[-1]
    w = tf1.get_variable(name + "/w", [3, 3, cin, channels], tf.float32,
                         tf1.glorot_uniform_initializer(seed=len(name)))
    return tf.nn.conv2d(x, tf.cast(w, x.dtype), 1, "SAME", data_format=data_format)


def _head(x, data_format="NHWC"):
    axes = [2, 3] if data_format == "NCHW" else [1, 2]
    pooled = tf.cast(tf.reduce_mean(x, axes), tf.float32)
    w = tf1.get_variable("head/w", [pooled.shape[-1], 5], tf.float32, tf1.glorot_uniform_initializer(seed=7))
    return tf.matmul(pooled, w)


def raw_fused_bn(x, name, *, data_format="NHWC", version=3, momentum=0.9, epsilon=1e-3, avg_factor=None):
    """A fused batch norm written with the raw op and hand-made moving averages."""
    channels = x.shape[1] if data_format == "NCHW" else x.shape[-1]
    with tf1.variable_scope(name):
        gamma = tf1.get_variable("gamma", [channels], initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=3))
        beta = tf1.get_variable("beta", [channels], initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=4))
        mmean = tf1.get_variable("moving_mean", [channels], initializer=tf1.zeros_initializer(), trainable=False)
        mvar = tf1.get_variable("moving_variance", [channels], initializer=tf1.ones_initializer(), trainable=False)
    op = {1: tf.raw_ops.FusedBatchNorm, 2: tf.raw_ops.FusedBatchNormV2, 3: tf.raw_ops.FusedBatchNormV3}[version]
    kw = {}
    if avg_factor is not None:
        kw["exponential_avg_factor"] = avg_factor
        mean_in, var_in = mmean.read_value(), mvar.read_value()
    else:
        mean_in = var_in = tf.constant([], tf.float32)
    y, mean, var = op(x=x, scale=gamma, offset=beta, mean=mean_in, variance=var_in, epsilon=epsilon,
                      data_format=data_format, is_training=True, name=name, **kw)[:3]
    if avg_factor is not None:
        updates = [mmean.assign(mean), mvar.assign(var)]
    else:
        updates = [mmean.assign(mmean * momentum + mean * (1 - momentum)),
                   mvar.assign(mvar * momentum + var * (1 - momentum))]
    return y, updates


def resnetish(depth=2, data_format="NHWC", version=3, avg_factor=None, channels=4, bn_format=None):
    """conv → BN → relu blocks with a residual add, then a dense head. `bn_format="NCHW"` with NHWC
    convolutions runs each batch norm on a channels-first transpose of its input: the batch norm's
    NCHW path, on kernels every CPU has (channels-first convolution gradients need oneDNN)."""

    def batch_norm(h, name):
        if bn_format == "NCHW" and data_format == "NHWC":
            y, up = raw_fused_bn(tf.transpose(h, [0, 3, 1, 2]), name, data_format="NCHW", version=version,
                                 avg_factor=avg_factor)
            return tf.transpose(y, [0, 2, 3, 1]), up
        return raw_fused_bn(h, name, data_format=data_format, version=version, avg_factor=avg_factor)

    def model(x):
        if data_format == "NCHW":
            x = tf.transpose(x, [0, 3, 1, 2])
        updates = []
        h = _conv(x, channels, "stem", data_format)
        for i in range(depth):
            y, up = batch_norm(h, f"bn{i}")
            updates += up
            y = tf.nn.relu(y)
            h = h + _conv(y, channels, f"conv{i}", data_format) if i % 2 else _conv(y, channels, f"conv{i}", data_format)
        return _head(h, data_format), updates

    return model


def layers_bn(depth=2, fused=True):
    """tf.compat.v1.layers.batch_normalization, updates from the UPDATE_OPS collection."""

    def model(x):
        before = set(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
        h = _conv(x, 4, "stem")
        for i in range(depth):
            h = tf1.layers.batch_normalization(h, training=True, fused=fused, name=f"bn{i}",
                                               gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=i))
            h = _conv(tf.nn.relu(h), 4, f"conv{i}")
        updates = [u for u in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if u not in before]
        return _head(h), updates

    return model


def keras_bn(depth=2, training=True):
    """tf_keras layers, one object per layer shared by all towers; updates from `layer.updates`.
    training=None calls the batch norms without training= (they read the learning phase)."""
    import tf_keras
    per_graph = {}

    def model(x):
        layers = per_graph.setdefault(x.graph, {})
        if not layers:
            init = tf_keras.initializers.GlorotUniform(seed=1)
            layers["stem"] = tf_keras.layers.Conv2D(4, 3, padding="same", use_bias=False, kernel_initializer=init)
            for i in range(depth):
                layers[f"bn{i}"] = tf_keras.layers.BatchNormalization(
                    gamma_initializer=tf_keras.initializers.RandomUniform(0.5, 1.5, seed=i))
                layers[f"conv{i}"] = tf_keras.layers.Conv2D(4, 3, padding="same", use_bias=False,
                                                             kernel_initializer=init)
            layers["head"] = tf_keras.layers.Dense(5, kernel_initializer=init)
        seen = {name: len(layer.updates) for name, layer in layers.items()}
        h = layers["stem"](x)
        for i in range(depth):
            bn = layers[f"bn{i}"]
            h = layers[f"conv{i}"](tf.nn.relu(bn(h) if training is None else bn(h, training=training)))
        updates = [u for name, layer in layers.items() for u in layer.updates[seen[name]:]]
        return layers["head"](tf.reduce_mean(h, [1, 2])), updates

    return model


def _var(name, shape, dtype, init):
    return tf1.get_variable(name, shape, dtype, init)


def _conv_as(x, channels, name, stride=1):
    """A conv whose weights have x's dtype (so float64 models stay float64 end to end)."""
    w = _var(name + "/w", [3, 3, x.shape[-1], channels], x.dtype, tf1.glorot_uniform_initializer(seed=len(name)))
    return tf.nn.conv2d(x, w, stride, "SAME")


def seed_bn(x, name, momentum=0.9):
    """The seed question's layer: tf.nn.moments + tf.nn.batch_normalization, hand-made variables."""
    n_out = x.shape[-1]
    with tf1.variable_scope(name):
        beta = _var("beta", [n_out], x.dtype, tf1.random_uniform_initializer(-0.5, 0.5, seed=5))
        gamma = _var("gamma", [n_out], x.dtype, tf1.random_uniform_initializer(0.5, 1.5, seed=6))
        moving_mean = tf1.get_variable("moving_mean", [n_out], x.dtype, tf1.zeros_initializer(), trainable=False)
        moving_var = tf1.get_variable("moving_variance", [n_out], x.dtype, tf1.ones_initializer(), trainable=False)
    axes = list(range(x.shape.rank - 1))
    mean, variance = tf.nn.moments(x, axes, name=name + "_moments")
    updates = [moving_mean.assign(moving_mean * momentum + mean * (1 - momentum)),
               moving_var.assign(moving_var * momentum + variance * (1 - momentum))]
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-5), updates


def seed_moments(depth=6, layer_norm=False):
    """The seed-002 model: conv → moments BN → relu, `depth` times; optionally a layer norm too."""

    def model(x):
        updates, h = [], x
        for i in range(depth):
            h = _conv_as(h, 4, f"conv{i}")
            h, up = seed_bn(h, f"bn{i}")
            updates += up
            h = tf.nn.relu(h)
            if layer_norm and i == 1:
                mean, variance = tf.nn.moments(h, [1, 2, 3], keepdims=True, name="layer_norm")
                h = (h - mean) * tf.math.rsqrt(variance + 1e-5)
        pooled = tf.reduce_mean(h, [1, 2])
        return tf.matmul(pooled, _var("head/w", [4, 5], x.dtype, tf1.glorot_uniform_initializer(seed=9))), updates

    return model


def encoder_decoder(fused=False):
    """A small segmentation net: strided encoder, upsampling decoder, per-pixel output."""

    def model(x):
        before = set(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))

        def bn(h, name):
            return tf.nn.relu(tf1.layers.batch_normalization(
                h, training=True, fused=fused, name=name,
                gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=len(name))))

        e1 = bn(_conv_as(x, 4, "enc1"), "bn_enc1")
        e2 = bn(_conv_as(e1, 8, "enc2", stride=2), "bn_enc2")
        d1 = tf.repeat(tf.repeat(e2, 2, 1), 2, 2)
        d1 = bn(_conv_as(tf.concat([d1, e1], -1), 4, "dec1"), "bn_dec1")
        logits = _conv_as(d1, 2, "out")
        updates = [u for u in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if u not in before]
        return tf.reshape(logits, [-1, logits.shape[1] * logits.shape[2] * 2]), updates

    return model


def keras_dense_bn(depth=3, dtype="float32"):
    """tf_keras BatchNormalization after Dense layers (2-D input: the moments path)."""
    import tf_keras
    per_graph = {}

    def model(x):
        layers = per_graph.setdefault(x.graph, [])
        if not layers:
            for i in range(depth):
                layers.append(tf_keras.layers.Dense(6, use_bias=False, dtype=dtype,
                                                    kernel_initializer=tf_keras.initializers.GlorotUniform(seed=i)))
                layers.append(tf_keras.layers.BatchNormalization(
                    dtype=dtype, gamma_initializer=tf_keras.initializers.RandomUniform(0.5, 1.5, seed=i)))
            layers.append(tf_keras.layers.Dense(5, dtype=dtype, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=9)))
        seen = [len(l.updates) for l in layers]
        h = tf.reshape(x, [-1, x.shape[1] * x.shape[2] * x.shape[3]])
        for layer in layers[:-1]:
            h = tf.nn.relu(layer(h, training=True)) if "batch_norm" in layer.name else layer(h)
        updates = [u for layer, n in zip(layers, seen) for u in layer.updates[n:]]
        return layers[-1](h), updates

    return model


def mixed(layer_norm=True):
    """Fused and moments batch norm in one model, plus a layer norm that must stay untouched."""

    def model(x):
        h = _conv(x, 4, "stem")
        h, up1 = raw_fused_bn(h, "fused_bn")
        h = _conv_as(tf.nn.relu(h), 4, "mid")
        h, up2 = seed_bn(h, "moments_bn")
        if layer_norm:
            mean, variance = tf.nn.moments(h, [1, 2, 3], keepdims=True, name="layer_norm")
            h = (h - mean) * tf.math.rsqrt(variance + 1e-5)
        return _head(tf.nn.relu(h)), up1 + up2

    return model
