"""An unchanged MonitoredTrainingSession script whose towers call a tf.function backbone in graph
mode, its batch norms behind an `is_training` placeholder inside it (an If inside each tower's
StatefulPartitionedCall), a dense head outside: one training step fed True, then an evaluation
pass fed False.
tests/test_function_calls.py runs it under `graphsync run` and plain python.

    python train_function.py OUT [--sizes 3,5]

Saves OUT (.npz): the training step's outputs, the moving statistics after it and the evaluation
pass's outputs.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
CONFIG = tf1.ConfigProto(device_count={"CPU": 4}, inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)


def batch_norm(x, training, gamma, beta, moving_mean, moving_variance):
    return tf.cond(training, lambda: tf1.nn.fused_batch_norm(x, gamma, beta, epsilon=1e-3),
                   lambda: tf1.nn.fused_batch_norm(x, gamma, beta, moving_mean, moving_variance, epsilon=1e-3,
                                                   is_training=False))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sizes", default="3,5")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.RandomState(0)
    images = (rng.randn(sum(sizes), 8, 8, 3) + np.linspace(-2, 2, sum(sizes))[:, None, None, None]).astype(np.float32)
    targets = rng.randn(sum(sizes), 4).astype(np.float32)
    is_training = tf1.placeholder(tf.bool, [], name="is_training")
    with tf.device("/cpu:0"), tf1.variable_scope("net"):
        kernels = [tf1.get_variable(f"conv{i}", [3, 3, 3 if i == 0 else 4, 4],
                                    initializer=tf1.glorot_uniform_initializer(seed=i)) for i in range(2)]
        norms = [(tf1.get_variable(f"bn{i}/gamma", [4], initializer=tf1.ones_initializer()),
                  tf1.get_variable(f"bn{i}/beta", [4], initializer=tf1.zeros_initializer()),
                  tf1.get_variable(f"bn{i}/moving_mean", [4], initializer=tf1.zeros_initializer(), trainable=False),
                  tf1.get_variable(f"bn{i}/moving_variance", [4], initializer=tf1.ones_initializer(),
                                   trainable=False)) for i in range(2)]
        head = tf1.get_variable("head", [4, 4], initializer=tf1.glorot_uniform_initializer(seed=3))

    @tf.function
    def block(x, training):
        statistics = []
        for kernel, norm in zip(kernels, norms):
            x, mean, variance = batch_norm(tf.nn.conv2d(x, kernel, 1, "SAME"), training, *norm)
            x = tf.nn.relu(x)
            statistics += [mean, variance]
        return tf.reduce_mean(x, [1, 2]), statistics

    optimizer = tf1.train.GradientDescentOptimizer(0.1)
    tower_grads, outputs, feed, start = [], [], {}, 0
    for i, size in enumerate(sizes):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"):
            x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
            t = tf1.placeholder(tf.float32, [None, 4], name="targets")
            features, statistics = block(x, is_training)
            y = tf.matmul(features, head)   # fetched: a reader of the call's output, as losses are
            if i == 0:   # the CIFAR10 pattern: tower 0's moving averages
                updates = [v.assign(0.9 * v + 0.1 * s) for (_, _, *moving), pair in
                           zip(norms, (statistics[0:2], statistics[2:4])) for v, s in zip(moving, pair)]
            tower_grads.append(optimizer.compute_gradients(tf.reduce_sum(tf.square(y - t)) / sum(sizes)))
            outputs.append(y)
            feed[x], feed[t] = images[start:start + size], targets[start:start + size]
            start += size
    summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
    with tf.control_dependencies(updates):
        train_op = optimizer.apply_gradients(summed)
    moving = {v.name: v for v in tf1.global_variables() if "moving" in v.name}
    with tf1.train.MonitoredTrainingSession(config=CONFIG, log_step_count_steps=None, save_checkpoint_secs=None,
                                            save_summaries_steps=None) as sess:
        trained, _ = sess.run([outputs, train_op], {**feed, is_training: True})
        evaluated = sess.run(outputs, {**feed, is_training: False})
        saved = sess.run(moving)
    np.savez(args.out, training=np.concatenate(trained), evaluation=np.concatenate(evaluated),
             **{k.replace("/", "_"): v for k, v in saved.items()})
    print(f"trained one step on towers of {sizes}, evaluated {sum(sizes)} examples")


if __name__ == "__main__":
    main()
