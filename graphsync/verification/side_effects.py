"""What in a graph reaches outside this process when verify runs it.

`inspect` and `rewrite` only read a saved graph; `verify` runs it, and a graph from elsewhere can
read and write files, open connections or call Python. So before the first step (initializers
included: they can write files too) verify looks at what its runs would execute — the ancestors
of what run.Runner fetches and runs, through data and control edges and into every function those
ops call — and refuses when any of it reaches outside the process, unless the user trusts the graph
(--allow-side-effects). A tensor verify feeds cuts the walk: its producer does not run, so input
pipelines and queues whose outputs verify feeds never read their files.

Found by op type (OP_TYPES, one table by category) and, for the few ops that reach out only when
an attribute or input says so (a print to a file, a dataset cached on disk, a debug op with a URL),
by that attribute or input.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.errors import GraphsyncError
from graphsync.graph import tf_private
from graphsync.graph.executed import executed
from graphsync.verification.discovery import Subject

READS = "reads a file"
WRITES = "writes a file"
READS_OR_WRITES = "reads or writes files"
CONNECTS = "opens a connection"
CALLS_PYTHON = "calls Python"
SHOWN = 3   # ops the refusal names before "and N more"

# Op type → what it reaches, by category. Collectives, Send/Recv and ops placed on remote tasks are
# verify's own: they run in this process on the CPUs run.on_cpus maps every device to.
OP_TYPES = {
    # files read: the file ops, readers and their reads, file datasets, checkpoint restores,
    # vocabularies, memory-mapped constants
    READS: frozenset({
        "ReadFile", "MatchingFiles", "MatchingFilesDataset", "ExperimentalMatchingFilesDataset", "RecordInput",
        "TFRecordReader", "TFRecordReaderV2", "TextLineReader", "TextLineReaderV2", "WholeFileReader",
        "WholeFileReaderV2", "FixedLengthRecordReader", "FixedLengthRecordReaderV2", "LMDBReader",
        "IdentityReader", "IdentityReaderV2", "ReaderRead", "ReaderReadV2", "ReaderReadUpTo", "ReaderReadUpToV2",
        "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset", "SqlDataset",
        "ExperimentalSqlDataset", "LMDBDataset", "ExperimentalLMDBDataset", "LoadDataset", "SnapshotChunkDataset",
        "SnapshotDatasetReader", "ListSnapshotChunksDataset",
        "Restore", "RestoreV2", "RestoreSlice", "DTensorRestoreV2",
        "ImmutableConst", "LoadAndRemapMatrix", "GenerateVocabRemapping", "InitializeTableFromTextFile",
        "InitializeTableFromTextFileV2"}),
    # files written: the file op, checkpoints, datasets saved, summaries and their event files, dumps
    WRITES: frozenset({
        "WriteFile", "Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints", "DatasetToTFRecord",
        "ExperimentalDatasetToTFRecord", "SaveDataset", "SaveDatasetV2",
        "SummaryWriter", "CreateSummaryFileWriter", "CreateSummaryDbWriter", "WriteSummary", "WriteScalarSummary",
        "WriteHistogramSummary", "WriteImageSummary", "WriteAudioSummary", "WriteGraphSummary",
        "WriteRawProtoSummary", "ImportEvent", "FlushSummaryWriter", "CloseSummaryWriter",
        "StatsAggregatorSetSummaryWriter", "CalibrationStatisticsSaver", "DumpTensor"}),
    # either, depending on what is on disk: snapshots; the file systems' own settings
    READS_OR_WRITES: frozenset({"SnapshotDataset", "SnapshotDatasetV2", "FileSystemSetConfiguration"}),
    # the network: RPC (Rpc and TryRpc are TF1 contrib's), the tf.data service, calls on a target named at run time
    CONNECTS: frozenset({
        "RpcClient", "RpcCall", "RpcCheckStatus", "RpcGetValue", "RpcServer", "RpcServerRegister", "RpcServerStart",
        "Rpc", "TryRpc", "DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4",
        "RegisterDataset", "RegisterDatasetV2", "DistributedSave", "RemoteCall"}),
    # Python callbacks (tf.py_func, tf.numpy_function, tf.py_function): whatever the callback does
    CALLS_PYTHON: frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"}),
}
CATEGORY = {op_type: category for category, types in OP_TYPES.items() for op_type in types}
PRINT_TYPES = ("PrintV2",)                        # to a file when output_stream is file://…
CACHE_TYPES = ("CacheDataset", "CacheDatasetV2")  # on disk unless the filename is empty
DEBUG_TYPES = ("DebugIdentity", "DebugIdentityV2", "DebugIdentityV3", "DebugNanCount", "DebugNumericSummary")
CONDITIONAL_TYPES = frozenset(PRINT_TYPES + CACHE_TYPES + DEBUG_TYPES)


@dataclasses.dataclass(frozen=True)
class Reach:
    """One op verify would run that reaches outside the process."""

    name: str       # the op, or "<node> in <the graph op calling its function>"
    category: str   # READS, WRITES, …

    def __str__(self) -> str:
        return f"{self.name} ({self.category})"


def find(subject: Subject) -> list[Reach]:
    """Every op run.Runner's runs execute that reaches outside the process, sorted by name: the
    variables' initial values (computed with nothing fed), their initializers (fed those values)
    and the fetches (fed the inputs)."""
    graph = subject.graph
    initial_values = [graph.get_tensor_by_name(v.initial_value) for v in subject.variables]
    initializers = [graph.get_operation_by_name(v.initializer) for v in subject.variables]
    fetches = [graph.get_tensor_by_name(n) for names in subject.fetched for n in names]
    inputs = {n for item in subject.inputs for n in item.tensors}
    ran = executed([t.op for t in initial_values], set())
    ran |= executed(initializers, {t.name for t in initial_values})
    ran |= executed([t.op for t in fetches if t.name not in inputs], inputs)
    library = tf_private.function_library(graph)
    found, function_attrs = set(), {}   # op type → its function-typed attributes
    for op in ran:
        category = _category(op.type, op.node_def.attr if op.type in CONDITIONAL_TYPES else None,
                             _graph_constant(op))
        if category:
            found.add(Reach(op.name, category))
        if op.type not in function_attrs:
            function_attrs[op.type] = [a.name for a in op.op_def.attr if a.type in ("func", "list(func)")]
        called = _called(op, function_attrs[op.type], library)
        if called:
            found.update(_in_functions(called, library, op.name))
    return sorted(found, key=lambda r: r.name)


def check(subject: Subject, allowed: bool, which: str = "the graph") -> str | None:
    """Raises GraphsyncError naming what `which` reaches outside the process, unless `allowed`;
    allowed, the report's note listing it (None when nothing does)."""
    found = find(subject)
    if not found:
        return None
    if not allowed:
        raise GraphsyncError(f"{which} reaches outside this process: {_listed(found)}; verify runs "
                             f"{'the graph' if which == 'the graph' else 'it'}: pass --allow-side-effects "
                             "if you trust it")
    ops = "1 op that reaches" if len(found) == 1 else f"{len(found)} ops that reach"
    return f"{which} ran {ops} outside the process: {_listed(found)}"


