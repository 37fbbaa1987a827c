"""A lost worker noticed from the library: `rewrite_towers(…, process_group=ProcessGroup(tasks, index,
heartbeat=SECONDS))` in a between-graph script of one's own gets what `graphsync run` gives.

`watch(graph, group, fingerprints)`, after the rewrite, hands the graph to the process's
LostWorkerGuard (graphsync.between_graph.lost_worker) and, the first time, wraps BaseSession.run for it (the one
patch the library makes; runs of other graphs pass straight through). At the graph's first
synchronized step (graphsync.between_graph.steps: a run that reaches a collective) the worker

    waits for every training task's server (graphsync.between_graph.peers.wait_for_servers),
    starts the heartbeat on them (graphsync.between_graph.heartbeat, once per process),
    meets the others (graphsync.between_graph.peers.compare_layers on the session's server): every worker's
        layers the same, and a worker restarted alone into a running group refused by the leader;

all within the group's `timeout` (0: as long as it takes). From then on a lost worker stops this
one at the step it breaks or at the next one: status 1 and, last on stderr, the lost worker's line
(`graphsync: error: lost worker worker:2 (…) during synchronized step 3: …: restart every worker
to resume from its last checkpoint`). A meeting that fails says why in one such line too.
"""
from __future__ import annotations

import sys
import threading
import weakref

from graphsync.between_graph.lost_worker import LostWorkerGuard

_guard: LostWorkerGuard | None = None
_unmet = weakref.WeakKeyDictionary()   # graph → (ClusterTask, ProcessGroup, fingerprints) before its first step
_lock = threading.Lock()
LONGER = "or wait longer with ProcessGroup(timeout=…)"


def watch(graph, group, fingerprints: list[str]) -> None:
    """Guards the steps of `graph`, rewritten with `group` (whose heartbeat is on)."""
    from graphsync.between_graph import process_group
    with _lock:
        guard = _installed()
        guard.steps.graphs.add(graph)
        _unmet[graph] = (process_group.of_group(group), group, fingerprints)


def _installed() -> LostWorkerGuard:
    global _guard
    if _guard is None:
        from graphsync.graph import tf_private
        session_class = tf_private.session_base_class()
        original_run = session_class.run
        guard = LostWorkerGuard(_say, stop_at_step=True)

        def run(session, fetches, *args, **kwargs):
            graph = getattr(session, "graph", None)
            if graph is not None and graph in _unmet and guard.steps.is_step(session, fetches):
                _meet(guard, session, graph)
            return guard.run(original_run, session, fetches, *args, **kwargs)

        session_class.run = run
        _guard = guard
    return _guard


def _meet(guard: LostWorkerGuard, session, graph) -> None:
    """Before the first synchronized step of `graph`: servers up, heartbeat on, layers compared."""
    from graphsync.errors import GraphsyncError
    with _lock:
        unmet = _unmet.pop(graph, None)
    if unmet is None:
        return
    task, group, fingerprints = unmet
    try:
        guard.meet(task, session.sess_str, fingerprints, group.heartbeat, group.timeout, longer=LONGER)
    except GraphsyncError as exc:
        _say(f"error: {' '.join(str(exc).split())}")
        raise SystemExit(1) from None


def _say(line: str) -> None:
    sys.stderr.write(f"graphsync: {line}\n")
    sys.stderr.flush()
