"""Which task of which cluster a process is (graphsync.cluster), without any process: TF_CONFIG in
its usual forms and mistakes, server definitions, the group leader graphsync gives a server, and
the decision BetweenGraphSync takes from them."""
import json

import pytest
import tensorflow as tf

from graphsync import GraphsyncError, ProcessGroup, cluster, tf_private

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
        assert task.process_group(30) == ProcessGroup(tasks, rank, 30.0)
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
    from graphsync.between_graph import BetweenGraphSync
    tf_config = _tf_config({"worker": WORKERS[:2]}, "worker", 1)
    sync = BetweenGraphSync(tf_config=tf_config, quiet=True, peer_timeout=12)
    graph = tf.Graph()
    assert sync.options_for(graph) == {}          # TF_CONFIG, but no server in this process: local only
    sync.server_task = cluster.from_tf_config(_tf_config({"worker": WORKERS}, "worker", 2))
    sync.server_target = "grpc://127.0.0.1:1003"
    # with a heartbeat (default 10 s) the collectives wait for slow peers: the heartbeat finds lost ones
    assert sync.options_for(graph) == {"strategy": "allreduce", "process_group": ProcessGroup(3, 2, 0.0, 10.0)}
    sync.heartbeat = 0
    assert sync.options_for(graph) == {"strategy": "allreduce", "process_group": ProcessGroup(3, 2, 12.0)}
    assert BetweenGraphSync(tf_config="", strategy="gather").options_for(graph) == {"strategy": "gather"}
