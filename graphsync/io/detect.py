"""Telling what a file holds from its bytes, and parsing it into the matching protocol buffer.

Extensions lie (`.pb` is used for GraphDefs, MetaGraphDefs and SavedModels alike), so the kind is
read from the content: text protos by their first top-level field name, binary protos by the
numbers and wire types of their top-level fields, which differ between the three messages:

    GraphDef      1 node (len)       2 library (len)      3 version (varint)  4 versions (len)
    MetaGraphDef  1 meta_info_def    2 graph_def          3 saver_def … 7 object_graph_def (all len)
    SavedModel    1 schema version (varint)  2 meta_graphs (len)

Files that are clearly something else (images, archives, checkpoints, event files) are named as
such. Every failure is a `GraphFileError` with a one-line message.
"""
from __future__ import annotations

import enum
import os
import re

from google.protobuf import message as protobuf_message
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from graphsync.io.errors import GraphFileError


class FileKind(enum.StrEnum):
    """The message a graph file holds; its value is how messages name it."""

    GRAPHDEF = "GraphDef"
    METAGRAPH = "MetaGraphDef"
    SAVEDMODEL = "SavedModel"


GRAPHDEF, METAGRAPH, SAVEDMODEL = FileKind.GRAPHDEF, FileKind.METAGRAPH, FileKind.SAVEDMODEL
MESSAGES = {GRAPHDEF: graph_pb2.GraphDef, METAGRAPH: meta_graph_pb2.MetaGraphDef,
            SAVEDMODEL: saved_model_pb2.SavedModel}

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_TOP_LEVEL_FIELDS = {
    GRAPHDEF: {(1, _LEN), (2, _LEN), (3, _VARINT), (4, _LEN)},
    METAGRAPH: {(n, _LEN) for n in range(1, 8)},
    SAVEDMODEL: {(1, _VARINT), (2, _LEN)},
}
_TEXT_FIELDS = {
    GRAPHDEF: {"node", "library", "version", "versions"},
    METAGRAPH: {"meta_info_def", "graph_def", "saver_def", "collection_def", "signature_def",
                "asset_file_def", "object_graph_def"},
    SAVEDMODEL: {"saved_model_schema_version", "meta_graphs"},
}
_NODE_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-/>]*$")
_OP_TYPE = re.compile(r"^[A-Za-z0-9_.>]+$")
_TABLE_MAGIC = bytes.fromhex("57fb808b247547db")  # LevelDB table footer of a checkpoint .index
_SIGNATURES = [
    (b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"II*\x00", "a TIFF image"), (b"MM\x00*", "a TIFF image"), (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a zip archive (a .keras file?)"), (b"\x1f\x8b", "a gzip file"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (a Keras .h5 model?)"), (b"\x7fELF", "an executable"),
    (b"BZh", "a bzip2 file"), (b"\xfd7zXZ\x00", "an xz file"),
]
_CHECKPOINT_DATA = re.compile(r"\.data-\d+-of-\d+$")
_FIRST_TEXT_FIELD = re.compile(r"\A(?:\s|#[^\n]*\n)*([A-Za-z_][A-Za-z0-9_]*)")


def parse(data: bytes, path: str, hint: str | None = None):
    """(kind, message, is_text) for the bytes of `path`; `hint` is the kind its extension suggests."""
    if not data:
        raise GraphFileError(f"{path} is empty")
    what = _foreign_kind(data, path)
    if what:
        raise GraphFileError(f"{path} is {what}")
    text = _as_text(data)
    if text is not None:
        return _parse_text(text, path) + (True,)
    return _parse_binary(data, path, hint) + (False,)


def hint_from_name(path: str) -> str | None:
    name = os.path.basename(path).lower()
    if name.startswith("saved_model."):
        return SAVEDMODEL
    if ".meta" in name:
        return METAGRAPH
    if name.endswith((".pb", ".pbtxt", ".graphdef")):
        return GRAPHDEF
    return None


def _foreign_kind(data: bytes, path: str) -> str | None:
    """What the file is instead of a graph, and what to pass instead, when that is clear."""
    checkpoint = "not a graph: pass the .meta file written next to the checkpoint"
    for magic, what in _SIGNATURES:
        if data.startswith(magic):
            return f"{what}, not a TensorFlow graph"
    name = os.path.basename(path)
    if len(data) >= 48 and data.endswith(_TABLE_MAGIC):
        return f"a checkpoint index, {checkpoint}"
    if _CHECKPOINT_DATA.search(name):
        return f"checkpoint data, {checkpoint}"
    if "tfevents" in name:
        return "a TensorBoard event file, not a graph"
    return None


