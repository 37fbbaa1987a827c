"""The protos to write after a rewrite: the ones that were read, with the graph's edits applied.

Rather than re-exporting the live graph (which would re-derive collections, fill in stripped default
attributes and let TensorFlow rewrite device strings), the output starts from the message that was
read. Nodes that were there before keep every field; only inputs the rewrite moved change. New nodes
are appended; functions the graph gained are added to the library; `versions`, collections, saver,
signatures, assets and object graph are copied unchanged. The stripped op list of a MetaGraphDef
gains the op types the new nodes use, so loaders can still strip unknown default attributes.
"""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, op_def_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from graphsync.errors import GraphsyncError


def merged_graph_def(original: graph_pb2.GraphDef, graph: tf.Graph) -> graph_pb2.GraphDef:
    """`original` with the edits made to `graph` (which was imported from it)."""
    current = graph.as_graph_def()
    remaining = {node.name: node for node in current.node}
    defaults = _DefaultAttrs(graph)
    merged = graph_pb2.GraphDef()
    merged.versions.CopyFrom(original.versions if original.HasField("versions") else current.versions)
    if original.version:
        merged.version = original.version
    merged.library.CopyFrom(original.library)
    _add_new_functions(merged.library, current.library)
    for node in original.node:
        edited = remaining.pop(node.name, None)
        if edited is None:
            raise GraphsyncError(f"internal: node {node.name} disappeared from the graph during the rewrite")
        out = merged.node.add()
        if _same_but_inputs(node, edited, defaults):
            out.CopyFrom(node)
            if list(edited.input) != list(node.input):
                out.input[:] = edited.input
        else:
            out.CopyFrom(edited)
            out.device = node.device
    for node in current.node:
        if node.name in remaining:
            merged.node.add().CopyFrom(node)
    if not merged.HasField("library") or not (merged.library.function or merged.library.gradient
                                                or merged.library.registered_gradients):
        merged.ClearField("library")
    return merged


def merged_meta_graph(original: meta_graph_pb2.MetaGraphDef, graph: tf.Graph) -> meta_graph_pb2.MetaGraphDef:
    merged = meta_graph_pb2.MetaGraphDef()
    merged.CopyFrom(original)
    merged.graph_def.CopyFrom(merged_graph_def(original.graph_def, graph))
    if original.meta_info_def.HasField("stripped_op_list"):
        merged.meta_info_def.stripped_op_list.CopyFrom(
            stripped_op_list(merged.graph_def, graph, original.meta_info_def.stripped_op_list))
    return merged


def new_meta_graph(graph_def: graph_pb2.GraphDef, graph: tf.Graph) -> meta_graph_pb2.MetaGraphDef:
    """A MetaGraphDef around a GraphDef that came without one (no collections, no saver)."""
    meta = meta_graph_pb2.MetaGraphDef()
    meta.meta_info_def.tensorflow_version = tf.version.VERSION
    meta.meta_info_def.tensorflow_git_version = tf.version.GIT_VERSION
    meta.meta_info_def.stripped_op_list.CopyFrom(stripped_op_list(graph_def, graph))
    meta.graph_def.CopyFrom(graph_def)
    return meta


def stripped_op_list(graph_def: graph_pb2.GraphDef, graph: tf.Graph, known=None) -> op_def_pb2.OpList:
    """`known` (the producer's op list) plus the OpDef, without documentation, of every other op
    type the graph uses, sorted by name as TensorFlow writes it."""
    known = known or op_def_pb2.OpList()
    have = {op_def.name for op_def in known.op}
    functions = {f.signature.name for f in graph_def.library.function}
    used = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        used |= {node.op for node in function.node_def}
    missing = used - have - functions
    examples = {}
    for op in graph.get_operations():
        if op.type in missing:
            examples.setdefault(op.type, op)
    result = op_def_pb2.OpList()
    result.op.extend(known.op)
    for name in sorted(missing):
        if name in examples:
            result.op.append(_without_docs(examples[name].op_def))
    result.op.sort(key=lambda op_def: op_def.name)
    return result


def _without_docs(op_def: op_def_pb2.OpDef) -> op_def_pb2.OpDef:
    stripped = op_def_pb2.OpDef()
    stripped.CopyFrom(op_def)
    stripped.ClearField("summary")
    stripped.ClearField("description")
    for arg in list(stripped.input_arg) + list(stripped.output_arg):
        arg.ClearField("description")
    for attr in stripped.attr:
        attr.ClearField("description")
    return stripped


def _add_new_functions(library, current_library) -> None:
    have = {f.signature.name for f in library.function}
    library.function.extend(f for f in current_library.function if f.signature.name not in have)
    have_gradients = {g.function_name for g in library.gradient}
    library.gradient.extend(g for g in current_library.gradient if g.function_name not in have_gradients)


class _DefaultAttrs:
    """Default attribute values per op type, from the OpDefs of the graph's ops."""

    def __init__(self, graph: tf.Graph):
        self._graph = graph
        self._by_type = {}

    def default(self, node, attr: str):
        if node.op not in self._by_type:
            try:
                op_def = self._graph.get_operation_by_name(node.name).op_def
                self._by_type[node.op] = {a.name: a.default_value for a in op_def.attr
                                          if a.HasField("default_value")}
            except (KeyError, ValueError):
                self._by_type[node.op] = {}
        return self._by_type[node.op].get(attr)


def _same_but_inputs(node, edited, defaults: _DefaultAttrs) -> bool:
    """Whether `edited` equals `node` apart from its inputs, its device (TensorFlow fills in the
    device of colocated ops on import), the shapes export_meta_graph records (`_output_shapes`,
    which the rewrite leaves valid) and default-valued attributes `node` left out."""
    if node.op != edited.op or set(node.attr) - set(edited.attr) - {"_output_shapes"}:
        return False
    for key, value in edited.attr.items():
        if key in node.attr:
            if node.attr[key] != value:
                return False
        elif defaults.default(node, key) != value:
            return False
    return True
