"""Meeting the other worker processes before the first synchronized step, within a bounded wait.

A collective waits for all its peers. TensorFlow's own waits are unbounded where it matters: a
session on a server whose peer never started blocks in CreateSession, retrying forever. So before
a between-graph graph first runs, each worker

1. waits until every training task's server accepts connections (`wait_for_servers`); the tasks
   still silent when the wait ends are named in the error;
2. gathers every worker's layer fingerprints with one collective (`compare_layers`), in a graph and
   session of its own on the worker's server: workers that built different batch-norm layers
   (different scripts or options) stop with the first difference, instead of averaging unrelated
   statistics; a worker that never joins makes the gather time out with the remaining wait; a
   worker restarted alone into a running group is refused at once by the group leader (its
   collective runtime knows the task's earlier incarnation), and says so.

Both also line the workers up, so the first training step starts together. Later steps are
watched by a heartbeat (graphsync.between_graph.heartbeat), or bounded by the collectives' own timeout
(ProcessGroup.timeout) when there is none.
"""
from __future__ import annotations

import socket
import time
import weakref

from graphsync.between_graph.cluster import ClusterTask, device_of, task_name
from graphsync.errors import GraphsyncError
from graphsync.plan.data import digest

HANDSHAKE_GROUP_KEY = (1 << 30) + 7      # clear of the synchronized layers' keys (exchange/collectives.py)
HANDSHAKE_INSTANCE_KEY = (1 << 30) + 100
MAX_COMPARED_LAYERS = 128                # beyond: compared through the digest of all layers only
_handshakes = [0]                        # handshakes so far in this process (one key each)
HANDSHAKE_GRAPHS = weakref.WeakSet()     # graphsync's own graphs: never rewritten (see between_graph)
LONGER = "or wait longer with --peer-timeout"   # the remedy for a short wait (graphsync run's option)


def wait_for_servers(task: ClusterTask, timeout: float, poll: float = 0.1, longer: str = LONGER) -> None:
    """Returns once every training task's address accepts a connection; raises GraphsyncError
    naming the tasks that did not within `timeout` seconds (0: wait forever)."""
    start = time.monotonic()
    waiting = [(job, i) for job, i in task.members if (job, i) != (task.job, task.index)]
    while True:
        waiting = [(job, i) for job, i in waiting if not _listening(task.address(job, i))]
        if not waiting:
            return
        if timeout and time.monotonic() - start >= timeout:
            missing = ", ".join(f"{task_name(job, i)} ({task.address(job, i)})" for job, i in waiting)
            raise GraphsyncError(
                f"{missing} did not start within {timeout:g} s ({task.name} is process {task.rank + 1} of "
                f"{task.tasks}): start every worker of the cluster, {longer}")
        time.sleep(poll)


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False


def compare_layers(task: ClusterTask, target: str, fingerprints: list[str], timeout: float,
                   said: float | None = None, opened=None, longer: str = LONGER) -> None:
    """Gathers every worker's layer fingerprints (see graphsync.plan.data.fingerprints) through the
    server at `target`; raises GraphsyncError when a worker's differ from this one's, or when not
    every worker joins within `timeout` seconds (0: wait forever; `said`: the wait to name), or
    when the gather is cancelled. `opened(session)` is told the gather's session (to close it
    from elsewhere: a heartbeat that finds a worker gone)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    mine = _summary(task.rank, task.tasks, fingerprints)
    instance = HANDSHAKE_INSTANCE_KEY + _handshakes[0]
    _handshakes[0] += 1
    graph = tf.Graph()
    HANDSHAKE_GRAPHS.add(graph)
    with graph.as_default(), tf.device(device_of(task.job, task.index) + "/device:CPU:0"):
        gathered = tf.raw_ops.CollectiveGatherV2(
            input=tf.constant(mine, tf.int64), group_size=tf.constant(task.tasks),
            group_key=tf.constant(HANDSHAKE_GROUP_KEY), instance_key=tf.constant(instance),
            ordering_token=[], timeout_seconds=float(timeout))
    config = tf1.ConfigProto(device_filters=[device_of(task.job, task.index)])
    options = tf1.RunOptions(timeout_in_ms=int(timeout * 1000) + 5000) if timeout else None
    try:
        with tf1.Session(target, graph=graph, config=config) as sess:
            if opened is not None:
                opened(sess)
            rows = sess.run(gathered, options=options).reshape(task.tasks, -1)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.CancelledError):
        others = ", ".join(task_name(*m) for m in task.members if m != (task.job, task.index))
        raise GraphsyncError(
            f"not every worker joined within {said or timeout:g} s ({task.name} is process {task.rank + 1} of "
            f"{task.tasks}, waiting for {others}): their servers are up, but some did not reach "
            f"their first synchronized step: run every worker under graphsync (the same script and "
            f"options), {longer}") from None
    except tf.errors.FailedPreconditionError as exc:
        if "incarnation" not in str(exc):
            raise
        raise GraphsyncError(
            f"{task.name} cannot join a group that is already running: the group leader ({task.leader}) knows "
            f"an earlier server of {task.name} (restarted alone?): restart every worker to resume from its last "
            "checkpoint") from None
    for row in sorted(rows.tolist(), key=lambda r: r[0]):
        if row[3] != mine[3] or row[2] != mine[2] or row[1] != task.tasks:
            raise GraphsyncError(_difference(task, fingerprints, row))


def _summary(rank: int, tasks: int, fingerprints: list[str]) -> list[int]:
    """[rank, tasks, layers, digest of all layers, digest of each of the first layers…]."""
    per_layer = [digest(f) for f in fingerprints[:MAX_COMPARED_LAYERS]]
    return [rank, tasks, len(fingerprints), digest("\n".join(fingerprints))] + per_layer + \
        [0] * (MAX_COMPARED_LAYERS - len(per_layer))


def _difference(task: ClusterTask, fingerprints: list[str], row: list[int]) -> str:
    other = task_name(*task.members[row[0]]) if 0 <= row[0] < task.tasks else f"process {row[0]}"
    if row[1] != task.tasks:
        return f"{other} counts {row[1]} training processes, {task.name} {task.tasks}: give every worker the same cluster"
    first = next((i for i, f in enumerate(fingerprints[:MAX_COMPARED_LAYERS]) if digest(f) != row[4 + i]),
                 min(len(fingerprints), row[2], MAX_COMPARED_LAYERS))
    here = f"here ({task.name}) {fingerprints[first]}" if first < len(fingerprints) else f"{task.name} has no such layer"
    return (f"the workers built different batch-norm layers ({task.name}: {len(fingerprints)}, {other}: {row[2]}); "
            f"the first that differs is layer {first + 1}, {here}: run the same script and options on every worker")
