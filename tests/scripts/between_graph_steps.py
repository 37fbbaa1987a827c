"""An unchanged between-graph worker script that trains several steps with a checkpoint after each,
and resumes from its last checkpoint when restarted — the loop tests/test_lost_worker.py breaks on
purpose. The model, data and graph are between_graph_train.py's (one unscoped tower per worker,
each worker's variables its own); every worker trains on its shard of the same batch each step.

    TF_CONFIG=… python between_graph_steps.py OUT CHECKPOINTS [--steps 4] [--sizes 3,5,4]
        [--exit-after K] [--freeze-after K] [--pause-after K --pause SECONDS]
        [--library SECONDS [--cluster-from server]]

After each step k (1, 2, …) the worker saves CHECKPOINTS/worker<index>/model.ckpt-k and prints
`step k done`. --exit-after K: the process then exits (status 3) as a crashed worker does;
--freeze-after K: it stops itself with SIGSTOP, as a hung machine does (before step K+1 can start);
--pause-after K: it sleeps SECONDS before its next step, its server up. At the end OUT (.npz)
holds every global variable by name.

--library SECONDS: the script is no longer unchanged: run under plain python, it sets the group
leader in its server's config and calls graphsync.rewrite_towers itself with
ProcessGroup(workers, index, heartbeat=SECONDS), the workers' addresses from TF_CONFIG, or with
--cluster-from server from its tf.distribute.Server (cluster=server).
"""
import argparse
import json
import os
import signal
import time

import between_graph_train as base
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("checkpoints")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--sizes", default="3,5,4")
    parser.add_argument("--exit-after", type=int, default=0)
    parser.add_argument("--freeze-after", type=int, default=0)
    parser.add_argument("--pause-after", type=int, default=0)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--library", type=float, default=None, metavar="HEARTBEAT")
    parser.add_argument("--cluster-from", choices=["tf_config", "server"], default="tf_config")
    args = parser.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    job, index = tf_config["task"]["type"], tf_config["task"]["index"]
    config = tf1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    if args.library is not None:
        config.experimental.collective_group_leader = "/job:worker/replica:0/task:0"
    server = tf.distribute.Server(tf.train.ClusterSpec(tf_config["cluster"]), job_name=job, task_index=index,
                                  config=config)
    sizes = [int(s) for s in args.sizes.split(",")]
    start = sum(sizes[:index])
    x_all, t_all = base.data(sum(sizes))
    feed_x, feed_t = x_all[start:start + sizes[index]], t_all[start:start + sizes[index]]
    directory = os.path.join(args.checkpoints, f"{job}{index}")
    os.makedirs(directory, exist_ok=True)
    with tf.Graph().as_default():
        x, t, _, _, _, train_op, _, _ = base.build([sizes[index]], 4, [f"/job:{job}/task:{index}/cpu:0"], [""])
        if args.library is not None:
            import graphsync
            group = graphsync.ProcessGroup(len(sizes), index, heartbeat=args.library,
                                           cluster=server if args.cluster_from == "server" else None)
            graphsync.rewrite_towers(strategy="allreduce", process_group=group)
        saver = tf1.train.Saver(max_to_keep=2)
        with tf1.Session(server.target) as sess:
            last = tf1.train.latest_checkpoint(directory)
            if last:
                saver.restore(sess, last)
                done = int(last.rsplit("-", 1)[1])
            else:
                sess.run(tf1.global_variables_initializer())
                done = 0
            for step in range(done + 1, args.steps + 1):
                sess.run(train_op, {x: feed_x, t: feed_t})
                saver.save(sess, os.path.join(directory, "model.ckpt"), global_step=step)
                print(f"step {step} done", flush=True)
                if step == args.exit_after:
                    os._exit(3)
                if step == args.freeze_after:
                    os.kill(os.getpid(), signal.SIGSTOP)
                if step == args.pause_after:
                    time.sleep(args.pause)
            variables = tf1.global_variables()
            np.savez(args.out, **dict(zip([v.name for v in variables], sess.run(variables))))


if __name__ == "__main__":
    main()
