"""An unchanged between-graph worker script, as TF1 users write them: its cluster and task from
TF_CONFIG, its own tf.distribute.Server, its own graph with its own towers (one unscoped tower by
default), a plain Session on the server, one training step on its shard of the batch; then what
it computed saved to OUT (.npz). tests/test_between_graph.py runs it under `graphsync run` and
under plain python.

    TF_CONFIG='{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 1}}' \\
        python between_graph_train.py OUT [--sizes 3,5] [--towers 1] [--channels 4] [--v1] [--flag] [--handwritten] [--decoder]

--v1: tf.compat.v1.disable_v2_behavior() first, as tf_cnn_benchmarks and many TF1 scripts do.

--flag: the batch norms read an `is_training` placeholder (fused, so each is a tf.cond), fed False
in an evaluation pass before the training step (its outputs and losses saved as `eval_output`,
`eval_loss`) and True in the step itself.

--handwritten: the second batch norm written by hand (tf.math.reduce_variance, a mean, γ and β), a
batch statistic the rule finds rather than a layer.

--decoder: the second convolution a stride-2 transposed one (a Conv2DBackpropInput in the forward).

--sizes: examples per worker (per tower with --towers K: K numbers per worker, worker after worker).
The model: conv → batch norm → relu → conv → batch norm → relu → mean → dense, squared-error loss
summed over the examples, so the workers' summed gradients are those of one device on the whole
batch. `reference(sizes, towers)` is that one-device run (the test calls it in its own process).
"""
import argparse
import json
import os
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
tf.get_logger().setLevel("ERROR")
warnings.filterwarnings("ignore", category=UserWarning, message=".*is deprecated")

IMAGE = (6, 6, 3)
OUTPUTS = 5


def data(total):
    """The whole batch: examples whose mean drifts along it, so every shard's statistics differ."""
    rng = np.random.RandomState(0)
    x = rng.randn(total, *IMAGE).astype(np.float32) * 2 + np.linspace(-3, 3, total, dtype=np.float32)[:, None, None, None]
    return x, rng.randn(total, OUTPUTS).astype(np.float32)


def handwritten_norm(h, name):
    """A batch norm as some users write it: no layer, no moving statistics."""
    with tf1.variable_scope(name):
        gamma = tf1.get_variable("gamma", h.shape[-1:], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", h.shape[-1:], initializer=tf1.zeros_initializer())
    mean = tf.reduce_mean(h, [0, 1, 2])
    return (h - mean) * tf.math.rsqrt(tf.math.reduce_variance(h, [0, 1, 2]) + 1e-3) * gamma + beta


def model(x, channels, training=True, handwritten=False, decoder=False):
    init = tf1.glorot_uniform_initializer
    h = tf1.layers.conv2d(x, channels, 3, padding="same", use_bias=False, kernel_initializer=init(seed=1), name="conv1")
    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=training, name="bn1"))
    conv = tf1.layers.conv2d_transpose if decoder else tf1.layers.conv2d   # a decoder: up by 2
    h = conv(h, channels, 3, 2 if decoder else 1, padding="same", use_bias=False, kernel_initializer=init(seed=2),
             name="conv2")
    h = handwritten_norm(h, "bn2") if handwritten else tf1.layers.batch_normalization(h, training=training, name="bn2")
    h = tf.nn.relu(h)
    return tf1.layers.dense(tf.reduce_mean(h, [1, 2]), OUTPUTS, kernel_initializer=init(seed=3), name="head")


def build(sizes, channels, devices, scopes, training=True, handwritten=False, decoder=False):
    """Towers of `sizes` examples (one per device and scope), shared variables, summed gradients."""
    x, t = tf1.placeholder(tf.float32, [None, *IMAGE]), tf1.placeholder(tf.float32, [None, OUTPUTS])
    training = tf1.placeholder_with_default(True, [], name="is_training") if training == "flag" else training
    xs, ts = tf.split(x, sizes), tf.split(t, sizes)
    outputs, losses, tower_grads = [], [], []
    opt = tf1.train.GradientDescentOptimizer(0.1)
    for i, (device, scope) in enumerate(zip(devices, scopes)):
        with tf.device(device), tf1.name_scope(scope or None), tf1.variable_scope("model", reuse=i > 0):
            y = model(xs[i], channels, training, handwritten, decoder)
            loss = 0.5 * tf.reduce_sum(tf.square(y - ts[i]))
            outputs.append(y), losses.append(loss)
            tower_grads.append(opt.compute_gradients(loss))
    grads = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, scopes[0] or None)):
        train_op = opt.apply_gradients(grads)
    moving = sorted((v for v in tf1.global_variables() if "moving" in v.name), key=lambda v: v.name)
    return x, t, outputs, losses, [g for g, _ in grads], train_op, moving, training


