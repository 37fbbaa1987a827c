"""Saves the training graph of tensorpack's ImageNet ResNet example (examples/ResNet/imagenet-resnet.py
with resnet_model.py and imagenet_utils.py, which the pip package leaves out) as a multi-GPU trainer
builds it, without training. Written after the example, small where it is free to be:

    resnet18 (basic blocks [2, 2, 2, 2], 64…512 channels, zero-initialized γ on each block's last
    batch norm, 1×1 shortcut convolutions with a batch norm where the width changes), NHWC, 1000
    classes; uint8 images through `image_preprocess` (cast, (x − mean·255) / (std·255), BGR);
    cross entropy `xentropy-loss`, weight decay 1e-4 on every `…/W` (`l2_regularize_loss`),
    `cost` = their sum; moving summaries of both losses and of the top-1 / top-5 training
    errors (tensorpack's `add_moving_summary`: EMAs kept by tower 0 only); Nesterov momentum on a
    `learning_rate` variable.

Every initializer is unseeded, as in the example: under the replicated trainer each tower's copy
of a variable draws its own values, and the trainer's `sync_variables_from_main_tower` copies the
main tower's into them before the first step. The inputs are a TensorInput of random tensors
(uint8 images, integer labels), as a user measuring the example's speed without data writes.

    python export_imagenet_resnet.py OUT [--trainer replicated|ps]... [--towers 2] [--size 64] [--batch 2]

Writes OUT/<trainer>.meta.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

from tensorpack import (  # noqa: E402
    BatchNorm, BNReLU, Conv2D, FullyConnected, GlobalAvgPooling, LinearWrap, MaxPooling, ModelDesc, argscope)
from tensorpack.models import regularize_cost  # noqa: E402
from tensorpack.tfutils.summary import add_moving_summary  # noqa: E402
from tensorpack_export import TRAINERS, export  # noqa: E402

CLASSES = 1000
WEIGHT_DECAY = 1e-4


def _batch_norm(zero_gamma: bool):
    if zero_gamma:
        return lambda x, name=None: BatchNorm("bn", x, gamma_initializer=tf1.zeros_initializer())
    return lambda x, name=None: BatchNorm("bn", x)


def _shortcut(x, channels, stride):
    if x.shape[3] != channels:
        return Conv2D("convshortcut", x, channels, 1, strides=stride, activation=_batch_norm(False))
    return x


def _basic_block(x, channels, stride):
    y = Conv2D("conv1", x, channels, 3, strides=stride, activation=BNReLU)
    y = Conv2D("conv2", y, channels, 3, activation=_batch_norm(True))
    return tf.nn.relu(y + _shortcut(x, channels, stride))


def _group(x, name, channels, count, stride):
    with tf1.variable_scope(name):
        for i in range(count):
            with tf1.variable_scope(f"block{i}"):
                x = _basic_block(x, channels, stride if i == 0 else 1)
    return x


def _incorrect(logits, label, k, name):
    with tf.name_scope("prediction_incorrect"):
        wrong = tf.logical_not(tf.nn.in_top_k(predictions=logits, targets=label, k=k))
    return tf.cast(wrong, tf.float32, name=name)


class Model(ModelDesc):
    def __init__(self, size):
        self.size = size

    def inputs(self):
        return [tf.TensorSpec((None, self.size, self.size, 3), tf.uint8, "input"),
                tf.TensorSpec((None,), tf.int32, "label")]

    def image_preprocess(self, image):
        with tf.name_scope("image_preprocess"):
            image = tf.cast(image, tf.float32)
            mean = [0.485, 0.456, 0.406][::-1]   # BGR
            std = [0.229, 0.224, 0.225][::-1]
            return (image - tf.constant(mean, tf.float32) * 255.0) / (tf.constant(std, tf.float32) * 255.0)

    def get_logits(self, image):
        with argscope([Conv2D, MaxPooling, GlobalAvgPooling, BatchNorm], data_format="NHWC"), \
                argscope(Conv2D, use_bias=False,
                         kernel_initializer=tf1.variance_scaling_initializer(scale=2.0, mode="fan_out")):
            return (LinearWrap(image)
                    .Conv2D("conv0", 64, 7, strides=2, activation=BNReLU)
                    .MaxPooling("pool0", 3, strides=2, padding="SAME")
                    .apply(_group, "group0", 64, 2, 1)
                    .apply(_group, "group1", 128, 2, 2)
                    .apply(_group, "group2", 256, 2, 2)
                    .apply(_group, "group3", 512, 2, 2)
                    .GlobalAvgPooling("gap")
                    .FullyConnected("linear", CLASSES)())

    def build_graph(self, image, label):
        logits = self.get_logits(self.image_preprocess(image))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(logits=logits, labels=label),
                              name="xentropy-loss")
        add_moving_summary(tf.reduce_mean(_incorrect(logits, label, 1, "wrong-top1"), name="train-error-top1"))
        add_moving_summary(tf.reduce_mean(_incorrect(logits, label, 5, "wrong-top5"), name="train-error-top5"))
        # tf.contrib.layers.l2_regularizer(scale), which TensorFlow 2 no longer has
        wd_loss = regularize_cost(".*/W", lambda w: tf.multiply(WEIGHT_DECAY, tf.nn.l2_loss(w)),
                                  name="l2_regularize_loss")
        add_moving_summary(loss, wd_loss)
        return tf.add_n([loss, wd_loss], name="cost")

    def optimizer(self):
        lr = tf1.get_variable("learning_rate", initializer=0.1, trainable=False)
        tf1.summary.scalar("learning_rate-summary", lr)
        return tf1.train.MomentumOptimizer(lr, 0.9, use_nesterov=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--trainer", action="append", choices=sorted(TRAINERS))
    parser.add_argument("--towers", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()

    def random_inputs():
        image = tf.cast(tf1.random_uniform([args.batch, args.size, args.size, 3], 0, 256), tf.uint8)
        return [image, tf1.random_uniform([args.batch], 0, CLASSES, tf.int32)]

    export(args.out, args.trainer, args.towers, lambda: Model(args.size), random_inputs)

if __name__ == "__main__":
    main()
