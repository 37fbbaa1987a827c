"""Models whose batch norm sits behind a tensor-valued training flag, `model(x) -> (output, updates)`,
each with `flag(graph)`: the flag tensor the script would feed (True: train, False: evaluate).

    layers        tf.compat.v1.layers.batch_normalization(training=is_training), fused
    slim          tf_slim.batch_norm(is_training=is_training), fused
    keras-layer   tf_keras BatchNormalization layers called without training= (the learning phase)
    keras-model   a tf_keras functional model called without training= (the learning phase)
"""
from __future__ import annotations

import contextlib
import importlib
import sys

import tensorflow as tf

import models

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
    for name in ("", ".base", ".core", ".convolutional", ".normalization", ".pooling"):
        sys.modules.setdefault("tf_keras.legacy_tf_layers" + name,
                               importlib.import_module("tf_keras.src.legacy_tf_layers" + name))
    import tf_slim

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
