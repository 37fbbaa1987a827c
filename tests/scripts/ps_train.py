"""A between-graph job the way tf_cnn_benchmarks runs its distributed modes, unchanged TF1 code
(disable_v2_behavior(): ref variables, v1 control flow, TensorShapes of Dimensions): a ps task
that only joins its server, worker tasks that each build their own graph and train on their shard.

    TF_CONFIG='{"cluster": {"ps": [...], "worker": [...]}, "task": {"type": "worker", "index": 1}}' \\
        python ps_train.py OUT [--mode parameter_server] [--sizes 3,5] [--steps 3]

--mode parameter_server:       the variables live on the ps (tf.train.replica_device_setter, read
                               through a caching device on the worker); each worker applies its
                               own gradients to them: asynchronous updates, kept in step only by
--mode distributed_replicated: each worker trains local copies (LOCAL_VARIABLES, as are its
                               moving statistics) of the ps variables; its gradients go to the ps copies, which it reads back
                               after every step
these two:                     the global step on the ps, incremented after every step's fetches;
                               sync queues on the ps (tf_cnn_benchmarks' add_sync_queues_and_barrier)
                               after the initialization and at the end of every step; a
                               tf.train.Supervisor whose chief initializes the ps variables
--mode collective_all_reduce:  every op of the step on the worker (variables, global step); the
                               gradients summed across the workers by the script's own
                               CollectiveReduceV2 (tf_cnn_benchmarks' collective_all_reduce); the ps
                               only joins; every worker its own Supervisor chief
all:                           every worker's extra fetches (the global step) before and after the loop.

Each worker saves per step its batch norms' batch statistics and its loss, and the trained
variables and the batch norms' moving means and variances after the last step (OUT, .npz; in
parameter_server mode the moving statistics live on the ps, shared by the workers, and are read
once every worker's last step passed the step-end sync queues). `reference(sizes, steps)` is one
device on the concatenated batch: summed losses, so the workers' applied gradients add up to the
one-device gradient.
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
tf.get_logger().setLevel("ERROR")
warnings.filterwarnings("ignore", category=UserWarning, message=".*is deprecated")

IMAGE = (6, 6, 3)
OUTPUTS = 5
LEARNING_RATE = 0.05
MOVING = 4   # variables: the two batch norms' moving mean and variance, saved last


def data(total, step):
    """Step `step`'s whole batch: examples whose mean drifts along it (every shard differs)."""
    rng = np.random.RandomState(step)
    x = rng.randn(total, *IMAGE).astype(np.float32) * 2 + np.linspace(-3, 3, total, dtype=np.float32)[:, None, None, None]
    return x, rng.randn(total, OUTPUTS).astype(np.float32)


def model(x):
    """conv → BN → relu → conv → BN → relu → mean → dense; returns the output, each batch
    norm's batch (mean, variance) as the layers after it see them, and its moving mean and
    variance (the variables)."""
    init = tf1.glorot_uniform_initializer
    h, stats, moving = x, [], []
    for i in (1, 2):
        h = tf1.layers.conv2d(h, 4, 3, padding="same", use_bias=False, kernel_initializer=init(seed=i), name=f"conv{i}")
        layer = tf1.layers.BatchNormalization(name=f"bn{i}", fused=True)
        h = layer(h, training=True)
        fused = h.op if h.op.type.startswith("FusedBatchNorm") else h.op.inputs[0].op
        stats += [tf.identity(fused.outputs[1]), tf.identity(fused.outputs[2])]
        moving += [layer.moving_mean, layer.moving_variance]
        h = tf.nn.relu(h)
    y = tf1.layers.dense(tf.reduce_mean(h, [1, 2]), OUTPUTS, kernel_initializer=init(seed=3), name="head")
    return y, stats, moving


class CachingGetter:
    """tf_cnn_benchmarks' OverrideCachingDevice: ps variables read through a copy on the worker."""

    def __init__(self, device):
        self.device = device

    def __call__(self, getter, *args, **kwargs):
        kwargs["caching_device"] = self.device
        return getter(*args, **kwargs)


def sync_queues_and_barrier(name, after, workers, index, device):
    """tf_cnn_benchmarks' add_sync_queues_and_barrier: one FIFOQueue per worker on the ps; each
    worker puts a token in every other worker's queue once `after` ran, then takes one token from
    each other worker out of its own."""
    with tf1.device(device):
        queues = [tf1.FIFOQueue(workers, [tf.bool], shapes=[[]], shared_name=f"{name}{i}") for i in range(workers)]
        token = tf.constant(False)
        with tf.control_dependencies(after):
            ops = [tf.no_op() if i == index else q.enqueue(token) for i, q in enumerate(queues)]
        ops.append(queues[index].dequeue_many(workers - 1))
        return tf.group(*ops)


