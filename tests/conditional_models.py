"""Models whose batch norm sits behind a tensor-valued training flag, `model(x) -> (output, updates)`,
each with `flag(graph)`: the flag tensor the script would feed (True: train, False: evaluate).

    layers        tf.compat.v1.layers.batch_normalization(training=is_training), fused
    slim          tf_slim.batch_norm(is_training=is_training), fused
    keras-layer   tf_keras BatchNormalization layers called without training= (the learning phase)
    keras-model   a tf_keras functional model called without training= (the learning phase)
"""
from __future__ import annotations

import contextlib

import tensorflow as tf

import models
import towerlib as tl

tf1 = tf.compat.v1
_flags: dict = {}


def is_training(graph: tf.Graph) -> tf.Tensor:
    """One `is_training` placeholder per graph, True unless fed, shared by every tower."""
    if graph not in _flags:
        with graph.as_default(), tf1.name_scope(None), tf.device(None):
            _flags[graph] = tf1.placeholder_with_default(True, [], name="is_training")
    return _flags[graph]


def learning_phase(graph: tf.Graph) -> tf.Tensor:
    import tf_keras
    with graph.as_default():
        return tf_keras.backend.learning_phase()


@contextlib.contextmanager
def control_flow(version: str):
    """Builds under control flow v1 (Switch/Merge) or v2 (If), restoring the process default."""
    from tensorflow.python.ops import control_flow_util  # the process-wide switch tf.compat.v1 toggles
    was_v2 = control_flow_util.ENABLE_CONTROL_FLOW_V2
    (tf1.enable_control_flow_v2 if version == "v2" else tf1.disable_control_flow_v2)()
    try:
        yield
    finally:
        (tf1.enable_control_flow_v2 if was_v2 else tf1.disable_control_flow_v2)()


def _updates_since(before):
    return [u for u in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if u not in before]


def layers_bn(depth=2):
    def model(x):
        before = set(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
        h = models._conv(x, 4, "stem")
        for i in range(depth):
            h = tf1.layers.batch_normalization(h, training=is_training(x.graph), fused=True, name=f"bn{i}",
                                               gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=i))
            h = models._conv(tf.nn.relu(h), 4, f"conv{i}")
        return models._head(h), _updates_since(before)
    model.flag = is_training
    return model


