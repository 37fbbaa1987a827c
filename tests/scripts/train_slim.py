"""A third-party trainer, unchanged: slim clones built the way model_deploy builds them, trained by
`tf_slim.learning.train` (a Supervisor loop that finalizes the graph and owns the session).

    python train_slim.py LOGDIR [--clones 2]

model_deploy (tensorflow/models' slim/deployment) is not in the tf_slim package; `build` follows
its deploy(): one `clone_<i>/` name scope per clone on its own device, variables shared, each
clone's loss divided by the number of clones, per-clone gradients summed, the first clone's
UPDATE_OPS grouped with the gradient update, and the total loss as the train tensor. The trained
variables are in LOGDIR's checkpoint.
"""
import argparse
import importlib
import importlib.util
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# tf_slim's batch_norm reaches TensorFlow's lazily loaded tf_keras.legacy_tf_layers, which tf_keras
# 2.21 ships as tf_keras.src.legacy_tf_layers (see tf-notes.md); up to TensorFlow 2.15 there is no
# tf_keras, and TensorFlow's own Keras serves tf_slim
if importlib.util.find_spec("tf_keras") is not None:
    for _name in ("", ".base", ".core", ".convolutional", ".normalization", ".pooling"):
        sys.modules.setdefault("tf_keras.legacy_tf_layers" + _name,
                               importlib.import_module("tf_keras.src.legacy_tf_layers" + _name))
import tf_slim as slim  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

CONFIG = tf1.ConfigProto(device_count={"CPU": 4}, inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
BATCH = 8


def data(seed=0):
    rng = np.random.RandomState(seed)
    images = rng.randn(BATCH, 8, 8, 3).astype(np.float32) + np.linspace(-2, 2, BATCH, dtype=np.float32)[:, None, None, None]
    return images, rng.randint(0, 5, BATCH).astype(np.int32)


def network(images):
    with slim.arg_scope([slim.conv2d], normalizer_fn=slim.batch_norm, biases_initializer=None,
                        normalizer_params={"is_training": True, "scale": True, "decay": 0.9}):
        h = slim.conv2d(images, 4, 3, scope="conv1", weights_initializer=tf1.glorot_uniform_initializer(seed=1))
        h = slim.conv2d(h, 6, 3, scope="conv2", weights_initializer=tf1.glorot_uniform_initializer(seed=2))
    return slim.fully_connected(tf.reduce_mean(h, [1, 2]), 5, activation_fn=None, scope="logits",
                                weights_initializer=tf1.glorot_uniform_initializer(seed=3))


def build(clones):
    """model_deploy's deploy() with `clones` clones: the train tensor."""
    images, labels = data()
    global_step = tf1.train.get_or_create_global_step()
    optimizer = tf1.train.GradientDescentOptimizer(0.5)
    per_clone = BATCH // clones
    clone_grads = []
    for i in range(clones):
        with tf1.name_scope(f"clone_{i}") as scope, tf.device(f"/cpu:{i}"), \
                tf1.variable_scope(tf1.get_variable_scope(), reuse=i > 0):
            logits = network(tf.constant(images[i * per_clone:(i + 1) * per_clone]))
            tf1.losses.sparse_softmax_cross_entropy(labels[i * per_clone:(i + 1) * per_clone], logits)
            clone_loss = tf.add_n(tf1.get_collection(tf1.GraphKeys.LOSSES, scope)) / clones
            clone_grads.append(optimizer.compute_gradients(clone_loss))
            if i == 0:
                first_scope = scope
    grads = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*clone_grads)]
    update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, first_scope)
    update_ops.append(optimizer.apply_gradients(grads, global_step=global_step))
    total_loss = tf.add_n(tf1.get_collection(tf1.GraphKeys.LOSSES), name="total_loss")
    with tf.control_dependencies([tf.group(*update_ops)]):
        return tf.identity(total_loss, name="train_op")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("--clones", type=int, default=2)
    args = parser.parse_args()
    train_tensor = build(args.clones)
    # save_interval_secs=0: the Supervisor's timer checkpoint would otherwise save "now", while the
    # one step runs, and on a loaded machine finish after the final save and become the latest
    loss = slim.learning.train(train_tensor, args.logdir, number_of_steps=1, session_config=CONFIG,
                               save_summaries_secs=3600, save_interval_secs=0, log_every_n_steps=1000)
    print(f"slim trained {args.clones} clone(s): loss {loss:.4f}")


if __name__ == "__main__":
    main()