def build_collective(workers, index):
    """collective_all_reduce: local variables (the same seeds on every worker), gradients summed by
    one CollectiveReduceV2 each, the global step local too."""
    here = f"/job:worker/replica:0/task:{index}/cpu:0"
    with tf1.device(here):
        x, t = tf1.placeholder(tf.float32, [None, *IMAGE]), tf1.placeholder(tf.float32, [None, OUTPUTS])
        global_step = tf1.train.get_or_create_global_step()
        with tf1.variable_scope("v"):
            y, stats, moving = model(x)
            loss = 0.5 * tf.reduce_sum(tf.square(y - t))
        trained = tf1.trainable_variables()
        # gated: ungated, the head's ∂L/∂x read its ref-variable kernel while its update wrote it (README, "What it
        # refuses"); workers in lockstep, as synchronized batch norm makes them, lost that race 2 runs in 5
        grads = tf.gradients(loss, trained, gate_gradients=True)
        summed = [tf.raw_ops.CollectiveReduceV2(input=g, group_size=workers, group_key=1, instance_key=10 + k,
                                                ordering_token=[], merge_op="Add", final_op="Id")
                  for k, g in enumerate(grads)]
        opt = tf1.train.GradientDescentOptimizer(LEARNING_RATE)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train = opt.apply_gradients(zip(summed, trained))
        main_fetch_group = tf.group(train, loss, name="main_fetch_group")
        with tf1.name_scope("inc_global_step"), tf.control_dependencies([main_fetch_group]):
            inc_global_step = global_step.assign_add(1)
    fetches = {"loss": loss, "stats": stats, "inc_global_step": inc_global_step}
    return x, t, fetches, trained + moving, global_step, tf1.local_variables_initializer()


def build(mode, workers, index, cluster):
    if mode == "collective_all_reduce":
        return build_collective(workers, index)
    here = f"/job:worker/replica:0/task:{index}/cpu:0"
    setter = tf1.train.replica_device_setter(worker_device=here, cluster=cluster)
    x, t = tf1.placeholder(tf.float32, [None, *IMAGE]), tf1.placeholder(tf.float32, [None, OUTPUTS])
    opt = tf1.train.GradientDescentOptimizer(LEARNING_RATE)
    with tf1.device(setter):
        global_step = tf1.train.get_or_create_global_step()
    if mode == "parameter_server":
        with tf1.device(setter), tf1.variable_scope("v", custom_getter=CachingGetter(here)):
            y, stats, moving = model(x)
            loss = 0.5 * tf.reduce_sum(tf.square(y - t))
            grads = opt.compute_gradients(loss)
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                train = opt.apply_gradients(grads)
        trained = [v for _, v in grads] + moving
        refresh = []
    else:   # distributed_replicated: local copies on the worker, global copies on the ps
        with tf1.device(here), tf1.variable_scope("v0"):
            y, stats, moving = model(x)
            loss = 0.5 * tf.reduce_sum(tf.square(y - t))
        local = tf1.trainable_variables("v0")
        for v in tf1.global_variables("v0"):   # the moving statistics too: each worker initializes its own
            tf1.get_default_graph().get_collection_ref(tf1.GraphKeys.GLOBAL_VARIABLES).remove(v)
            tf1.add_to_collection(tf1.GraphKeys.LOCAL_VARIABLES, v)
        with tf1.device(setter):
            shared = [tf1.get_variable(v.op.name.replace("v0/", "v/", 1), initializer=v.initialized_value())
                      for v in local]
        grads = tf.gradients(loss, local)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train = opt.apply_gradients(zip(grads, shared))
        trained = shared + moving
        refresh = [(v, s) for v, s in zip(local, shared)]
    main_fetch_group = tf.group(train, loss, name="main_fetch_group")
    with tf1.device(setter), tf1.name_scope("inc_global_step"), tf.control_dependencies([main_fetch_group]):
        inc_global_step = global_step.assign_add(1)
    ps = "/job:ps/replica:0/task:0/cpu:0"
    step_end = sync_queues_and_barrier("sync_queues_step_end_", [main_fetch_group], workers, index, ps)
    with tf.control_dependencies([step_end]):
        read_back = tf.group(*[v.assign(s.read_value()) for v, s in refresh]) if refresh else tf.no_op()
    local_init = tf1.local_variables_initializer()
    with tf.control_dependencies([local_init]):
        post_init = [v.assign(s.read_value()) for v, s in refresh]
    init_end = sync_queues_and_barrier("init_ops_end_", [local_init] + post_init, workers, index, ps)
    fetches = {"loss": loss, "stats": stats, "inc_global_step": inc_global_step, "sync_queues": step_end,
               "read_back": read_back}
    return x, t, fetches, trained, global_step, tf.group(local_init, *post_init, init_end)


