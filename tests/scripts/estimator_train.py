"""An unchanged tf.estimator script, as its users write it up to TensorFlow 2.15 (TensorFlow 2.16
removed tf.estimator): a model_fn with a convolution, a tf.compat.v1.layers batch norm and a dense
head, trained by Estimator.train under RunConfig(train_distribute=MirroredStrategy) over N logical
CPUs; then the same steps with no strategy on the whole batch (the reference).

    python estimator_train.py OUT.npz [--devices N] [--steps S]

The input_fn gives each replica its own examples (N per-replica batches of --per-replica each
step, in order); the reference's batch is their concatenation. OUT.npz holds, for both runs, every
global variable after the steps (kernels, gamma, beta, the moving mean and variance).
"""
import argparse
import os
import tempfile

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--devices", type=int, default=2)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--per-replica", type=int, default=3)
args = parser.parse_args()

tf1 = tf.compat.v1
rng = np.random.RandomState(0)
EXAMPLES = args.devices * args.per_replica * args.steps
X = rng.randn(EXAMPLES, 6, 6, 3).astype(np.float32) * 2 + 1
Y = rng.randn(EXAMPLES, 4).astype(np.float32)


def model_fn(features, labels, mode):
    h = tf1.layers.conv2d(features, 4, 3, padding="same", use_bias=False,
                          kernel_initializer=tf1.glorot_uniform_initializer(seed=1), name="conv")
    h = tf1.layers.batch_normalization(h, training=mode == tf.estimator.ModeKeys.TRAIN, name="bn")
    out = tf1.layers.dense(tf1.layers.flatten(tf.nn.relu(h)), 4,
                           kernel_initializer=tf1.glorot_uniform_initializer(seed=2), name="head")
    loss = tf1.losses.mean_squared_error(labels, out, reduction=tf1.losses.Reduction.SUM) / EXAMPLES
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def train(devices: int, batch: int) -> dict:
    config = tf.estimator.RunConfig(
        model_dir=tempfile.mkdtemp(), tf_random_seed=0, save_checkpoints_steps=10 ** 6, save_summary_steps=None,
        train_distribute=tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(devices)]) if devices > 1 else None,
        session_config=tf1.ConfigProto(device_count={"CPU": max(devices, 1)}, inter_op_parallelism_threads=2,
                                       intra_op_parallelism_threads=1))
    estimator = tf.estimator.Estimator(model_fn, config=config)
    estimator.train(lambda: tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch), steps=args.steps)
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()
            if not name.startswith("global_step")}


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
strategy = train(args.devices, args.per_replica)
reference = train(1, args.per_replica * args.devices)
np.savez(args.out, **{f"strategy/{k}": v for k, v in strategy.items()},
         **{f"reference/{k}": v for k, v in reference.items()})
print(f"trained {len(strategy)} variables")
