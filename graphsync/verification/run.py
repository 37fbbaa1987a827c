"""Running a graph the way verify needs: on as many CPU devices as the graph names, every run
starting from the same variable values, the first run traced.

Graphs placed on GPUs (or on other tasks) are imported into a copy whose devices are CPUs, one per
device the graph names, so the cross-device structure (and its traffic) stays as it was.
"""
from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.verification.discovery import Subject

tf1 = tf.compat.v1
TIMEOUT_MS = 300_000


def _is_local_cpu(spec: tf.DeviceSpec) -> bool:
    return (spec.job in (None, "localhost") and spec.replica in (None, 0) and spec.task in (None, 0)
            and spec.device_type in (None, "CPU"))


def on_cpus(graph: tf.Graph) -> tuple[tf.Graph, dict, int]:
    """(graph, {device it named: CPU it runs on}, number of CPUs to configure). The graph itself
    when it names only local CPUs; else a copy with every device mapped to its own CPU."""
    devices = sorted({op.device for op in graph.get_operations() if op.device})
    specs = {d: tf.DeviceSpec.from_string(d) for d in devices}
    if all(_is_local_cpu(s) for s in specs.values()):
        indices = [s.device_index or 0 for s in specs.values() if s.device_type == "CPU"]
        return graph, {}, max(indices, default=0) + 1
    used = {s.device_index or 0 for s in specs.values() if _is_local_cpu(s) and s.device_type}
    mapping, keys, next_free = {}, {}, 0
    for device, spec in specs.items():
        if spec.device_type is None:
            mapping[device] = ""
            continue
        if _is_local_cpu(spec):
            mapping[device] = f"/device:CPU:{spec.device_index or 0}"
            continue
        key = (spec.job, spec.replica, spec.task, spec.device_type, spec.device_index or 0)
        if key not in keys:
            while next_free in used:
                next_free += 1
            keys[key] = next_free
            used.add(next_free)
        mapping[device] = f"/device:CPU:{keys[key]}"
    graph_def = graph.as_graph_def()
    for node in graph_def.node:
        if node.device:
            node.device = mapping[node.device]
    copy = tf.Graph()
    with copy.as_default(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf1.import_graph_def(graph_def, name="")
    shown = {d: m for d, m in mapping.items() if m and not _is_local_cpu(specs[d])}
    return copy, shown, max(used, default=0) + 1


def config(cpus: int) -> tf1.ConfigProto:
    """`cpus` CPU devices; no Grappler, so the step statistics name the graph's own ops."""
    proto = tf1.ConfigProto(device_count={"CPU": max(cpus, 1)}, allow_soft_placement=True,
                            inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
    proto.graph_options.rewrite_options.disable_meta_optimizer = True
    return proto


@dataclasses.dataclass
class Fetched:
    loss: list
    gradients: list
    updates: list
    other_writes: list
    statistics: list   # every layer's statistics in every tower, in Subject.layer_statistics' order


class Runner:
    """One session on `subject`'s graph; every run starts from the same variable values (those in
    `initial_values`, by variable name, else the graph's initializers, computed once). Each
    per-tower copy of a main-tower variable (subject.copies) starts as that variable: a replicated
    trainer copies them before its first step, and its towers compute one function only then."""

    def __init__(self, subject: Subject, batch, cpus: int, initial_values: dict | None = None):
        self.subject, self.batch = subject, batch
        graph = subject.graph
        self._fetches = [[graph.get_tensor_by_name(n) for n in names] for names in subject.fetched]
        self._init_ops = [graph.get_operation_by_name(v.initializer) for v in subject.variables]
        init_values = [graph.get_tensor_by_name(v.initial_value) for v in subject.variables]
        self._session = tf1.Session(graph=graph, config=config(cpus))
        given = initial_values or {}
        missing = [t for v, t in zip(subject.variables, init_values) if v.name not in given]
        try:
            computed = dict(zip([t.name for t in missing],
                                _run(self._session, missing, {}, "initializing the variables")))
        except GraphsyncError:
            self.close()
            raise
        self.initial_values = {v.name: given[v.name] if v.name in given else computed[t.name]
                               for v, t in zip(subject.variables, init_values)}
        for copy, main in subject.copies.of.items():
            if copy in self.initial_values and main in self.initial_values:
                self.initial_values[copy] = self.initial_values[main]
        self._init_feed = {t: self.initial_values[v.name] for v, t in zip(subject.variables, init_values)}
        self.metadata = None

    def run(self, order=None, trace: bool = False) -> Fetched:
        """The fetches with the examples in `order` (None: as drawn); `trace` keeps the step
        statistics and partition graphs in `self.metadata`."""
        _run(self._session, self._init_ops, self._init_feed, "initializing the variables")
        kw = {}
        if trace:
            self.metadata = tf1.RunMetadata()
            kw = {"options": tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True,
                                            timeout_in_ms=TIMEOUT_MS), "run_metadata": self.metadata}
        else:
            kw = {"options": tf1.RunOptions(timeout_in_ms=TIMEOUT_MS)}
        feed = self.batch.feed(self.subject.graph, order)
        return Fetched(*_run(self._session, self._fetches, feed, "running the graph", **kw))

    def close(self) -> None:
        self._session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _run(sess, fetches, feed, what, **kw):
    if isinstance(fetches, list) and not fetches:
        return []
    try:
        return sess.run(fetches, feed, **kw)
    except tf.errors.DeadlineExceededError:
        raise GraphsyncError(f"{what} timed out after {TIMEOUT_MS // 1000} s (an input pipeline "
                             "waiting for data? name the tensors to feed with --input)") from None
    except tf.errors.OpError as exc:
        where = f" at {exc.op.name}" if getattr(exc, "op", None) is not None else ""
        raise GraphsyncError(f"{what} failed{where}: {_cause(exc.message)}") from None


def _cause(message: str) -> str:
    """The line of a TensorFlow run error that says what went wrong: TensorFlow 2.x heads it with
    "Graph execution error:" and the node's Python trace, lists several root errors as
    "  (0) INVALID_ARGUMENT: …", and names the node in brackets."""
    lines = str(message).split("\n")
    for line in lines:
        root = _ROOT_ERROR.match(line)
        if root or line.strip() and not line.startswith((" ", "\t", *_NOT_THE_CAUSE)) and not _ROOT_ERRORS.match(line):
            return " ".join((root.group(1) if root else line).split())
    return " ".join(lines[0].split())


_ROOT_ERROR = re.compile(r"\s*\(\d+\) (?:[A-Z_]+: )?(.*)")
_ROOT_ERRORS = re.compile(r"\d+ root error\(s\) found")
_NOT_THE_CAUSE = ("Graph execution error", "Detected at node", "Node: ", "[[", "Original stack trace")


def relative_change(drawn: list, exchanged: list) -> float | None:
    """‖exchanged − drawn‖ / ‖drawn‖ over all values together (None when there are none; inf for
    non-finite values)."""
    if not drawn:
        return None
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in drawn])
    b = np.concatenate([np.asarray(x, np.float64).ravel() for x in exchanged])
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("inf")
    scale = np.linalg.norm(a)
    difference = np.linalg.norm(b - a)
    return float(difference / scale) if scale > 0 else (0.0 if difference == 0 else float("inf"))
