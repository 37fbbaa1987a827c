"""Which task of which cluster a process is (graphsync.between_graph.cluster), without any process: TF_CONFIG in
its usual forms and mistakes, server definitions, the group leader graphsync gives a server, and
the decision BetweenGraphSync takes from them."""
import json

import pytest
import tensorflow as tf

from graphsync import GraphsyncError, ProcessGroup
from graphsync.between_graph import cluster, process_group
from graphsync.graph import tf_private

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

WORKERS = ["127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"]


def _tf_config(cluster_spec, job, index):
    return json.dumps({"cluster": cluster_spec, "task": {"type": job, "index": index}})


@pytest.mark.parametrize("spec,job,index,rank,tasks,leader", [
    ({"worker": WORKERS}, "worker", 1, 1, 3, "/job:worker/replica:0/task:0"),
    ({"chief": ["h:1"], "worker": WORKERS[:2], "ps": ["h:9"]}, "worker", 1, 2, 3, "/job:chief/replica:0/task:0"),
    ({"chief": ["h:1"], "worker": WORKERS[:2]}, "chief", 0, 0, 3, "/job:chief/replica:0/task:0"),
    ({"worker": WORKERS[:2], "ps": ["h:9"]}, "ps", 0, None, 2, "/job:worker/replica:0/task:0"),
])
def test_tf_config_names_the_process_and_the_leader(spec, job, index, rank, tasks, leader):
    task = cluster.from_tf_config(_tf_config(spec, job, index))
    assert (task.rank, task.tasks, task.leader) == (rank, tasks, leader)
    assert task.between_graph == (rank is not None)
    if rank is not None:
        assert ProcessGroup.of_task(task, 30) == ProcessGroup(tasks, rank, 30.0)
        assert task.description == f"{job}:{index} is process {rank + 1} of {tasks} (cluster from TF_CONFIG)"


def test_a_cluster_of_one_worker_or_no_tf_config_is_not_between_graph():
    assert not cluster.from_tf_config(_tf_config({"worker": WORKERS[:1]}, "worker", 0)).between_graph
    assert cluster.from_tf_config(None) is None and cluster.from_tf_config(" ") is None
    assert cluster.from_tf_config('{"environment": "cloud"}') is None


@pytest.mark.parametrize("text,message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"cluster": {"worker": "h:1"}, "task": {"type": "worker", "index": 0}}', "list of 'host:port'"),
    ('{"cluster": {"worker": ["h:1"]}}', "no 'task'"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 1}}', "task worker:1 is not in its cluster"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "chief", "index": 0}}', "task chief:0 is not in its cluster"),
])
def test_a_malformed_tf_config_is_one_clear_error(text, message):
    with pytest.raises(GraphsyncError, match=message):
        cluster.from_tf_config(text)


def test_a_server_definition_gets_the_leader_only_when_it_has_none_and_trains_with_others():
    spec = tf.train.ClusterSpec({"worker": WORKERS[:2], "ps": ["h:9"]})
    server_def = tf_private.make_server_def(spec, "worker", 1, None, None)
    task = cluster.server_def_with_leader(server_def)
    assert (task.job, task.index, task.rank, task.source) == ("worker", 1, 1, "its tf.distribute.Server")
    assert server_def.default_session_config.experimental.collective_group_leader == "/job:worker/replica:0/task:0"

    config = tf.compat.v1.ConfigProto()
    config.experimental.collective_group_leader = "/job:worker/replica:0/task:1"   # the user's choice stays
    server_def = tf_private.make_server_def(spec, "worker", 0, None, config)
    cluster.server_def_with_leader(server_def)
    assert server_def.default_session_config.experimental.collective_group_leader == "/job:worker/replica:0/task:1"

    for job, index in (("ps", 0),):                                                 # not a training task
        server_def = tf_private.make_server_def(spec, job, index, None, None)
        cluster.server_def_with_leader(server_def)
        assert not server_def.default_session_config.experimental.collective_group_leader


