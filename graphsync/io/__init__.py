"""Saved graphs: load one into a live tf.Graph, rewrite it, save it back in the same format.

    from graphsync import io
    loaded = io.load("train.meta")              # GraphDef, MetaGraphDef or SavedModel directory
    report = graphsync.rewrite_towers(loaded.graph)
    io.save(loaded, "train_sync.meta")          # same format unless the name says otherwise

Formats, recognized by content: binary or text GraphDef (`.pb`, `.pbtxt`), binary or text
MetaGraphDef (`.meta`, `.meta.txt`), SavedModel directories (`saved_model.pb` or `.pbtxt`; `tags`
chooses the meta graph). Saving keeps everything the rewrite did not touch: function library,
versions, collections, saver, signatures, assets, device strings, variable names (so checkpoints
restore both ways). Every problem is a `GraphFileError` (a `GraphsyncError`) with a one-line message;
nothing is written unless the whole output is ready (see `graphsync.io.atomic`).
"""
from graphsync.io.errors import GraphFileError, PathError
from graphsync.io.file_rewrite import require_towers, rewrite_file
from graphsync.io.files import FORMATS, SAVEDMODEL_FILES, LoadedGraph, check_paths, load, output_format, save
from graphsync.io.tensorboard import listed_layers, write_event_file

__all__ = ["FORMATS", "SAVEDMODEL_FILES", "GraphFileError", "LoadedGraph", "PathError", "check_paths", "listed_layers",
           "load", "output_format", "require_towers", "rewrite_file", "save", "write_event_file"]
