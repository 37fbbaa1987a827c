"""Which session runs of a between-graph worker are synchronized steps, and stopping them.

A run is a synchronized step when something it fetches depends (through data or control edges)
on a collective, or on a queue of the exchange through a parameter server
(graphsync/exchange/queues.py): only those wait for the other workers. Saving a checkpoint, reading
a variable or evaluating on the worker's own graph do not, so a peer that already finished and
exited never stops them. `Steps` counts the synchronized steps this process has started (the number a lost
worker's line names), knows which are running, and can cancel them by closing every session that
ran one (TensorFlow then fails the run with CancelledError, as it does for `Session.close()`).
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

from graphsync.graph import marks
from graphsync.graph.marks import Mark
from graphsync.graph.op_types import COLLECTIVE_TYPES


class Steps:
    def __init__(self):
        self.graphs = weakref.WeakSet()      # the synchronized graphs
        self.sessions = weakref.WeakSet()    # sessions that ran a synchronized step
        self.started = 0                     # synchronized steps started so far in this process
        self.running = 0
        self._reaches = weakref.WeakKeyDictionary()   # graph → {fetched op names: bool}
        self._lock = threading.Lock()

    def is_step(self, session, fetches) -> bool:
        """Whether `session.run(fetches)` is a synchronized step (unknown fetches: yes)."""
        graph = getattr(session, "graph", None)
        if graph is None or graph not in self.graphs:
            return False
        names = _fetched_ops(graph, fetches)
        if names is None:
            return True
        known = self._reaches.setdefault(graph, {})
        if names not in known:
            known[names] = _reaches_collective(graph, names)
        return known[names]

    def begin(self, session) -> int:
        with self._lock:
            self.sessions.add(session)
            self.started += 1
            self.running += 1
            return self.started

    def end(self) -> None:
        with self._lock:
            self.running -= 1

    def cancel(self) -> None:
        """Closes every session that ran a synchronized step: running steps fail, later ones too."""
        for session in list(self.sessions):
            try:
                session.close()
            except Exception:  # noqa: BLE001 - a session already broken is as good as closed
                pass


def _fetched_ops(graph, fetches) -> tuple | None:
    """The sorted names of the ops `fetches` (any nest of tensors, ops, variables, names) reads."""
    import tensorflow as tf
    names = set()
    try:
        for leaf in tf.nest.flatten(_unkeyed(fetches)):
            element = graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
            names.add((element if isinstance(element, tf.Operation) else element.op).name)
    except Exception:  # noqa: BLE001 - fetches graphsync cannot read: assume the worst
        return None
    return tuple(sorted(names))


def _unkeyed(fetches):
    """`fetches` with every mapping, list and tuple made a list of its values: tf.nest sorts a
    mapping's keys, and MonitoredSession's fetches are keyed by "caller" and by its hook objects,
    which do not sort (every run of a MonitoredTrainingSession, a read of the global step too, was
    counted as a synchronized step)."""
    if isinstance(fetches, Mapping):
        return [_unkeyed(value) for value in fetches.values()]
    if isinstance(fetches, (list, tuple)):
        return [_unkeyed(value) for value in fetches]
    return fetches


def _reaches_collective(graph, names: tuple) -> bool:
    seen, stack = set(names), [graph.get_operation_by_name(n) for n in names]
    while stack:
        op = stack.pop()
        if op.type in COLLECTIVE_TYPES or (op.type.startswith("Queue") and marks.has(op, Mark.EXCHANGE)):
            return True
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return False