def test_between_graph_sync_decides_from_the_server_else_tf_config():
    from graphsync.autosync.worker import BetweenGraphSync
    tf_config = _tf_config({"worker": WORKERS[:2]}, "worker", 1)
    sync = BetweenGraphSync(tf_config=tf_config, quiet=True, peer_timeout=12)
    graph = tf.Graph()
    assert sync.options_for(graph) == {}          # TF_CONFIG, but no server in this process: local only
    sync.server_task = cluster.from_tf_config(_tf_config({"worker": WORKERS}, "worker", 2))
    sync.server_target = "grpc://127.0.0.1:1003"
    # with a heartbeat (default 10 s) the collectives wait for slow peers: the heartbeat finds lost ones
    # (BetweenGraphSync's own, not the process group's: graphsync.autosync.worker)
    assert sync.options_for(graph) == {"strategy": "allreduce", "process_group": ProcessGroup(3, 2, 0.0)}
    sync.heartbeat = 0
    assert sync.options_for(graph) == {"strategy": "allreduce", "process_group": ProcessGroup(3, 2, 12.0)}
    assert BetweenGraphSync(tf_config="", strategy="gather").options_for(graph) == {"strategy": "gather"}


def test_a_process_group_with_a_heartbeat_finds_its_workers_in_its_cluster_else_tf_config(monkeypatch):
    """rewrite_towers' heartbeat (graphsync.between_graph.watched_steps) needs the workers' addresses: from
    ProcessGroup(cluster=…) in any of its forms, else TF_CONFIG; kept in one hashable form."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    want = (("chief", ("h:1",)), ("ps", ("h:9",)), ("worker", tuple(WORKERS[:2])))
    spec = {"chief": ["h:1"], "worker": WORKERS[:2], "ps": ["h:9"]}
    for form in (spec, tf.train.ClusterSpec(spec), tf.train.ClusterSpec(spec).as_cluster_def(), want):
        group = ProcessGroup(3, 2, heartbeat=3, cluster=form)
        assert group.cluster == want and hash(group) == hash(ProcessGroup(3, 2, heartbeat=3, cluster=want))
    task = process_group.of_group(ProcessGroup(3, 2, heartbeat=3, cluster=spec))
    assert (task.job, task.index, task.rank, task.address("worker", 1)) == ("worker", 1, 2, WORKERS[1])
    assert ProcessGroup(2, 1).cluster is None                       # no heartbeat: TF_CONFIG not even read
    monkeypatch.setenv("TF_CONFIG", _tf_config({"worker": WORKERS}, "worker", 1))
    assert ProcessGroup(3, 1, heartbeat=10).cluster == (("worker", tuple(WORKERS)),)


@pytest.mark.parametrize("tf_config,kwargs,message", [
    (None, dict(tasks=2, index=0, heartbeat=10),
     r"^ProcessGroup\(2, 0, heartbeat=10\) needs the workers' addresses to watch them: pass cluster= \(the "
     r"tf.distribute.Server this worker started, its tf.train.ClusterSpec, or \{job: \['host:port', ...\]\}\), "
     r"or set TF_CONFIG$"),
    (("worker", 1), dict(tasks=3, index=1, heartbeat=10),
     r"^ProcessGroup\(3, 1, heartbeat=10\): the cluster from TF_CONFIG has 2 training tasks \(chief, master, "
     r"worker\), not 3$"),
    (("worker", 1), dict(tasks=2, index=0, heartbeat=10),
     r"^ProcessGroup\(2, 0, heartbeat=10\): worker:1 is process index 1 in the cluster from TF_CONFIG: give the "
     r"process group this task's index$"),
    (("ps", 0), dict(tasks=2, index=0, heartbeat=10), r"ps:0 is not a training task in the cluster from TF_CONFIG"),
    (None, dict(tasks=2, index=0, cluster=["h:1", "h:2"]), r"^ProcessGroup cluster= must be a tf.distribute.Server"),
    (None, dict(tasks=3, index=0, cluster={"worker": WORKERS[:2]}), r"the cluster from cluster= has 2 training tasks"),
])
def test_a_process_group_whose_workers_cannot_be_found_is_one_clear_error(monkeypatch, tf_config, kwargs, message):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", _tf_config({"worker": WORKERS[:2], "ps": ["h:9"]}, *tf_config))
    with pytest.raises(GraphsyncError, match=message):
        ProcessGroup(**kwargs)