def slim():
    tf_slim = tl.import_tf_slim()

    def model(x):
        before = set(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
        h = models._conv(x, 4, "stem")
        for i in range(2):
            h = tf_slim.batch_norm(h, is_training=is_training(x.graph), fused=True, scale=True, scope=f"bn{i}",
                                   param_initializers={"gamma": tf1.random_uniform_initializer(0.5, 1.5, seed=i)})
            h = models._conv(tf.nn.relu(h), 4, f"conv{i}")
        return models._head(h), _updates_since(before)
    model.flag = is_training
    return model


def keras_layers(depth=2):
    """One tf_keras layer object per layer shared by all towers, called without training=."""
    model = models.keras_bn(depth, training=None)
    model.flag = learning_phase
    return model


def keras_model(depth=2):
    """A tf_keras functional model built once per graph, called in every tower without training=;
    its updates from `model.get_updates_for(x)`."""
    import tf_keras
    per_graph = {}

    def model(x):
        if x.graph not in per_graph:
            per_graph[x.graph] = _functional(tf_keras, x.shape[1:], depth)
        net = per_graph[x.graph]
        y = net(x)
        return y, net.get_updates_for(x)
    model.flag = learning_phase
    return model


def _functional(tf_keras, shape, depth):
    """Built outside the towers, as scripts build a model before their tower loop."""
    with tf1.name_scope(None), tf.device(None):
        init = tf_keras.initializers.GlorotUniform(seed=1)
        inputs = tf_keras.Input(shape)
        h = tf_keras.layers.Conv2D(4, 3, padding="same", use_bias=False, kernel_initializer=init)(inputs)
        for i in range(depth):
            h = tf_keras.layers.BatchNormalization(
                gamma_initializer=tf_keras.initializers.RandomUniform(0.5, 1.5, seed=i))(h)
            h = tf_keras.layers.Conv2D(4, 3, padding="same", use_bias=False, kernel_initializer=init)(
                tf_keras.layers.ReLU()(h))
        h = tf_keras.layers.GlobalAveragePooling2D()(h)
        return tf_keras.Model(inputs, tf_keras.layers.Dense(5, kernel_initializer=init)(h))



def function_block(training="flag", nested=False, depth=2):
    """Batch norms inside a tf.function `block` that every tower calls in graph mode (a
    StatefulPartitionedCall whose body TensorFlow hides from get_operations()), one tf.function per
    tower as a tower loop builds them:

        stem conv → block(h, training) → head,  block = (fused batch norm → relu → conv) × depth

    training="flag": each batch norm is a tf.cond on the is_training placeholder, passed to the
    block as an argument (an If inside the call's body); "python": the Python bool True (the fused
    op directly in the body). nested=True: each batch norm is a tf.function of its own that the block
    calls (calls inside a call). The block returns the batch statistics and tower 0 updates the
    moving averages from them, as raw_fused_bn does (updates inside the block would run in every
    tower)."""
    def variables(i):
        with tf1.variable_scope(f"bn{i}"):
            return (tf1.get_variable("gamma", [4], initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=i)),
                    tf1.get_variable("beta", [4], initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=i + 2)),
                    tf1.get_variable("moving_mean", [4], initializer=tf1.zeros_initializer(), trainable=False),
                    tf1.get_variable("moving_variance", [4], initializer=tf1.ones_initializer(), trainable=False))

    def batch_norm(x, on, gamma, beta, moving_mean, moving_variance):
        def train():
            return tf1.nn.fused_batch_norm(x, gamma, beta, epsilon=1e-3, is_training=True)

        def infer():
            return tf1.nn.fused_batch_norm(x, gamma, beta, moving_mean, moving_variance, epsilon=1e-3,
                                           is_training=False)
        return train() if on is True else tf.cond(on, train, infer)

    def model(x):
        params = [variables(i) for i in range(depth)]
        kernels = [tf1.get_variable(f"conv{i}/w", [3, 3, 4, 4], tf.float32, tf1.glorot_uniform_initializer(seed=i))
                   for i in range(depth)]
        norm = tf.function(batch_norm) if nested else batch_norm

        @tf.function
        def block(h, on):
            statistics = []
            for i in range(depth):
                h, mean, variance = norm(h, on, *params[i])
                statistics += [mean, variance]
                h = tf.nn.conv2d(tf.nn.relu(h), kernels[i], 1, "SAME")
            return h, statistics

        h, statistics = block(models._conv(x, 4, "stem"), True if training == "python" else is_training(x.graph))
        updates = []
        for (_, _, moving_mean, moving_variance), mean, variance in zip(params, statistics[::2], statistics[1::2]):
            updates += [moving_mean.assign(moving_mean * 0.9 + mean * 0.1),
                        moving_variance.assign(moving_variance * 0.9 + variance * 0.1)]
        return models._head(h), updates
    model.flag = is_training
    return model


def keras_function_block(depth=2):
    """tf_keras layers built once per graph, the batch norms called with training=is_training inside
    one tf.function that every tower calls (an If inside each tower's StatefulPartitionedCall). Keras
    updates the moving averages inside the call, so every tower updates them (from the same global
    statistics once synchronized): compare them with care."""
    import tf_keras
    per_graph = {}

    def model(x):
        if x.graph not in per_graph:
            init = tf_keras.initializers.GlorotUniform(seed=1)
            layers = {"stem": tf_keras.layers.Conv2D(4, 3, padding="same", use_bias=False, kernel_initializer=init),
                      "head": tf_keras.layers.Dense(5, kernel_initializer=init)}
            layers["stem"].build(x.shape)
            layers["head"].build((None, 4))
            for i in range(depth):
                layers[f"bn{i}"] = tf_keras.layers.BatchNormalization(
                    gamma_initializer=tf_keras.initializers.RandomUniform(0.5, 1.5, seed=i))
                layers[f"conv{i}"] = tf_keras.layers.Conv2D(4, 3, padding="same", use_bias=False,
                                                             kernel_initializer=init)
                layers[f"bn{i}"].build((None,) + tuple(x.shape[1:3]) + (4,))
                layers[f"conv{i}"].build((None,) + tuple(x.shape[1:3]) + (4,))

            @tf.function
            def block(h, training):
                for i in range(depth):
                    h = layers[f"conv{i}"](tf.nn.relu(layers[f"bn{i}"](h, training=training)))
                return h
            per_graph[x.graph] = layers, block
        layers, block = per_graph[x.graph]
        h = block(layers["stem"](x), is_training(x.graph))
        return layers["head"](tf.reduce_mean(h, [1, 2])), []
    model.flag = is_training
    return model