def _as_text(data: bytes) -> str | None:
    """The data as text when it looks like a text proto (no NUL or control bytes, valid UTF-8)."""
    head = data[:4096]
    if b"\x00" in head or any(b < 9 or 13 < b < 32 for b in head):
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _parse_text(text: str, path: str):
    first = _FIRST_TEXT_FIELD.match(text)
    if not first:
        start = text.lstrip()[:1]
        what = "JSON" if start in "{[" and start else "text"
        raise GraphFileError(f"{path} holds {what} that is not a text GraphDef, MetaGraphDef or SavedModel")
    field = first.group(1)
    if field in ("model_checkpoint_path", "all_model_checkpoint_paths"):
        raise GraphFileError(f"{path} is a checkpoint state file, not a graph: pass the .meta file "
                             "written next to the checkpoint")
    kinds = [kind for kind, fields in _TEXT_FIELDS.items() if field in fields]
    if not kinds:
        raise GraphFileError(f"{path} is text starting with {field!r}, not a text GraphDef, MetaGraphDef "
                             "or SavedModel")
    kind = kinds[0]
    message = MESSAGES[kind]()
    try:
        text_format.Parse(text, message, allow_unknown_extension=False)
    except (text_format.ParseError, UnicodeError, ValueError, RecursionError) as exc:
        raise GraphFileError(f"{path}: invalid text {kind}: {one_line(exc)}") from None
    _validate(kind, message, path)
    return kind, message


def _parse_binary(data: bytes, path: str, hint: str | None):
    try:
        fields = _top_level_fields(data)
    except _Truncated as exc:
        if any(exc.fields <= allowed for allowed in _TOP_LEVEL_FIELDS.values()):
            raise GraphFileError(f"{path} is truncated or corrupt: its data ends inside a protobuf field "
                                 "(was the file completely written?)") from None
        raise GraphFileError(f"{path} is not a TensorFlow graph (not a GraphDef, MetaGraphDef or SavedModel)") \
            from None
    except _Malformed:
        raise GraphFileError(f"{path} is not a TensorFlow graph (not a protocol buffer)") from None
    kinds = [kind for kind, allowed in _TOP_LEVEL_FIELDS.items() if fields <= allowed]
    if not kinds:
        raise GraphFileError(f"{path} is not a GraphDef, MetaGraphDef or SavedModel "
                             f"(unexpected top-level protobuf fields {sorted(f for f, _ in fields)})")
    if hint in kinds:
        kinds.remove(hint)
        kinds.insert(0, hint)
    errors = []
    for kind in kinds:
        try:
            message = MESSAGES[kind].FromString(data)
            _validate(kind, message, path)
            return kind, message
        except (protobuf_message.DecodeError, RecursionError, ValueError) as exc:
            errors.append((kind, exc))
        except GraphFileError as exc:
            errors.append((kind, exc))
    kind, exc = errors[0]
    if isinstance(exc, GraphFileError):
        raise exc
    raise GraphFileError(f"{path} is corrupt or truncated: not a valid {kind} ({one_line(exc)})")


def _validate(kind: str, message, path: str) -> None:
    """Checks a parsed message looks like a graph (binary garbage often parses as something)."""
    if kind is SAVEDMODEL:
        if not message.meta_graphs:
            raise GraphFileError(f"{path}: the SavedModel holds no meta graph")
        for meta in message.meta_graphs:
            _validate_graph_def(meta.graph_def, path, "SavedModel")
    elif kind is METAGRAPH:
        _validate_graph_def(message.graph_def, path, kind)
    else:
        _validate_graph_def(message, path, kind)


def _validate_graph_def(graph_def, path: str, kind: str) -> None:
    if not graph_def.node:
        raise GraphFileError(f"{path}: the {kind} holds no graph (no nodes)")
    for node in graph_def.node:
        if not _NODE_NAME.match(node.name) or not _OP_TYPE.match(node.op):
            raise GraphFileError(f"{path} is corrupt: not a valid {kind} (bad node name or op type "
                                 f"{_short(node.name)!r}/{_short(node.op)!r})")


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return _short(text, 200) or type(exc).__name__


class _Truncated(Exception):
    def __init__(self, fields=frozenset()):
        super().__init__()
        self.fields = fields


class _Malformed(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(10):
        if pos >= len(data):
            raise _Truncated
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise _Malformed


def _top_level_fields(data: bytes) -> set[tuple[int, int]]:
    """The (field number, wire type) pairs at the top level; raises _Truncated (with the fields
    seen, the cut one included) if a field runs past the end, _Malformed if the bytes are not
    protobuf wire format."""
    pos, end, seen = 0, len(data), set()
    while pos < end:
        try:
            key, pos = _varint(data, pos)
        except _Truncated:
            raise _Truncated(frozenset(seen | {(0, 0)})) from None
        field, wire = key >> 3, key & 7
        if field == 0 or wire not in (_VARINT, _FIXED64, _LEN, _FIXED32):
            raise _Malformed
        seen.add((field, wire))
        try:
            if wire == _VARINT:
                _, pos = _varint(data, pos)
            elif wire == _FIXED64:
                pos += 8
            elif wire == _LEN:
                length, pos = _varint(data, pos)
                pos += length
            else:
                pos += 4
        except _Truncated:
            pos = end + 1
        if pos > end:
            raise _Truncated(frozenset(seen))
    return seen
