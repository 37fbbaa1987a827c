"""A TF1 between-graph worker, as such scripts are written: one process per task, its cluster and
task from TF_CONFIG, its own tf.distribute.Server, its own graph with one (unscoped) tower, its own
shard of the data, a plain Session on its server. It knows nothing of graphsync:

    TF_CONFIG='{"cluster": {"worker": ["localhost:2222", "localhost:2223"]},
                "task": {"type": "worker", "index": 0}}' python examples/train_between_graph.py

Each worker keeps its own copy of the variables here (a real job shares them through a ps task or
averages the gradients; graphsync leaves that to the script): under `graphsync run` the workers'
batch norms normalize with the statistics of both shards, so their moving means agree; under
plain python each uses its own shard's.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()


def batch_norm(x, name):
    """A fused batch norm with its moving averages in UPDATE_OPS."""
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
    return y, moving_mean


def conv(x, channels, name, seed):
    kernel = tf1.get_variable(name, [3, 3, x.shape[-1], channels], initializer=tf1.glorot_uniform_initializer(seed=seed))
    return tf.nn.conv2d(x, kernel, 1, "SAME")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=8, help="examples per worker")
    args = parser.parse_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    job, index = tf_config["task"]["type"], tf_config["task"]["index"]
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    server = tf.distribute.Server(cluster, job_name=job, task_index=index)

    rng = np.random.RandomState(0)   # the whole data set; this worker takes its shard
    images = rng.randn(cluster.num_tasks(job) * args.batch_size, 16, 16, 3).astype(np.float32)
    images += np.linspace(-1, 1, len(images), dtype=np.float32)[:, None, None, None]   # shards differ
    labels = rng.randint(0, 10, len(images)).astype(np.int32)
    shard = slice(index * args.batch_size, (index + 1) * args.batch_size)

    with tf.device(f"/job:{job}/task:{index}"):
        h, bn1_mean = batch_norm(conv(tf.constant(images[shard]), 8, "conv1", 1), "bn1")
        h, _ = batch_norm(conv(tf.nn.relu(h), 16, "conv2", 2), "bn2")
        weights = tf1.get_variable("logits", [16, 10], initializer=tf1.glorot_uniform_initializer(seed=3))
        logits = tf.matmul(tf.reduce_mean(tf.nn.relu(h), [1, 2]), weights)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[shard], logits=logits))
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)

    with tf1.Session(server.target) as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(1, args.steps + 1):
            _, step_loss = sess.run([train_op, loss])
            print(f"{job}:{index} step {step}: loss {step_loss:.3f}, bn1 moving mean "
                  f"{' '.join(f'{m:+.3f}' for m in np.round(sess.run(bn1_mean)[:3], 3) + 0.0)} …", flush=True)


if __name__ == "__main__":
    main()
