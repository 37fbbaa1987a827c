"""Decoders that upsample by transposed convolution, each `model(x) -> (output, update_ops)`.

In the forward pass a transposed convolution *is* a gradient kernel's type (`Conv2DBackpropInput`,
`Conv3DBackpropInputV2`, `DepthwiseConv2dNativeBackpropInput`): these models hold one before every
normalization form graphsync supports, in the spellings of tf.layers, tf.nn and Keras, so that a
backward told by op type rather than by what the gradient reaches is caught (tests/test_decoders.py).
"""
from __future__ import annotations

import tensorflow as tf

import handwritten_models
import models

tf1 = tf.compat.v1


def _init(name):
    return tf1.glorot_uniform_initializer(seed=len(name))


def _up(x, channels, name, kind, stride, keras_layers):
    """One transposed convolution of `kind` over x (NHWC, NDHWC or NWC by rank)."""
    n, rank = tf.shape(x)[0], x.shape.rank
    spatial = x.shape[1:-1].as_list()
    cin = x.shape[-1]
    out_spatial = [s * stride for s in spatial]
    if kind == "layers":
        if rank == 4:
            return tf1.layers.conv2d_transpose(x, channels, 3, stride, "same", use_bias=False,
                                               kernel_initializer=_init(name), name=name)
        return tf1.layers.conv3d_transpose(x, channels, 3, stride, "same", use_bias=False,
                                           kernel_initializer=_init(name), name=name)
    if kind == "keras":   # one layer object for every tower: Keras shares weights by object, not by scope
        if name not in keras_layers:
            keras_layers[name] = _built((tf.keras.layers.Conv2DTranspose if rank == 4 else
                                         tf.keras.layers.Conv3DTranspose)(
                channels, 3, stride, "same", use_bias=False, kernel_initializer=_init(name), name=name), x)
        return keras_layers[name](x)
    if kind == "depthwise":   # tf.nn's depthwise transposed convolution: channels × 1
        w = tf1.get_variable(name + "/w", [3, 3, cin, 1], x.dtype, _init(name))
        shape = tf.stack([n] + out_spatial + [cin])
        return tf.nn.depthwise_conv2d_backprop_input(shape, w, x, [1, stride, stride, 1], "SAME")
    w = tf1.get_variable(name + "/w", [3] * (rank - 2) + [channels, cin], x.dtype, _init(name))
    shape = tf.stack([n] + out_spatial + [channels])
    return tf.nn.conv_transpose(x, w, shape, stride, "SAME")   # 1-, 2- and 3-D: tf.nn's own


def _built(layer, x):
    """`layer` with its variables made outside any tower's name scope, named as in the reference."""
    with x.graph.name_scope(None):
        layer.build(x.shape)
    return layer


def _normalize(h, name, form, updates, keras_layers):
    """`form`: fused, layers-moments, keras, moments, handwritten."""
    gamma = tf1.random_uniform_initializer(0.5, 1.5, seed=len(name))
    if form in ("fused", "layers-moments"):
        before = set(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
        h = tf1.layers.batch_normalization(h, training=True, fused=form == "fused" and h.shape.rank == 4,
                                           name=name, gamma_initializer=gamma)
        updates += [u for u in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if u not in before]
        return h
    if form == "keras":
        if name not in keras_layers:
            keras_layers[name] = _built(tf.keras.layers.BatchNormalization(name=name, gamma_initializer=gamma), h)
        layer = keras_layers[name]
        h = layer(h, training=True)
        updates += layer.updates
        return h
    if form == "moments":
        h, up = models.seed_bn(h, name)
    else:
        h, up = handwritten_models.FORMS["sub-square"](h, name)
    updates += up
    return h


def decoder(form="fused", kind="nn", rank=4, stride=2, skip=True):
    """conv (strided by `stride`) → BN → transposed conv back up (`kind`) → BN → [concat encoder] → conv."""

    keras_layers = {}

    def model(x):
        if x.graph not in keras_layers:   # a new graph (each test builds towers and a reference)
            keras_layers.clear()
            keras_layers[x.graph] = True
        updates = []
        h = x
        if rank == 3:
            h = tf.reshape(x, [-1, x.shape[1] * x.shape[2], x.shape[3]])
        elif rank == 5:
            h = tf.reshape(x, [-1, x.shape[1], x.shape[2] // 2, 2, x.shape[3]])
        w = tf1.get_variable("enc/w", [3] * (rank - 2) + [h.shape[-1], 4], x.dtype, _init("enc"))
        e = tf.nn.convolution(h, w, strides=stride, padding="SAME")
        e = tf.nn.relu(_normalize(e, "bn_enc", form, updates, keras_layers))
        d = _up(e, 4, "up", kind, stride, keras_layers)
        d = tf.nn.relu(_normalize(d, "bn_dec", form, updates, keras_layers))
        if skip:
            w0 = tf1.get_variable("skip/w", [1] * (rank - 2) + [h.shape[-1], 2], x.dtype, _init("skip"))
            d = tf.concat([d, tf.nn.convolution(h, w0, padding="SAME")], -1)
        w2 = tf1.get_variable("out/w", [1] * (rank - 2) + [d.shape[-1], 2], x.dtype, _init("out"))
        y = tf.nn.convolution(d, w2, padding="SAME")
        return tf.reshape(y, [-1, int(y.shape[1:].num_elements())]), updates

    return model