def train(mode, target, cluster, workers, index, sizes, steps, is_chief, say_steps=False, recovery_wait=30):
    graph = tf.Graph()
    with graph.as_default():
        x, t, fetches, trained, global_step, local_init = build(mode, workers, index, cluster)
        supervisor = tf1.train.Supervisor(
            is_chief=is_chief or mode == "collective_all_reduce", logdir=None, ready_for_local_init_op=tf1.report_uninitialized_variables(
                tf1.global_variables()), local_init_op=local_init, saver=None, global_step=global_step,
            summary_op=None, recovery_wait_secs=recovery_wait)
        got = {"loss": [], "stats": []}
        with supervisor.managed_session(master=target) as sess:
            first_step = sess.run(global_step)   # the chief's extra fetch (tf_cnn_benchmarks: every worker's)
            for step in range(steps):
                x_all, t_all = data(sum(sizes), step)
                start = sum(sizes[:index])
                out = sess.run(fetches, {x: x_all[start:start + sizes[index]], t: t_all[start:start + sizes[index]]})
                got["loss"].append(out["loss"])
                got["stats"].append(np.concatenate([s.ravel() for s in out["stats"]]))
                if say_steps:
                    print(f"step {step + 1}", flush=True)
            last_step = sess.run(global_step)
            variables = sess.run(trained)
        supervisor.stop()
    return {"loss": np.array(got["loss"]), "stats": np.array(got["stats"]),
            "variables": np.concatenate([v.ravel() for v in variables[:-MOVING]]),
            "moving": np.concatenate([v.ravel() for v in variables[-MOVING:]]),
            "global_steps": np.array([first_step, last_step])}


def reference(sizes, steps):
    """One device, the concatenated batch, the same steps; loss per shard of `sizes`."""
    graph = tf.Graph()
    with graph.as_default():
        x, t = tf1.placeholder(tf.float32, [None, *IMAGE]), tf1.placeholder(tf.float32, [None, OUTPUTS])
        with tf1.variable_scope("v"):
            y, stats, moving = model(x)
        per_example = 0.5 * tf.reduce_sum(tf.square(y - t), 1)
        opt = tf1.train.GradientDescentOptimizer(LEARNING_RATE)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = opt.minimize(tf.reduce_sum(per_example))
        trained = tf1.trainable_variables() + moving
        got = {"loss": [], "stats": []}
        with tf1.Session(config=tf1.ConfigProto(device_count={"CPU": 1})) as sess:
            sess.run(tf1.global_variables_initializer())
            for step in range(steps):
                x_all, t_all = data(sum(sizes), step)
                losses, s, _ = sess.run([per_example, stats, train_op], {x: x_all, t: t_all})
                got["loss"].append([part.sum() for part in np.split(losses, np.cumsum(sizes)[:-1])])
                got["stats"].append(np.concatenate([v.ravel() for v in s]))
            variables = sess.run(trained)
    return {"loss": np.array(got["loss"]), "stats": np.array(got["stats"]),
            "variables": np.concatenate([v.ravel() for v in variables[:-MOVING]]),
            "moving": np.concatenate([v.ravel() for v in variables[-MOVING:]])}


def main():
    tf1.disable_v2_behavior()   # here, not at import: tests import this module for reference()
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mode", default="parameter_server", choices=["parameter_server", "distributed_replicated",
                                                                  "collective_all_reduce"])
    parser.add_argument("--sizes", default="3,5")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--say-steps", action="store_true", help="print 'step N' after each step")
    parser.add_argument("--recovery-wait", type=int, default=30,
                        help="seconds a non-chief Supervisor waits before asking again whether the chief initialized "
                             "the model (TensorFlow's default, which tf_cnn_benchmarks keeps: 30)")
    args = parser.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    job, index = tf_config["task"]["type"], tf_config["task"]["index"]
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    if args.mode == "collective_all_reduce":   # the script's own gradient collectives need a leader
        config.experimental.collective_group_leader = "/job:worker/replica:0/task:0"
    server = tf.distribute.Server(cluster, job_name=job, task_index=index, config=config)
    if job == "ps":
        print("ps:0 joins its server", flush=True)
        server.join()
    sizes = [int(s) for s in args.sizes.split(",")]
    got = train(args.mode, server.target, cluster, len(tf_config["cluster"]["worker"]), index, sizes, args.steps,
                is_chief=index == 0, say_steps=args.say_steps, recovery_wait=args.recovery_wait)
    np.savez(args.out, **got)
    print(f"{job}:{index} trained {args.steps} steps on {sizes[index]} examples each (global step "
          f"{got['global_steps'][0]} → {got['global_steps'][1]})", flush=True)


if __name__ == "__main__":
    main()
