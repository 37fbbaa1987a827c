"""Saves the training graph tensorpack 0.11's multi-GPU trainers build, without training: as the
ImageNet example's ResNet does, inputs come from a TensorInput of random tensors (images in
[0, 255), integer labels) and pass through `image_preprocess` (cast, (x − mean) / std) before the
first convolution. tensorpack calls the TensorInput in every tower under the scope it cached in
the first, so every tower's random inputs sit in tower0/TensorInput/ while tower1 reads them from
tower1/image_preprocess/. tests/test_tensorpack_verify.py runs `graphsync verify` on these graphs.

    python export_tensorpack.py OUT [--trainer replicated|ps]... [--towers 2] [--blocks 5]

Writes OUT/<trainer>.meta. The network: conv0 → BatchNorm → relu, then `--blocks` blocks of two
3×3 convolutions with a BatchNorm after each (block1/conv1/bn, block1/conv2/bn, …: with 5 blocks
11 batch norms whose names sort apart from the order they run in), global pooling, dense.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

from tensorpack import BatchNorm, Conv2D, FullyConnected, GlobalAvgPooling, ModelDesc  # noqa: E402
from tensorpack_export import TRAINERS, export  # noqa: E402

PER_TOWER = 4
SIZE = 8
CLASSES = 5


class Model(ModelDesc):
    def __init__(self, blocks):
        self.blocks = blocks

    def inputs(self):
        return [tf.TensorSpec((None, SIZE, SIZE, 3), tf.float32, "input"), tf.TensorSpec((None,), tf.int32, "label")]

    def build_graph(self, image, label):
        with tf.name_scope("image_preprocess"):
            image = tf.cast(image, tf.float32)
            image = (image - tf.constant([123.7, 116.3, 103.5]) * 1.0) / tf.constant([58.4, 57.1, 57.4])
        seed = iter(range(1, 100))
        h = Conv2D("conv0", image, 4, 3, use_bias=False, kernel_initializer=tf1.glorot_uniform_initializer(seed=next(seed)))
        h = tf.nn.relu(BatchNorm("conv0/bn", h))
        for block in range(1, self.blocks + 1):
            with tf1.variable_scope(f"block{block}"):
                for conv in (1, 2):
                    h = Conv2D(f"conv{conv}", h, 4, 3, use_bias=False,
                               kernel_initializer=tf1.glorot_uniform_initializer(seed=next(seed)))
                    h = tf.nn.relu(BatchNorm(f"conv{conv}/bn", h))
        logits = FullyConnected("linear", GlobalAvgPooling("gap", h), CLASSES,
                                kernel_initializer=tf1.glorot_uniform_initializer(seed=next(seed)))
        cost = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label, logits=logits)
        return tf.reduce_mean(cost, name="xentropy-loss")

    def optimizer(self):
        return tf1.train.MomentumOptimizer(0.1, 0.9)


def random_inputs():
    """What a user benchmarking the ImageNet example's input-free speed writes."""
    return [tf1.random_uniform([PER_TOWER, SIZE, SIZE, 3], 0, 255, seed=1),
            tf1.random_uniform([PER_TOWER], 0, CLASSES, tf.int32, seed=2)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--trainer", action="append", choices=sorted(TRAINERS))
    parser.add_argument("--towers", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    export(args.out, args.trainer, args.towers, lambda: Model(args.blocks), random_inputs)

if __name__ == "__main__":
    main()
