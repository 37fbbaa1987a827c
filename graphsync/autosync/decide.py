"""The per-graph decision of `graphsync run`: each graph rewritten at most once, before its first
use; graphs without towers or batch norm, and graphs the script rewrote itself, left alone.

Before a run the check is one version comparison (graphsync.autosync.session_copies); the graph is
looked at again only when it gained ops that may be batch norm since the last look. A rewrite that
would edit ops an open session already holds is refused (that session would ignore the edits),
and batch norm added to the towers after the rewrite is reported: never an unsynchronized step
without a line. The per-graph choice is `options_for(graph)` (None: leave it alone); a subclass
extends it without touching the rest.

Nothing here imports TensorFlow at import time: the script imports it first.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import warnings
import weakref

from graphsync.autosync.session_copies import SessionCopies

ON_ERROR = ("fail", "warn")


class GraphDecisions:
    """The per-graph half of `graphsync run`: which graph to rewrite, when, and what the user is
    told; the patches (graphsync/autosync/patching.py) only call first_use and before_run.

    options:  keyword arguments of rewrite_towers (towers, device, strategy, group_size).
    on_error: 'fail' — a graph that cannot be rewritten stops the script (one line on stderr,
              SystemExit(1)), the graph untouched; 'warn' — one line, and the script runs on
              with that graph unsynchronized.
    quiet / verbose: no lines but errors / also the layer table and the graphs left alone.
    """

    def __init__(self, *, on_error: str = "fail", quiet: bool = False, verbose: bool = False, stream=None,
                 **options):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        self.options = options
        self.on_error = on_error
        self.quiet, self.verbose = quiet, verbose
        self.stream = stream
        self.reports: list = []                     # RewriteReport of every graph rewritten, in order
        self._decided = weakref.WeakSet()            # graphs first_use is done with
        self._numbers = weakref.WeakKeyDictionary()  # graph → its number in messages, in order of first use
        self._count = itertools.count(1)
        self._looked_at = weakref.WeakKeyDictionary()  # graph → its version when last looked at
        self._synchronized = weakref.WeakKeyDictionary()  # graph rewritten here → its RewriteOptions
        self._lock = threading.RLock()
        self._copies = SessionCopies()
        self._said_traces: set = set()   # (function, summary) said once (autosync/functions.py)
        self.told = 0   # lines meant for every user so far (said unless quiet): a decision the user hears of

    # -- the per-graph decision ------------------------------------------------------------

    def options_for(self, graph) -> dict | None:
        """rewrite_towers' keyword arguments for `graph`, or None to leave it alone."""
        return dict(self.options)

    def first_use(self, graph) -> None:
        """Called by the patches before each session is created on `graph`, before it is
        finalized, and before a session's run copies the ops added since its last one. A graph is
        decided once it is rewritten, refused, rewritten by the script, or left alone by
        options_for; one with nothing to synchronize yet (a session opened before the towers were
        built) is looked at again once it grew: on its next session, run or finalization."""
        with self._lock:
            if graph in self._decided or self._looked_at.get(graph) == graph.version:
                return
            if graph not in self._numbers:
                self._numbers[graph] = next(self._count)
            number = self._numbers[graph]
            from graphsync import rewrite  # TensorFlow is imported by now
            if rewrite.was_rewritten(graph):
                self._decided.add(graph)
                self._say(f"graph {number}: already rewritten by the script", verbose_only=True)
                return
            options = self.options_for(graph)
            if options is None:
                self._decided.add(graph)
                return
            if self._rewrite(graph, f"graph {number}", options):
                self._decided.add(graph)
            self._looked_at[graph] = graph.version   # undecided: looked at again once ops are added

    def before_run(self, session) -> None:
        """Before `session` copies its graph into its runtime, when the graph grew since the
        session's last copy (the patch checks that much on every run). The graph is looked at again
        only if the ops added since the last look may hold batch norm."""
        graph = session.graph
        with self._lock:
            if self._may_have_gained_batch_norm(graph):
                if graph in self._synchronized:
                    self._refuse_layers_added_after_the_rewrite(graph)
                else:
                    self.first_use(graph)
            self._copies.record(session, graph)

    def _may_have_gained_batch_norm(self, graph) -> bool:
        """False when the ops added since the last look include no op type a batch-norm match
        starts from (graphsync.match.starting_types): one pass over those ops, not the graph."""
        looked = self._looked_at.get(graph)
        if looked is None:
            return True
        from graphsync import match
        from graphsync.graph import tf_private
        starts = match.starting_types()
        if looked != graph.version and starts is not None and \
                not any(op.type in starts for op in tf_private.ops_added_since(graph, looked)):
            self._looked_at[graph] = graph.version
        return self._looked_at[graph] != graph.version

    def _refuse_layers_added_after_the_rewrite(self, graph) -> None:
        """Batch norm added to the towers of a graph after graphsync synchronized it would run
        unsynchronized: one line (and with on_error='fail', the script stops before that run)."""
        from graphsync.errors import GraphsyncError
        from graphsync.plan.normalizations import normalizations
        self._looked_at[graph] = graph.version
        try:
            plan = _plan(graph, self._synchronized[graph])
        except GraphsyncError:
            return   # half built (a layer in some towers only): looked at again at the next run once it grew
        if plan.layers or plan.calls:
            del self._synchronized[graph]   # said once
            n = len(normalizations(plan.layers))   # a batch norm by hand is one, however many reductions
            count = f"{n} batch-norm layer{'s' if n > 1 else ''}" if plan.layers \
                else f"{len(plan.calls)} tf.function call{'s' if len(plan.calls) > 1 else ''} running batch norm"
            first = plan.layers[0].sites[0].op.name if plan.layers else plan.calls[0].name
            self.failed(graph, f"graph {self._numbers[graph]}: {count} added to its towers after it was "
                               f"synchronized (first: {first}) would run unsynchronized: "
                               "build the whole model before its first session or run, or call "
                               "graphsync.rewrite_towers() after its last layer")

    def _refuse_if_already_copied(self, graph, label: str, options) -> None:
        """A GraphsyncError when an open session already holds an op the rewrite would edit."""
        if not self._copies.held(graph):
            return   # the usual case: no open session has run this graph yet, nothing to plan twice
        from graphsync.errors import GraphsyncError
        plan = _plan(graph, options)
        op = self._copies.first_held(graph, [site.op for layer in plan.layers for site in layer.sites] + list(plan.calls))
        if op is not None:
            raise GraphsyncError(
                f"{label}: {op.name} was part of a Session.run before the other towers were built, "
                "and that session (still open) would ignore the rewrite: build every tower before the first "
                "run, or call graphsync.rewrite_towers() once they are built and run them in a new session")

    def decide_function(self, graph, label: str, replicated: bool, options=None) -> None:
        """A tf.function's graph just traced (graphsync/autosync/functions.py), rewritten as a graph
        is (with `options`, a RewriteOptions, when given, instead of options_for's); one traced under
        a strategy in which no towers are found is said, never left silent."""
        with self._lock:
            options = self.options_for(graph) if options is None else options
            if options is not None:
                self._rewrite(graph, label, options, replicated=replicated)

    def _rewrite(self, graph, label: str, options, replicated: bool = False) -> bool:
        """Whether the graph is decided: rewritten, or refused. `options`: a RewriteOptions, or
        options_for's keyword arguments, made one here, where a bad one is said like a refusal."""
        from graphsync.errors import GraphsyncError, GraphsyncWarning, NoTowersError
        from graphsync.plan.options import RewriteOptions
        from graphsync.rewrite import rewrite_with
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GraphsyncWarning)
            try:
                if not isinstance(options, RewriteOptions):
                    options = RewriteOptions.of(**options)
                self._refuse_if_already_copied(graph, label, options)
                report = rewrite_with(graph, options)
            except NoTowersError as exc:   # said by default when scopes look like towers
                self.left_alone(graph, label, exc, replicated)
                return False
            except GraphsyncError as exc:
                self.failed(graph, _one_line(exc))
                return True
            except Exception as exc:  # noqa: BLE001 - the user gets one line, never a traceback
                if os.environ.get("GRAPHSYNC_DEBUG"):
                    raise
                self.failed(graph, f"internal error: {type(exc).__name__}: {_one_line(exc)} "
                                   "(set GRAPHSYNC_DEBUG=1 for the traceback, and please report it)", fatal=True)
                return True
            finally:
                for warning in caught:
                    if issubclass(warning.category, GraphsyncWarning):
                        self._say(f"warning: {_one_line(warning.message)}")
                    else:
                        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        if report.changed:
            self._synchronized[graph] = options
            self.rewritten(graph, report, label)
        else:
            self._say(f"{label} left alone: {report.summary}", verbose_only=True)
        return report.changed

    # -- what the user sees ----------------------------------------------------------------

    def left_alone(self, graph, label: str, exc, replicated: bool = False) -> None:
        """A graph without towers: said by default only when its scopes look like towers, or when a
        distribution strategy traced it (its replicas then train apart: a refusal)."""
        if replicated:
            self.failed(graph, f"{label} was traced under a distribution strategy, but graphsync finds no "
                               f"replicas in it to synchronize: {_one_line(exc)}")
        else:
            self._say(f"{label} left alone: {_one_line(exc)}", verbose_only=not exc.parallel_structure)

    def say(self, line: str) -> None:
        self._say(line)

    def once(self, line: str, say) -> None:
        """`say(line)` the first time only: a decision about a traced step holds for all its
        traces. Counted as told every time, so the guard below the decision stays quiet."""
        if line in self._said_traces:
            self.told += 1
            return
        self._said_traces.add(line)
        say(line)

    def synchronized(self, graph) -> bool:
        """Whether `graph` was rewritten here."""
        return graph in self._synchronized

    def rewritten(self, graph, report, label: str = "") -> None:
        self.reports.append(report)
        prefix = f"{label}: " if label.startswith("tf.function") else ""
        if prefix and not self.verbose:   # a retrace synchronized as the trace before it: said once
            if (prefix, report.summary) in self._said_traces:
                return
            self._said_traces.add((prefix, report.summary))
        if self.verbose:
            for line in str(report).splitlines():
                self._say(prefix + line if line == report.summary else line)
        else:
            self._say(prefix + report.summary)
            if report.shared_moving:
                self._say(report.shared_moving)

    def failed(self, graph, message: str, fatal: bool = False) -> None:
        """A graph that cannot be rewritten (left untouched): stop, or warn and go on."""
        if self.on_error == "warn" and not fatal:
            self._say(f"warning: {message} (running unsynchronized)", error=True)
            return
        self._say(f"error: {message}", error=True)
        raise SystemExit(1)

    def _say(self, line: str, verbose_only: bool = False, error: bool = False) -> None:
        self.told += not verbose_only
        if (self.quiet and not error) or (verbose_only and not self.verbose):
            return
        stream = self.stream or sys.stderr
        stream.write(f"graphsync: {line}\n")
        stream.flush()


def _plan(graph, options):
    """The plan a rewrite with `options` (a RewriteOptions) would splice, its tf.function calls
    listed rather than inlined: the graph untouched."""
    from graphsync.rewrite import plan_with
    return plan_with(graph, options, inline_calls=False)[0]


def _one_line(text) -> str:
    return " ".join(str(text).split())