def step(target, config, sizes, channels, devices, scopes, x_data, t_data, flag=False, handwritten=False,
         decoder=False):
    graph = tf.Graph()
    evaluation = {}
    with graph.as_default():
        x, t, outputs, losses, grads, train_op, moving, training = build(
            sizes, channels, devices, scopes, "flag" if flag else True, handwritten, decoder)
        with tf1.Session(target, config=config) as sess:
            sess.run(tf1.global_variables_initializer())
            feed = {x: x_data, t: t_data}
            if flag:
                eval_outputs, eval_losses = sess.run([outputs, losses], {**feed, training: False})
                evaluation = {"eval_output": np.concatenate(eval_outputs), "eval_loss": np.array(eval_losses)}
                feed[training] = True
            got_outputs, got_losses, got_grads = sess.run([outputs, losses, grads], feed)
            sess.run(train_op, feed)
            got_moving = sess.run(moving)
    return {"output": np.concatenate(got_outputs), "loss": np.array(got_losses),
            "grads": np.concatenate([g.ravel() for g in got_grads]),
            "moving": np.concatenate([m.ravel() for m in got_moving]), **evaluation}


def reference(sizes, channels=4, handwritten=False, decoder=False):
    """One device on the concatenated batch; `loss` per shard of `sizes`."""
    x, t = data(sum(sizes))
    config = tf1.ConfigProto(device_count={"CPU": 1})
    got = step("", config, [sum(sizes)], channels, ["/cpu:0"], [""], x, t, handwritten=handwritten, decoder=decoder)
    per_example = 0.5 * np.square(got["output"].astype(np.float64) - t).sum(1)
    got["loss"] = np.array([part.sum() for part in np.split(per_example, np.cumsum(sizes)[:-1])])
    return got


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sizes", default="3,5")
    parser.add_argument("--towers", type=int, default=1, help="towers per worker")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--v1", action="store_true", help="build the graph with TensorFlow 1 behaviour")
    parser.add_argument("--flag", action="store_true", help="batch norms behind an is_training placeholder")
    parser.add_argument("--handwritten", action="store_true", help="the second batch norm written by hand")
    parser.add_argument("--decoder", action="store_true",
                        help="the second convolution a transposed one (Conv2DBackpropInput), stride 2")
    parser.add_argument("--alone", action="store_true",
                        help="a session that sees only this task (plain, unsynchronized runs: a worker "
                             "that finished and exited must not keep the other's session from starting)")
    args = parser.parse_args()
    if args.v1:
        tf1.disable_v2_behavior()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    job, index = tf_config["task"]["type"], tf_config["task"]["index"]
    config = tf1.ConfigProto(device_count={"CPU": args.towers}, inter_op_parallelism_threads=2,
                             intra_op_parallelism_threads=1)
    server = tf.distribute.Server(tf.train.ClusterSpec(tf_config["cluster"]), job_name=job, task_index=index,
                                  config=config)
    sizes = [int(s) for s in args.sizes.split(",")]
    mine = sizes[index * args.towers:(index + 1) * args.towers]
    start = sum(sizes[:index * args.towers])
    x, t = data(sum(sizes))
    here = f"/job:{job}/task:{index}"
    devices = [f"{here}/cpu:{k}" for k in range(args.towers)]
    scopes = [""] if args.towers == 1 else [f"tower_{k}" for k in range(args.towers)]
    # A filter in the server's default config does not reach the session: the session's own does.
    session_config = tf1.ConfigProto(device_filters=[here]) if args.alone else None
    got = step(server.target, session_config, mine, args.channels, devices, scopes,
               x[start:start + sum(mine)], t[start:start + sum(mine)], args.flag, args.handwritten,
               args.decoder)
    np.savez(args.out, **got)
    print(f"{job}:{index} trained on {sum(mine)} examples", flush=True)


if __name__ == "__main__":
    main()
