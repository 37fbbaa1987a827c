"""How much of its graph each session has copied into TensorFlow's runtime, for `graphsync run`.

Before every run (and partial_run_setup, make_callable) a session copies the ops added to its
graph since its last run into its runtime (tf_private.session_extend_method). An op edited after
that keeps running in that session as it was, silently: TensorFlow ignores the edit. So a graph
can be rewritten before a run only if no open session holds a copy of an op the rewrite edits.

`SessionCopies` keeps, per session, Graph.version at its last copy. Versions only grow and count
the ops created so far, so that one number says which ops the session holds (the `version` oldest)
and whether its next run copies anything new (the graph's version moved): the check before every
run is one dictionary lookup and one comparison, with no walk of the graph. Importing this module
imports no TensorFlow (graphsync.autosync.patching imports it before the script imports TensorFlow).
"""
from __future__ import annotations

import weakref


class SessionCopies:
    """id(session) → graph.version when the session last copied its graph.

    Keyed by id, not by a weak reference to the session: the lookup before every run then builds no
    weakref (measured 0.2 against 0.5 µs); each entry goes when its session is collected."""

    def __init__(self):
        self._versions: dict[int, int] = {}
        self._sessions = weakref.WeakValueDictionary()   # id(session) → session, for held()

    def up_to_date(self, session, graph) -> bool:
        """Whether the session's next copy would add nothing: the per-run check."""
        return self._versions.get(id(session)) == graph.version

    def record(self, session, graph) -> None:
        """The session is about to copy `graph` as it is now."""
        key = id(session)
        if key not in self._sessions:
            self._sessions[key] = session
            weakref.finalize(session, self._versions.pop, key, None)
        self._versions[key] = graph.version

    def held(self, graph) -> int:
        """How many ops of `graph` (the oldest) an open session already holds: 0 when none."""
        from graphsync.graph import tf_private
        return max((self._versions.get(key, 0) for key, session in list(self._sessions.items())
                    if session.graph is graph and tf_private.session_is_open(session)), default=0)

    def first_held(self, graph, ops):
        """The oldest of `ops` that an open session of `graph` already holds, or None.

        Every op a rewrite edits consumes one of its batch-norm ops (directly or through ops created
        after them), and an op is always created after its inputs: passing the batch-norm ops of the
        plan is enough."""
        from graphsync.graph import tf_private
        version = self.held(graph)
        if not version or not ops:
            return None
        return min((op for op in ops if tf_private.existed_at(op, version)), key=tf_private.creation_order,
                   default=None)
