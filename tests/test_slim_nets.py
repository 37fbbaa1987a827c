"""tf_slim's nets, each as 2 uneven towers the way slim's model_deploy builds clones (one
`clone_<i>` name scope per tower, the variables created by the first and reused by the others):
inspect (plan_towers), rewrite, one training step. Anything but a rewrite or a one-line
GraphsyncError fails the test, and the towers' outputs must equal one device on the concatenated
batch: a third call of the same net on the whole batch, in the same graph and session (so with the
same variables), outside the towers, which graphsync leaves alone. In float64, as
tests/test_applications.py, for the same reason (float32 on small maps disagrees with itself);
the tolerance is 4× that device's own noise (the batch reordered), at least 1e-9.

Dropout is kept at 1 (in training mode it would make one device differ from itself). The default
run takes resnet_v2_50 and vgg_a (no batch norm: nothing to synchronize, the graph must train as
it did), CI's budget (inception_v2 took 60 s more); GRAPHSYNC_ALL_SLIM_NETS=1 takes all 16 nets
of tf_slim.nets (about 30 minutes on 2 cores). Measured 2026-12-03, every net rewritten, none refused (error against one
device; its own noise; unsynchronized):

    resnet_v1_50/101/152/200    53/104/155/203 layers   7.6e-14 / 7.1e-13 / 2.6e-12 / 8.9e-12;
                                noise up to 7.3e-12; unsynchronized 0.32–0.84
    resnet_v2_50/101/152/200    49/100/151/199 layers   3.7e-14 / 2.7e-13 / 2.4e-13 / 1.8e-12;
                                noise up to 1.2e-12; unsynchronized 0.27–0.75
    inception_v1, v2, v3        57, 68, 94 layers       7.5e-15, 1.2e-13, 1.4e-11; unsynchronized
                                0.14, 0.73, 1.2
    vgg_a/16/19, alexnet_v2, overfeat   no batch norm   ≤ 6.1e-15, as before the rewrite
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib as tl
import whole_models

tf1 = tf.compat.v1
slim = tl.import_tf_slim()
from tf_slim.nets import alexnet, inception, overfeat, resnet_v1, resnet_v2, vgg  # noqa: E402

pytestmark = pytest.mark.full   # the slim nets sweep

SIZES = [1, 2]

# name → (net function, its arg scope, input size, extra keyword arguments)
_RESNET = dict(global_pool=True)
_KEEP = dict(dropout_keep_prob=1.0)   # dropout in training mode: one device would differ from itself
_INCEPTION = dict(_KEEP, create_aux_logits=False)
NETS = {
    "resnet_v1_50": (resnet_v1.resnet_v1_50, resnet_v1.resnet_arg_scope, 64, _RESNET),
    "resnet_v1_101": (resnet_v1.resnet_v1_101, resnet_v1.resnet_arg_scope, 64, _RESNET),
    "resnet_v1_152": (resnet_v1.resnet_v1_152, resnet_v1.resnet_arg_scope, 64, _RESNET),
    "resnet_v1_200": (resnet_v1.resnet_v1_200, resnet_v1.resnet_arg_scope, 64, _RESNET),
    "resnet_v2_50": (resnet_v2.resnet_v2_50, resnet_v2.resnet_arg_scope, 64, _RESNET),
    "resnet_v2_101": (resnet_v2.resnet_v2_101, resnet_v2.resnet_arg_scope, 64, _RESNET),
    "resnet_v2_152": (resnet_v2.resnet_v2_152, resnet_v2.resnet_arg_scope, 64, _RESNET),
    "resnet_v2_200": (resnet_v2.resnet_v2_200, resnet_v2.resnet_arg_scope, 64, _RESNET),
    "inception_v1": (inception.inception_v1, inception.inception_v1_arg_scope, 224, _KEEP),
    "inception_v2": (inception.inception_v2, inception.inception_v2_arg_scope, 64, _KEEP),
    "inception_v3": (inception.inception_v3, inception.inception_v3_arg_scope, 96, _INCEPTION),
    "vgg_a": (vgg.vgg_a, vgg.vgg_arg_scope, 224, _KEEP),
    "vgg_16": (vgg.vgg_16, vgg.vgg_arg_scope, 224, _KEEP),
    "vgg_19": (vgg.vgg_19, vgg.vgg_arg_scope, 224, _KEEP),
    "alexnet_v2": (alexnet.alexnet_v2, alexnet.alexnet_v2_arg_scope, 224, _KEEP),
    "overfeat": (overfeat.overfeat, overfeat.overfeat_arg_scope, 231, _KEEP),
}
DEFAULT = ["resnet_v2_50", "vgg_a"]
NAMES = sorted(NETS) if os.environ.get("GRAPHSYNC_ALL_SLIM_NETS") == "1" else DEFAULT


def _build(name):
    net, arg_scope, size, kwargs = NETS[name]
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)

        def call(x, reuse):
            with tf1.variable_scope(tf1.get_variable_scope(), reuse=reuse), slim.arg_scope(arg_scope()):
                logits, _ = net(x, num_classes=3, is_training=True, **kwargs)
            return tf.reshape(logits, [tf.shape(x)[0], -1])

        inputs, outputs, losses = [], [], []
        for i, n in enumerate(SIZES):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"clone_{i}"):
                x = tf1.placeholder(tf.float64, (n, size, size, 3), name="x")
                y = call(x, reuse=i > 0)
                inputs.append(x), outputs.append(y), losses.append(tf.reduce_sum(tf.square(y)))
        with tf.device("/cpu:2"), tf1.name_scope("one_device"):
            whole = tf.concat(inputs, 0)
            order = np.random.RandomState(1).permutation(sum(SIZES))
            reference = call(whole, reuse=True)
            reordered = tf.gather(call(tf.gather(whole, order), reuse=True), np.argsort(order))
        opt = tf1.train.GradientDescentOptimizer(1e-3)
        grads = [opt.compute_gradients(loss) for loss in losses]
        pairs = [(tf.add_n([g[k][0] for g in grads]) / len(SIZES), grads[0][k][1])
                 for k in range(len(grads[0])) if grads[0][k][0] is not None]
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "clone_0")):
            train = opt.apply_gradients(pairs)
        init = tf1.global_variables_initializer()
    return graph, inputs, outputs, (reference, reordered), train, init, size


@pytest.mark.parametrize("name", NAMES)
def test_slim_net_rewrites_and_equals_one_device(name):
    whole_models.check(name, _build(name), SIZES, DEFAULT, refusals_allowed=False)
