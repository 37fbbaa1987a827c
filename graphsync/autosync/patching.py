"""The TensorFlow entry points `graphsync run` patches, so that every multi-tower graph of an
unchanged script is decided (graphsync/autosync/decide.py) just before it is first used.

`graphsync run train.py` installs an AutoSync before the script starts. Once TensorFlow is
imported (by the script, whenever it does), these entry points are patched:

    BaseSession.__init__  every session class (Session, InteractiveSession, the sessions that
                          MonitoredSession, Supervisor and SessionManager create) on its graph
    Graph.finalize        Supervisor and Scaffold freeze the graph before any session exists
    BaseSession._extend_graph
                          before every run, partial_run_setup and make_callable of every session
                          copies the graph's new ops into its runtime: a session opened before the
                          towers were built (`with tf.Graph().as_default(), tf.compat.v1.Session()`
                          around the script, an InteractiveSession on its first line) shows them here
    func_graph_from_py_func
                          every tf.function trace in TF2 (graphsync/autosync/functions.py): the
                          traced step, rewritten before TensorFlow makes a function of it
    Strategy.run          which strategy put replicas into the function being traced: a step
                          is decided by it, also when the tf.function was defined and called
                          outside `strategy.scope()` (TensorFlow's multi-worker custom loop)
    imperative_grad, the gradient registry's lookup
                          a GradientTape's backward: which forward op each of its gradient
                          functions differentiates (graphsync/graph/tape.py; installed once for
                          the process when graphsync's rewrite is imported)

Each hands the graph to `first_use` (or, before a run, `before_run`). The patch table is
`AutoSync.patch_points()`: a subclass extends it without touching the rest.

Nothing here imports TensorFlow: until the script imports it, the only cost is one entry in
sys.meta_path that waits for the `tensorflow` package to finish importing.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import threading

from graphsync.autosync.decide import GraphDecisions, _one_line


class AutoSync(GraphDecisions):
    """Rewrites every multi-tower graph once, before its first session, finalization or run
    (options as GraphDecisions takes them), by patching TensorFlow while installed."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._undo: list = []
        self._waiting = None

    # -- the patches -----------------------------------------------------------------------

    def patch_points(self) -> list:
        """(owner, attribute, replacement) for every TensorFlow entry point to intercept; called
        once TensorFlow is imported."""
        import tensorflow as tf

        # graphsync.rewrite registers graphsync's gradients, as `import graphsync` after TensorFlow
        # does: a script that differentiates a graph rewritten earlier (a saved one) needs them
        from graphsync import rewrite  # noqa: F401
        from graphsync.graph import tf_private
        first_use, before_run, copies = self.first_use, self.before_run, self._copies
        session_class = tf_private.session_base_class()
        extend = tf_private.session_extend_method()
        original_init, original_finalize = session_class.__init__, tf.Graph.finalize
        original_extend = getattr(session_class, extend)

        def session_init(session, *args, **kwargs):
            graph = kwargs.get("graph", args[1] if len(args) > 1 else None)
            try:
                first_use(graph if isinstance(graph, tf.Graph) else tf.compat.v1.get_default_graph())
            except BaseException:
                tf_private.disarm_unopened_session(session)   # its __del__ must not complain
                raise
            original_init(session, *args, **kwargs)

        def finalize(graph):
            if not graph.finalized:
                first_use(graph)
            return original_finalize(graph)

        def extend_graph(session):
            if not copies.up_to_date(session, session.graph):
                before_run(session)
            return original_extend(session)

        trace_module, trace_name = tf_private.tracing_entry_point()
        original_trace = getattr(trace_module, trace_name)
        traced = self.traced

        def trace(*args, **kwargs):
            strategy, one_replica = _strategy(), _in_one_replica()
            with _strategies_run() as ran:
                graph = original_trace(*args, **kwargs)
            if not one_replica and tf.compat.v1.executing_eagerly_outside_functions():
                traced(graph, strategy or _widest(ran) or _strategy())
            return graph

        run_owner = next(c for c in tf.distribute.Strategy.__mro__ if "run" in c.__dict__)
        original_run = run_owner.__dict__["run"]

        default = tf_private.default_strategy()   # no replicas of its own: nothing to record

        def run(strategy, *args, **kwargs):
            if strategy is not default:
                _record_run(strategy)
            return original_run(strategy, *args, **kwargs)

        from graphsync.graph import tape
        return [(session_class, "__init__", session_init), (tf.Graph, "finalize", finalize),
                (session_class, extend, extend_graph), (trace_module, trace_name, trace),
                (run_owner, "run", run)] + tape.patch_points()

    def traced(self, graph, strategy) -> None:
        """A tf.function trace outside any one replica, finished (graphsync/autosync/functions.py)."""
        from graphsync.autosync import functions
        functions.traced(self, graph, strategy)

    def install(self) -> "AutoSync":
        """Patches TensorFlow now if it is imported, else as soon as it is."""
        module = sys.modules.get("tensorflow")
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            self._patch()
        else:
            self._waiting = _AfterImport("tensorflow", lambda _module: self._patch())
            sys.meta_path.insert(0, self._waiting)
        return self

    def uninstall(self) -> None:
        """Undoes the patches (or stops waiting for TensorFlow)."""
        if self._waiting is not None and self._waiting in sys.meta_path:
            sys.meta_path.remove(self._waiting)
        self._waiting = None
        for owner, attribute, saved in reversed(self._undo):
            if saved is _ABSENT:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, saved)
        self._undo.clear()

    def _patch(self) -> None:
        try:
            self._check_options()
            points = self.patch_points()
        except Exception as exc:  # noqa: BLE001 - a bad option is one line, like a bad graph
            if os.environ.get("GRAPHSYNC_DEBUG"):
                raise
            self.failed(None, _one_line(exc), fatal=True)
            return
        for owner, attribute, replacement in points:
            self._undo.append((owner, attribute, owner.__dict__.get(attribute, _ABSENT)))
            setattr(owner, attribute, replacement)

    def _check_options(self) -> None:
        """The options, before the first graph (graphsync/plan/options.py: every rule about them),
        and what needs TensorFlow to validate (the device name), checked when it is imported."""
        from graphsync.plan.options import RewriteOptions
        RewriteOptions.of(**self.options)
        device = self.options.get("device")
        if device:
            import tensorflow as tf
            try:
                tf.DeviceSpec.from_string(device)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"invalid device {device!r}: {_one_line(exc)}") from None

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc_info):
        self.uninstall()


