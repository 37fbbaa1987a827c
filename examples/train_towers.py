"""A TF1 multi-tower training script, as such scripts are written: the CIFAR10 multi-GPU pattern
(one name scope per tower, shared variables, per-tower gradients averaged, tower 0's batch-norm
updates run with the train op) in a MonitoredTrainingSession loop. It knows nothing of graphsync:

    python examples/train_towers.py --steps 3              # per-tower batch statistics
    graphsync run examples/train_towers.py --steps 3       # statistics of the whole batch
"""
import argparse

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()


def batch_norm(x, name):
    """A fused batch norm with its moving averages in UPDATE_OPS, as tf_cnn_benchmarks writes it."""
    channels = x.shape[-1]
    with tf1.variable_scope(name):
        gamma = tf1.get_variable("gamma", [channels], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer())
        moving_mean = tf1.get_variable("moving_mean", [channels], initializer=tf1.zeros_initializer(), trainable=False)
        moving_var = tf1.get_variable("moving_variance", [channels], initializer=tf1.ones_initializer(),
                                      trainable=False)
    y, mean, variance = tf1.nn.fused_batch_norm(x, gamma, beta, is_training=True, name=name)
    for average, value in ((moving_mean, mean), (moving_var, variance)):
        tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, average.assign(0.9 * average + 0.1 * value))
    return y


def conv(x, channels, name, seed):
    kernel = tf1.get_variable(name, [3, 3, x.shape[-1], channels],
                              initializer=tf1.glorot_uniform_initializer(seed=seed))
    return tf.nn.conv2d(x, kernel, 1, "SAME")


def tower_loss(images, labels):
    h = tf.nn.relu(batch_norm(conv(images, 8, "conv1", 1), "bn1"))
    h = tf.nn.relu(batch_norm(conv(h, 16, "conv2", 2), "bn2"))
    weights = tf1.get_variable("logits", [16, 10], initializer=tf1.glorot_uniform_initializer(seed=3))
    logits = tf.matmul(tf.reduce_mean(h, [1, 2]), weights)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--towers", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=8, help="examples per tower")
    args = parser.parse_args()

    rng = np.random.RandomState(0)
    images = rng.randn(args.towers * args.batch_size, 16, 16, 3).astype(np.float32)
    images += np.linspace(-1, 1, len(images), dtype=np.float32)[:, None, None, None]   # towers see different data
    labels = rng.randint(0, 10, len(images)).astype(np.int32)

    global_step = tf1.train.get_or_create_global_step()
    optimizer = tf1.train.GradientDescentOptimizer(0.1)
    tower_grads, losses = [], []
    for i in range(args.towers):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                tf1.variable_scope(tf1.get_variable_scope(), reuse=i > 0):
            part = slice(i * args.batch_size, (i + 1) * args.batch_size)
            loss = tower_loss(tf.constant(images[part]), tf.constant(labels[part]))
            losses.append(loss)
            tower_grads.append(optimizer.compute_gradients(loss))
    averaged = [(tf.add_n([g for g, _ in gv]) / args.towers, gv[0][1]) for gv in zip(*tower_grads)]
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0")):
        train_op = optimizer.apply_gradients(averaged, global_step=global_step)
    mean_loss = tf.add_n(losses) / args.towers

    config = tf1.ConfigProto(device_count={"CPU": args.towers})
    hooks = [tf1.train.StopAtStepHook(last_step=args.steps)]
    with tf1.train.MonitoredTrainingSession(hooks=hooks, config=config) as sess:
        step = 0
        while not sess.should_stop():
            _, loss = sess.run([train_op, mean_loss])
            step += 1
            print(f"step {step}: loss {loss:.3f}")


if __name__ == "__main__":
    main()