def _listed(found: list[Reach]) -> str:
    shown = ", ".join(str(r) for r in found[:SHOWN])
    return shown + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")


def _in_functions(names: list, library: dict, caller: str) -> set:
    """What the functions `names` (and those they call) reach, named after the graph op `caller`.
    Every node of a body counts, both branches of a conditional too: a function runs its stateful
    ops whether or not its outputs read them (a stateless ReadFile nothing reads counts as well: on
    the safe side)."""
    found, seen, stack = set(), set(), list(names)
    while stack:
        name = stack.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        body = library[name]
        nodes = {node.name: node for node in body.node_def}
        for node in body.node_def:
            category = _category(node.op, node.attr, _body_constant(node, nodes))
            if category:
                found.add(Reach(f"{node.name} in {caller}", category))
            if node.op in library:
                stack.append(node.op)
            stack.extend(_function_names(node.attr.values()))
    return found


def _called(op: tf.Operation, attrs: list, library: dict) -> list:
    """The functions `op` calls: those its function-typed `attrs` name (PartitionedCall's f, If's
    branches, While's cond and body, a dataset's map function, …), or its type when it is one."""
    names = []
    if attrs:
        node_attrs = op.node_def.attr
        names = _function_names(node_attrs[a] for a in attrs if a in node_attrs)
    return names + ([op.type] if op.type in library else [])


def _function_names(attr_values) -> list:
    names = []
    for value in attr_values:
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def _category(op_type: str, attrs, constant) -> str | None:
    """What an op of `op_type` reaches (None: nothing outside the process). `attrs` (its
    NodeDef's) and `constant(index)` (a constant input's value, else None) decide for the ops that
    reach out only when they say so."""
    if op_type in CATEGORY:
        return CATEGORY[op_type]
    if op_type in PRINT_TYPES:   # stderr by default (an attribute left out of a saved NodeDef)
        stream = attrs["output_stream"].s if "output_stream" in attrs else b""
        return WRITES if stream.startswith(b"file://") else None
    if op_type in CACHE_TYPES:
        return None if constant(1) == b"" else READS_OR_WRITES
    if op_type in DEBUG_TYPES:   # file://… dumps, grpc://… streams
        urls = list(attrs["debug_urls"].list.s) if "debug_urls" in attrs else []
        if any(not url.startswith(b"file://") for url in urls):
            return CONNECTS
        return WRITES if urls else None
    return None


def _graph_constant(op: tf.Operation):
    """constant(index): the value of `op`'s input `index` when a Const makes it, else None."""
    def constant(index):
        if index >= len(op.inputs) or op.inputs[index].op.type != "Const":
            return None
        return tf.make_ndarray(op.inputs[index].op.get_attr("value")).item()
    return constant


def _body_constant(node, nodes: dict):
    """constant(index) for a node of a function body (inputs named `node:output:0`)."""
    def constant(index):
        if index >= len(node.input):
            return None
        source = nodes.get(node.input[index].split(":")[0])
        if source is None or source.op != "Const":
            return None
        return tf.make_ndarray(source.attr["value"].tensor).item()
    return constant
