"""What carries examples into the graph: the ops upstream of what verify fetches that make data
without reading any (placeholders, input pipelines, random tensors), found by op type alone.

    placeholder   Placeholder (PlaceholderWithDefault keeps its default)
    pipeline      tf.data iterators (IteratorGetNext, MultiDeviceIterator shards, optionals),
                  queues (QueueDequeue, …Many, …UpTo), staging areas (Unstage, StagePeek, map stages)
    random        RandomUniform, RandomStandardNormal, TruncatedNormal, RandomUniformInt and their
                  stateless forms: synthetic inputs — or dropout and noise, told apart in synthetic.py
"""
from __future__ import annotations

import enum

import dataclasses

import tensorflow as tf

from graphsync.graph.executed import executed

PLACEHOLDER_TYPES = ("Placeholder",)
PIPELINE_TYPES = ("IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard",
                  "OptionalGetValue", "QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
                  "QueueDequeueUpTo", "QueueDequeueUpToV2", "Unstage", "StagePeek", "MapUnstage",
                  "MapUnstageNoKey", "OrderedMapUnstage", "OrderedMapUnstageNoKey", "MapPeek", "OrderedMapPeek")
RANDOM_TYPES = ("RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
                "StatelessRandomUniform", "StatelessRandomNormal", "StatelessTruncatedNormal",
                "StatelessRandomUniformInt", "StatelessRandomUniformV2", "StatelessRandomNormalV2",
                "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2")
class SourceKind(enum.StrEnum):
    """What makes a source's examples; its description is how the report names it."""

    PLACEHOLDER = "placeholder"
    PIPELINE = "pipeline"
    RANDOM = "random"


KINDS = {**{t: SourceKind.PLACEHOLDER for t in PLACEHOLDER_TYPES}, **{t: SourceKind.PIPELINE for t in PIPELINE_TYPES},
         **{t: SourceKind.RANDOM for t in RANDOM_TYPES}}
DESCRIBED = {SourceKind.PLACEHOLDER: "a placeholder", SourceKind.PIPELINE: "an input pipeline",
             SourceKind.RANDOM: "a random tensor"}


@dataclasses.dataclass
class Source:
    tensor: tf.Tensor
    kind: SourceKind

    @property
    def what(self) -> str:
        what = {"IteratorGetNext": "a tf.data iterator", "IteratorGetNextSync": "a tf.data iterator",
                "MultiDeviceIteratorGetNextFromShard": "a tf.data iterator"}.get(self.tensor.op.type)
        if what is None and "Queue" in self.tensor.op.type:
            what = "a queue"
        if what is None and ("Unstage" in self.tensor.op.type or "Peek" in self.tensor.op.type):
            what = "a staging area"
        return what or DESCRIBED[self.kind]


def needed(fetches: list, stop: set) -> set:
    """The ops the fetches depend on (data and control edges), not looking past tensors in `stop`
    (those fed anyway)."""
    return executed([t.op for t in fetches], stop)


def find(needed_ops: set) -> list[Source]:
    """Every output of a source op that something needed reads, sorted by name."""
    found = []
    for op in needed_ops:
        kind = KINDS.get(op.type)
        if kind is None:
            continue
        for output in op.outputs:
            if any(c in needed_ops for c in output.consumers()):
                found.append(Source(output, kind))
    return sorted(found, key=lambda s: s.tensor.name)