_ABSENT = object()


def _strategy():
    """The tf.distribute strategy in scope in this thread, or None for the default one."""
    import tensorflow as tf
    return tf.distribute.get_strategy() if tf.distribute.has_strategy() else None


_running = threading.local()   # .frames: per trace in progress in this thread, the strategies run in it


@contextlib.contextmanager
def _strategies_run():
    """The strategies whose `run` put replicas into the function being traced: a step is decided
    by the strategy that made its replicas, wherever the tf.function was defined and whether or
    not the trace began inside `strategy.scope()` (TensorFlow's multi-worker custom-loop tutorial
    defines and calls its step outside the scope; `strategy.run` enters it only inside)."""
    frames = _running.__dict__.setdefault("frames", [])
    frames.append([])
    try:
        yield frames[-1]
    finally:
        frames.pop()


def _record_run(strategy) -> None:
    frames = getattr(_running, "frames", None)
    if frames:
        frames[-1].append(strategy)


def _widest(strategies: list):
    """Of the strategies run in a trace, the one spanning the most replicas, or None."""
    return max(strategies, key=lambda s: s.num_replicas_in_sync, default=None)


def _in_one_replica() -> bool:
    """Whether this thread runs one replica of several (inside `strategy.run`): what it traces is
    that replica's part of a step, which the step's own trace holds and rewrites."""
    import tensorflow as tf
    context = tf.distribute.get_replica_context()
    return context is not None and tf.distribute.has_strategy() and context.num_replicas_in_sync > 1


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once the module `name` has finished executing, by wrapping its
    loader's exec_module for that one import; then steps out of sys.meta_path."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_call(module):
            try:
                exec_module(module)
            finally:
                loader.__dict__.pop("exec_module", None)
            self.callback(module)

        loader.exec_module = exec_then_call
        return spec


