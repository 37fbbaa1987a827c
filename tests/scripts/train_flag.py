"""An unchanged MonitoredTrainingSession script whose batch norms sit behind an `is_training`
placeholder (tf.compat.v1.layers, fused): one training step fed True, then an evaluation pass fed
False. tests/test_conditional_run.py runs it under `graphsync run` and plain python.

    python train_flag.py OUT [--sizes 3,5] [--v1]

Saves OUT (.npz): the moving statistics after the step and the evaluation pass's outputs.
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sizes", default="3,5")
    parser.add_argument("--v1", action="store_true")
    args = parser.parse_args()
    if args.v1:
        tf1.disable_control_flow_v2()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.RandomState(0)
    images = (rng.randn(sum(sizes), 8, 8, 3) + np.linspace(-2, 2, sum(sizes))[:, None, None, None]).astype(np.float32)
    targets = rng.randn(sum(sizes), 4).astype(np.float32)
    is_training = tf1.placeholder(tf.bool, [], name="is_training")
    optimizer = tf1.train.GradientDescentOptimizer(0.1)
    tower_grads, outputs, feed, start = [], [], {}, 0
    for i, size in enumerate(sizes):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), tf1.variable_scope("net", reuse=i > 0):
            x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
            t = tf1.placeholder(tf.float32, [None, 4], name="targets")
            h = tf1.layers.conv2d(x, 4, 3, padding="same", use_bias=False, name="conv1",
                                  kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
            h = tf.nn.relu(tf1.layers.batch_normalization(h, training=is_training, fused=True, name="bn1"))
            h = tf1.layers.conv2d(h, 4, 3, padding="same", use_bias=False, name="conv2",
                                  kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
            h = tf1.layers.batch_normalization(h, training=is_training, fused=True, name="bn2")
            y = tf.reduce_mean(h, [1, 2])
            tower_grads.append(optimizer.compute_gradients(tf.reduce_sum(tf.square(y - t)) / sum(sizes)))
            outputs.append(y)
            feed[x], feed[t] = images[start:start + size], targets[start:start + size]
            start += size
    summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0")):
        train_op = optimizer.apply_gradients(summed)
    moving = {v.name: v for v in tf1.global_variables()}
    with tf1.train.MonitoredTrainingSession(config=CONFIG, log_step_count_steps=None, save_checkpoint_secs=None,
                                            save_summaries_steps=None) as sess:
        sess.run(train_op, {**feed, is_training: True})
        evaluated = sess.run(outputs, {**feed, is_training: False})
        saved = sess.run(moving)
    np.savez(args.out, evaluation=np.concatenate(evaluated), **{k.replace("/", "_"): v for k, v in saved.items()})
    print(f"trained one step on towers of {sizes}, evaluated {sum(sizes)} examples")


if __name__ == "__main__":
    main()
