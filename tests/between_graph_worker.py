"""One worker of a between-graph replicated job (run by the tests as a subprocess): starts its own
server, then either builds its own one-replica graph and rewrites it with a process group, or
imports a saved worker graph already rewritten for its task (`graphsync rewrite --process-group`);
runs one training step and saves what it computed."""
import json
import sys

import conftest  # noqa: F401  (TensorFlow environment)
import numpy as np
import tensorflow as tf

import graphsync
import models
import towerlib as tl

cluster, task, batch_sizes, out_path, *saved = json.loads(sys.argv[1])
leader = "/job:worker/replica:0/task:0"
config = tf.compat.v1.ConfigProto()
config.experimental.collective_group_leader = leader
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=config)

if saved:   # {"meta": path, "names": {field: [tensor or op names]}}
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(saved[0]["meta"])
        names = saved[0]["names"]
        get = graph.as_graph_element
        variables = {v.name: v for v in tf.compat.v1.global_variables()}
        built = tl.Built(graph, *([get(n) for n in names[f]] for f in ("inputs", "targets", "outputs", "losses", "grads")),
                         get(names["train_op"]), [], [variables[n] for n in names["moving"]])
    layers = None
else:
    reports = []
    built = tl.build(models.resnetish(depth=2), [batch_sizes[task]], scope="",
                     devices=[f"/job:worker/replica:0/task:{task}/device:CPU:0"],
                     rewrite=lambda g: reports.append(graphsync.rewrite_towers(
                         g, strategy="allreduce", process_group=graphsync.ProcessGroup(len(batch_sizes), task))))
    layers = len(reports[0].layers)
x, t = tl.data(batch_sizes, (6, 6, 3), (5,))
part = slice(sum(batch_sizes[:task]), sum(batch_sizes[:task + 1]))
got = tl.run_step(built, x[part], t[part], [batch_sizes[task]], target=server.target, config=config)
np.savez(out_path, output=got["output"], loss=got["loss"], moving=np.concatenate([m.ravel() for m in got["moving"]]),
         grads=np.concatenate([g.ravel() for g in got["grads"]]), layers=layers or 0)
