"""Graph files: load one into a live tf.Graph, save it back in the same format (or the one the
output's name asks for), and the checks of input and output paths before anything is read.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import warnings

import tensorflow as tf
from google.protobuf import text_format

from graphsync.io import atomic, detect, merge
from graphsync.io.detect import GRAPHDEF, METAGRAPH, SAVEDMODEL
from graphsync.io.errors import GraphFileError, PathError

FORMATS = ("graphdef", "graphdef-text", "metagraph", "metagraph-text", "savedmodel")
SAVEDMODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_STALE_IN_SAVEDMODEL = SAVEDMODEL_FILES + ("fingerprint.pb",)  # the fingerprint hashes saved_model.pb

@dataclasses.dataclass
class LoadedGraph:
    """A live graph and the message it was imported from (needed to save it back)."""

    graph: tf.Graph
    path: str
    kind: detect.FileKind     # GraphDef, MetaGraphDef or SavedModel
    text: bool                # read from a text proto
    message: object           # the GraphDef, MetaGraphDef or SavedModel as read
    meta_graph_index: int | None = None   # SavedModel: which meta graph `graph` is

    @property
    def format(self) -> str:
        if self.kind is SAVEDMODEL:
            return "savedmodel"
        return ("graphdef" if self.kind is GRAPHDEF else "metagraph") + ("-text" if self.text else "")

    @property
    def meta_graph(self):
        """The MetaGraphDef the graph came from (None for a GraphDef)."""
        if self.kind is SAVEDMODEL:
            return self.message.meta_graphs[self.meta_graph_index]
        return self.message if self.kind is METAGRAPH else None

    @property
    def graph_def(self):
        """The GraphDef as read."""
        return self.message if self.kind is GRAPHDEF else self.meta_graph.graph_def

    @property
    def tags(self) -> tuple[str, ...]:
        meta = self.meta_graph
        return tuple(meta.meta_info_def.tags) if meta is not None else ()

    @property
    def description(self) -> str:
        what = f"text {self.kind}" if self.text else self.kind
        if self.kind is SAVEDMODEL:
            what += f" (tags {', '.join(self.tags) or 'none'})"
        return what


def load(path: str, tags=None) -> LoadedGraph:
    """Reads a GraphDef, MetaGraphDef or SavedModel directory into a new tf.Graph.

    tags: for a SavedModel, the tag set of the meta graph to load (a list, or a comma-separated
          string); needed only when it holds several meta graphs.
    """
    path = os.fspath(path)
    _require_input(path)
    if os.path.isdir(path):
        return _load_savedmodel(path, _tag_set(tags))
    if tags:
        raise PathError(f"tags apply only to SavedModel directories, and {path} is a file")
    data = _read(path)
    kind, message, text = detect.parse(data, path, detect.hint_from_name(path))
    if kind is SAVEDMODEL:
        raise PathError(f"{path} belongs to a SavedModel: pass its directory {os.path.dirname(path) or '.'}")
    meta = message if kind is METAGRAPH else None
    graph = _import(message if kind is GRAPHDEF else message.graph_def, meta, path, kind)
    return LoadedGraph(graph, path, kind, text, message)


def save(loaded: LoadedGraph, path: str, fmt: str | None = None) -> str:
    """Writes `loaded.graph` (as edited since `load`) to `path` atomically; returns the format
    written: `fmt` if given, else the one the name implies, else the input's (see `output_format`)."""
    path = os.fspath(path)
    fmt = output_format(loaded, path, fmt)
    check_paths(loaded.path, path)
    if fmt == "savedmodel":
        _save_savedmodel(loaded, path)
        return fmt
    if os.path.isdir(path):
        raise PathError(f"{path} is a directory: name the output file")
    if fmt.startswith("graphdef"):
        message = merge.merged_graph_def(loaded.graph_def, loaded.graph)
    elif loaded.meta_graph is not None:
        message = merge.merged_meta_graph(loaded.meta_graph, loaded.graph)
    else:
        message = merge.new_meta_graph(merge.merged_graph_def(loaded.graph_def, loaded.graph), loaded.graph)
    atomic.write_file(path, _serialize(message, fmt.endswith("-text"), path))
    return fmt


def output_format(loaded: LoadedGraph, path: str, fmt: str | None = None) -> str:
    """The format to write: `fmt`; else what the output name says (`.meta`, `.meta.txt` → MetaGraphDef;
    `.pb` / `.pbtxt` → binary / text of the input's kind); else the input's format."""
    if fmt:
        if fmt not in FORMATS:
            raise PathError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
        if fmt == "savedmodel" and loaded.kind is not SAVEDMODEL:
            raise PathError(f"cannot write a SavedModel from a {loaded.kind}: there are no variables to "
                            "put in it; write a .meta or .pb instead")
        return fmt
    name = os.path.basename(os.path.normpath(path)).lower()
    kind = "graphdef" if loaded.kind is GRAPHDEF else "metagraph"
    if name.endswith(".meta"):
        return "metagraph"
    if name.endswith((".meta.txt", ".meta.pbtxt", ".metatxt")):
        return "metagraph-text"
    if name.endswith((".pbtxt", ".txt", ".prototxt")):
        return kind + "-text"
    if name.endswith(".pb"):
        return kind
    return loaded.format


