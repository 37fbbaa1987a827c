"""One worker of a between-graph replicated job (run by test_distributed.py as a subprocess):
starts its own server, builds its own one-replica graph, rewrites it with a process group, runs
one training step and saves what it computed."""
import json
import sys

import conftest  # noqa: F401  (TensorFlow environment)
import numpy as np
import tensorflow as tf

import graphsync
import models
import towerlib as tl

cluster, task, batch_sizes, out_path = json.loads(sys.argv[1])
leader = "/job:worker/replica:0/task:0"
config = tf.compat.v1.ConfigProto()
config.experimental.collective_group_leader = leader
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=config)

reports = []
built = tl.build(models.resnetish(depth=2), [batch_sizes[task]], scope="",
                 devices=[f"/job:worker/replica:0/task:{task}/device:CPU:0"],
                 rewrite=lambda g: reports.append(graphsync.rewrite_towers(
                     g, strategy="allreduce", process_group=graphsync.ProcessGroup(len(batch_sizes), task))))
x, t = tl.data(batch_sizes, (6, 6, 3), (5,))
part = slice(sum(batch_sizes[:task]), sum(batch_sizes[:task + 1]))
got = tl.run_step(built, x[part], t[part], [batch_sizes[task]], target=server.target, config=config)
np.savez(out_path, output=got["output"], loss=got["loss"], moving=np.concatenate([m.ravel() for m in got["moving"]]),
         grads=np.concatenate([g.ravel() for g in got["grads"]]), layers=len(reports[0].layers))
print(reports[0].summary, flush=True)
