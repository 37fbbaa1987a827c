"""One worker of a between-graph replicated job (run by the tests as a subprocess): starts its own
server, then either builds its own one-replica graph and rewrites it with a process group, or
imports saved worker graphs in turn (e.g. the one `graphsync rewrite --process-group` prepared for
its task, and the original); runs one training step on each and saves what it computed. Its own
graph is models.resnetish, or one of tests/test_reductions.py's forms ({"form", "gradients": when the
rewrite runs, towerlib.build's, "data": an .npz of the whole batch's x and t}, in place of `saved`).
A cluster with a ps job puts the variables there (tf.compat.v1.train.replica_device_setter)."""
import json
import sys

import conftest  # noqa: F401  (TensorFlow environment)
import numpy as np
import tensorflow as tf

import behaviours
import graphsync
import models
import towerlib as tl

cluster, task, batch_sizes, out_path, *saved = json.loads(sys.argv[1])
behaviours.apply_from_environment()   # as the test that started this worker built its graphs
leader = "/job:worker/replica:0/task:0"
config = tf.compat.v1.ConfigProto()
config.experimental.collective_group_leader = leader
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=config)

options = saved[0] if saved else {}
x, t = tl.data(batch_sizes, (6, 6, 3), (5,))
if "data" in options:
    x, t = (np.load(options["data"])[k] for k in ("x", "t"))
part = slice(sum(batch_sizes[:task]), sum(batch_sizes[:task + 1]))
results = {}
if "metas" in options:   # {"metas": {variant: path}, "names": {field: [tensor, op or variable names]}}: each in turn
    for variant, meta in saved[0]["metas"].items():
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.train.import_meta_graph(meta)
            names, get = saved[0]["names"], graph.as_graph_element
            variables = {v.name: v for v in tf.compat.v1.global_variables()}
            built = tl.Built(graph, *([get(n) for n in names[f]] for f in ("inputs", "targets", "outputs", "losses",
                                                                            "grads")),
                             get(names["train_op"]), [], [variables[n] for n in names["moving"]])
        results[variant + "/"] = tl.run_step(built, x[part], t[part], [batch_sizes[task]], target=server.target,
                                             config=config)
else:
    reports = []
    if "form" in options:
        import test_reductions
        model = test_reductions.model_of(options["form"], [batch_sizes[task]])
    else:
        model = models.resnetish(depth=2)
    device = f"/job:worker/replica:0/task:{task}/device:CPU:0"
    if "ps" in cluster:   # variables on the ps tasks, as tf.compat.v1.train.replica_device_setter puts them
        device = tf.compat.v1.train.replica_device_setter(cluster=tf.train.ClusterSpec(cluster), worker_device=device)
    built = tl.build(model, [batch_sizes[task]], scope="", gradients=options.get("gradients", "after"),
                     devices=[device],
                     rewrite=lambda g: reports.append(graphsync.rewrite_towers(
                         g, strategy="allreduce", process_group=graphsync.ProcessGroup(len(batch_sizes), task))))
    results[""] = tl.run_step(built, x[part], t[part], [batch_sizes[task]], target=server.target, config=config)
    results[""]["layers"] = len(reports[0].layers)
    results[""]["kinds"] = np.array([layer.kind for layer in reports[0].layers])
    results[""]["strategy"] = np.array(reports[0].strategy)
arrays = {}
for prefix, got in results.items():
    arrays.update({prefix + "output": got["output"], prefix + "loss": got["loss"],
                   prefix + "moving": np.concatenate([m.ravel() for m in got["moving"]] or [np.zeros(0)]),
                   prefix + "grads": np.concatenate([g.ravel() for g in got["grads"]])})
    if "layers" in got:
        arrays.update(layers=got["layers"], kinds=got["kinds"], strategy=got["strategy"])
np.savez(out_path, **arrays)