def check_paths(input_path: str, output_path: str) -> None:
    """Raises PathError when `output_path` cannot be written or would overwrite the input."""
    parent = os.path.dirname(os.path.abspath(output_path))
    if not os.path.isdir(parent):
        raise PathError(f"cannot write {output_path}: directory {parent} does not exist")
    if os.path.realpath(input_path) == os.path.realpath(output_path) or (
            os.path.exists(output_path) and os.path.exists(input_path)
            and os.path.samefile(input_path, output_path)):
        raise PathError(f"the output {output_path} is the input: write the rewritten graph to a new path")
    if os.path.isdir(input_path):
        inside = os.path.realpath(output_path).startswith(os.path.realpath(input_path) + os.sep)
        if inside and os.path.basename(output_path) in _STALE_IN_SAVEDMODEL:
            raise PathError(f"the output {output_path} is part of the input SavedModel: write to a new path")


def _require_input(path: str) -> None:
    if os.path.lexists(path) and not os.path.exists(path):
        raise PathError(f"{path} is a broken symbolic link")
    if os.path.exists(path):
        if not (os.path.isfile(path) or os.path.isdir(path)):
            raise GraphFileError(f"{path} is not a regular file or directory")
        return
    if os.path.exists(path + ".index"):
        hint = f" ({path}.meta)" if os.path.exists(path + ".meta") else ""
        raise PathError(f"{path} is a checkpoint prefix, not a graph: pass the .meta file written next to it{hint}")
    raise PathError(f"{path}: no such file or directory")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise GraphFileError(f"cannot read {path}: {exc.strerror or exc}") from None


def _tag_set(tags) -> frozenset | None:
    if tags is None:
        return None
    if isinstance(tags, str):
        tags = tags.split(",")
    tags = frozenset(t.strip() for t in tags if t.strip())
    return tags or None


def _format_tags(tags) -> str:
    return "{" + ",".join(sorted(tags)) + "}"


def _load_savedmodel(directory: str, tags: frozenset | None) -> LoadedGraph:
    files = [name for name in SAVEDMODEL_FILES if os.path.isfile(os.path.join(directory, name))]
    if not files:
        entries = os.listdir(directory)
        if "checkpoint" in entries or any(e.endswith(".index") for e in entries):
            metas = sorted(e for e in entries if e.endswith(".meta"))
            hint = f" such as {os.path.join(directory, metas[-1])}" if metas else ""
            raise GraphFileError(f"{directory} is a checkpoint directory, not a SavedModel: pass a .meta "
                                 f"file{hint}")
        raise GraphFileError(f"{directory} is a directory but not a SavedModel (no saved_model.pb)")
    path = os.path.join(directory, files[0])
    kind, saved_model, _ = detect.parse(_read(path), path, SAVEDMODEL)
    if kind is not SAVEDMODEL:
        raise GraphFileError(f"{path} holds a {kind}, not a SavedModel")
    available = [frozenset(meta.meta_info_def.tags) for meta in saved_model.meta_graphs]
    listed = ", ".join(_format_tags(t) for t in available)
    if tags is None:
        if len(available) > 1:
            raise PathError(f"{directory} holds {len(available)} meta graphs ({listed}): choose one with --tags")
        index = 0
    elif tags in available:
        index = available.index(tags)
    else:
        raise PathError(f"{directory} has no meta graph tagged {_format_tags(tags)}; it has {listed}")
    meta = saved_model.meta_graphs[index]
    graph = _import(meta.graph_def, meta, directory, SAVEDMODEL)
    return LoadedGraph(graph, directory, SAVEDMODEL, files[0].endswith(".pbtxt"), saved_model, index)


def _import(graph_def, meta, path: str, kind: str) -> tf.Graph:
    producer_op_list = None
    if meta is not None and meta.meta_info_def.HasField("stripped_op_list"):
        producer_op_list = meta.meta_info_def.stripped_op_list
    graph = tf.Graph()
    try:
        with graph.as_default(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tf.compat.v1.import_graph_def(graph_def, name="", producer_op_list=producer_op_list)
    except Exception as exc:  # noqa: BLE001 - TensorFlow raises many types for a malformed graph
        raise GraphFileError(f"{path}: the {kind} does not import into TensorFlow: {detect.one_line(exc)}") from None
    return graph


def _serialize(message, text: bool, path: str) -> bytes:
    try:
        if text:
            return text_format.MessageToString(message).encode("utf-8")
        return message.SerializeToString(deterministic=True)
    except Exception as exc:  # noqa: BLE001 - protobuf EncodeError, messages over 2 GB
        raise GraphFileError(f"cannot write {path}: {detect.one_line(exc)}") from None


def _save_savedmodel(loaded: LoadedGraph, path: str) -> None:
    if loaded.kind is not SAVEDMODEL:
        raise PathError(f"cannot write a SavedModel from a {loaded.kind}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise PathError(f"{path} exists and is not a directory: a SavedModel is written as a directory")
    saved_model = type(loaded.message)()
    saved_model.CopyFrom(loaded.message)
    index = loaded.meta_graph_index
    saved_model.meta_graphs[index].CopyFrom(merge.merged_meta_graph(loaded.meta_graph, loaded.graph))
    name = "saved_model.pbtxt" if loaded.text else "saved_model.pb"
    data = _serialize(saved_model, loaded.text, path)
    with atomic.staged_directory(path) as staging:
        try:
            shutil.copytree(loaded.path, staging, dirs_exist_ok=True,
                            ignore=lambda d, names: [n for n in names if n in _STALE_IN_SAVEDMODEL]
                            if os.path.samefile(d, loaded.path) else [])
        except (OSError, shutil.Error) as exc:
            raise GraphFileError(f"cannot copy {loaded.path} to {path}: {detect.one_line(exc)}") from None
        with open(os.path.join(staging, name), "wb") as f:
            f.write(data)
