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


def resnetish(depth=2, data_format="NHWC", version=3, avg_factor=None, channels=4):
    """conv → BN → relu blocks with a residual add, then a dense head."""

    def model(x):
        if data_format == "NCHW":
            x = tf.transpose(x, [0, 3, 1, 2])
        updates = []
        h = _conv(x, channels, "stem", data_format)
        for i in range(depth):
            y, up = raw_fused_bn(h, f"bn{i}", data_format=data_format, version=version, avg_factor=avg_factor)
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


def keras_bn(depth=2):
    """tf_keras layers, one object per layer shared by all towers; updates from `layer.updates`."""
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
            h = layers[f"conv{i}"](tf.nn.relu(layers[f"bn{i}"](h, training=True)))
        updates = [u for name, layer in layers.items() for u in layer.updates[seen[name]:]]
        return layers["head"](tf.reduce_mean(h, [1, 2])), updates

    return model
