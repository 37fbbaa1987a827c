"""An unchanged TF1 parameter-server job the way users write one: a ps task that only joins its
server, worker tasks that each build their graph under tf.compat.v1.train.replica_device_setter and
train in a tf.compat.v1.train.MonitoredTrainingSession whose chief checkpoints every step.

    TF_CONFIG='{"cluster": {"ps": [...], "worker": [...]}, "task": {"type": "worker", "index": 1}}' \\
        python ps_monitored.py OUT CHECKPOINTS [--sizes 3,5,2] [--steps 4]
        [--exit-after K] [--freeze-after K] [--worker-wait SECONDS]

The model, data and learning rate are ps_train.py's (conv → batch norm → relu → conv → batch norm
→ relu → mean → dense, training=True; the loss summed over the examples); the variables, the
moving statistics and the global step live on the ps; every worker's GradientDescentOptimizer
applies its own gradients there and increments the global step (by one per worker and step).
Step s's batch is ps_train.data(Σ sizes, s), worker i training on its shard: the steps are a
function of the global step read when the session starts (floor-divided by the number of workers:
a worker may start after the others' first increments, never after a step's barrier), so a job
restarted from the checkpoints resumes the same sequence.

A checkpoint of step s holds every worker's updates of step s: each step ends with
tf_cnn_benchmarks' sync queues and barrier on the ps (ps_train.sync_queues_and_barrier, fetched
with the train op), and the chief's CheckpointSaverHook (save_checkpoint_steps=1) saves after its
run returns. (Under graphsync nothing of step s+1 can write a variable before the chief's step
s+1 starts: its batch norms wait for the chief's statistics.)

After each step s (1, 2, …) a worker prints `step s done`. --exit-after K: the process then exits
(status 3), as a crashed worker does; --freeze-after K: it stops itself with SIGSTOP, as a hung
machine does. --worker-wait: seconds a non-chief worker waits between its checks that the chief
has initialized or restored the variables (SessionManager's recovery_wait_secs, which
MonitoredTrainingSession leaves at 30: a worker that checks before the chief is done, as under
graphsync every worker does, idles 30 s; the tests pass 1). At the end OUT (.npz) holds per step
the loss and the batch norms' batch statistics, the trainable variables, the moving statistics
(`moving`) and the global step at the start and the end (`global_steps`). `reference(sizes,
steps)` is one device on the concatenated batch.
"""
import argparse
import json
import os
import signal

import ps_train
from ps_train import LEARNING_RATE, OUTPUTS, IMAGE, data, model, sync_queues_and_barrier, tf, tf1

import numpy as np


def build(workers, index, cluster):
    here = f"/job:worker/replica:0/task:{index}/cpu:0"
    with tf1.device(tf1.train.replica_device_setter(worker_device=here, cluster=cluster)):
        global_step = tf1.train.get_or_create_global_step()
        x, t = tf1.placeholder(tf.float32, [None, *IMAGE]), tf1.placeholder(tf.float32, [None, OUTPUTS])
        with tf1.variable_scope("v"):
            y, stats, moving = model(x)
        loss = 0.5 * tf.reduce_sum(tf.square(y - t))
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            minimize = tf1.train.GradientDescentOptimizer(LEARNING_RATE).minimize(loss, global_step=global_step)
    step_end = sync_queues_and_barrier("sync_queues_step_end_", [minimize], workers, index,
                                       "/job:ps/replica:0/task:0/cpu:0")
    train_op = tf.group(minimize, step_end)
    return x, t, global_step, moving, {"train": train_op, "loss": loss, "stats": stats}


def train(target, cluster, workers, index, sizes, steps, checkpoints, exit_after=0, freeze_after=0):
    with tf.Graph().as_default():
        x, t, global_step, moving, fetches = build(workers, index, cluster)
        trained = tf1.trainable_variables()
        config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
        got = {"loss": [], "stats": []}
        with tf1.train.MonitoredTrainingSession(master=target, is_chief=index == 0, checkpoint_dir=checkpoints,
                                                save_checkpoint_steps=1, config=config) as sess:
            first = sess.run(global_step)
            start = sum(sizes[:index])
            for step in range(first // workers, steps):
                x_all, t_all = data(sum(sizes), step)
                out = sess.run(fetches, {x: x_all[start:start + sizes[index]], t: t_all[start:start + sizes[index]]})
                got["loss"].append(out["loss"])
                got["stats"].append(np.concatenate([s.ravel() for s in out["stats"]]))
                print(f"step {step + 1} done", flush=True)
                if step + 1 == exit_after:
                    os._exit(3)
                if step + 1 == freeze_after:
                    os.kill(os.getpid(), signal.SIGSTOP)
            variables, statistics, last = sess.run([trained, moving, global_step])
    return {"loss": np.array(got["loss"]), "stats": np.array(got["stats"]),
            "variables": np.concatenate([v.ravel() for v in variables]),
            "moving": np.concatenate([v.ravel() for v in statistics]),
            "global_steps": np.array([first, last])}


def reference(sizes, steps):
    """ps_train.reference: one device, the concatenated batch (per-shard losses, batch statistics,
    trainable variables, moving statistics)."""
    return ps_train.reference(sizes, steps)


def wait_between_checks(seconds):
    """Every SessionManager made without a recovery_wait_secs (MonitoredTrainingSession's) gets `seconds`."""
    original = tf1.train.SessionManager.__init__

    def init(self, *args, **kwargs):
        kwargs.setdefault("recovery_wait_secs", seconds)
        original(self, *args, **kwargs)
    tf1.train.SessionManager.__init__ = init


def main():
    tf1.disable_v2_behavior()   # here, not at import: tests import this module for reference()
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("checkpoints")
    parser.add_argument("--sizes", default="3,5,2")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--exit-after", type=int, default=0)
    parser.add_argument("--freeze-after", type=int, default=0)
    parser.add_argument("--worker-wait", type=float, default=None)
    args = parser.parse_args()
    if args.worker_wait is not None:
        wait_between_checks(args.worker_wait)
    tf_config = json.loads(os.environ["TF_CONFIG"])
    job, index = tf_config["task"]["type"], tf_config["task"]["index"]
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    server = tf.distribute.Server(cluster, job_name=job, task_index=index, config=config)
    if job == "ps":
        print(f"ps:{index} joins its server", flush=True)
        server.join()
    sizes = [int(s) for s in args.sizes.split(",")]
    got = train(server.target, cluster, len(tf_config["cluster"]["worker"]), index, sizes, args.steps,
                args.checkpoints, args.exit_after, args.freeze_after)
    np.savez(args.out, **got)
    print(f"{job}:{index} trained to step {args.steps} (global step {got['global_steps'][0]} → "
          f"{got['global_steps'][1]})", flush=True)


if __name__ == "__main__":
    main()
