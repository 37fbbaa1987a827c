"""What TensorFlow's own step statistics say about one run: which ops executed, and how many
bytes crossed devices for each synchronized layer.

Cross-device edges are the `_Send` nodes of the partition graphs (one per tensor and receiving
device); their sizes come from the step statistics of the ops that produced the tensors. Which
layer an op's bytes belong to, and in which direction, its marks say (graphsync/exchange/marking.py),
not its name.
"""
from __future__ import annotations

import dataclasses
import re

import tensorflow as tf

from graphsync.graph import marks
from graphsync.graph.marks import Mark


@dataclasses.dataclass
class LayerTraffic:
    """Bytes one synchronized layer moves across devices in one step: sent up to its aggregation
    device and back down (strategy "gather"), or all-reduced (each tower's contribution, summed)."""

    layer: str
    forward_up: int = 0
    forward_down: int = 0
    backward_up: int = 0
    backward_down: int = 0
    forward_reduced: int = 0
    backward_reduced: int = 0

    @property
    def forward(self) -> int:
        return self.forward_up + self.forward_down + self.forward_reduced

    @property
    def backward(self) -> int:
        return self.backward_up + self.backward_down + self.backward_reduced

    @property
    def total(self) -> int:
        return self.forward + self.backward

    def add(self, phase: str, direction: str, size: int) -> None:
        name = f"{phase}_{direction}"
        setattr(self, name, getattr(self, name) + size)


@dataclasses.dataclass(frozen=True)
class Exchanged:
    """What the marks of one op of an exchange say (graphsync/graph/marks.py `exchanged`)."""

    layer: str
    direction: str       # "forward" or "backward"
    aggregation: bool    # on a sync group's aggregation device (strategy gather)


def exchanges(graph: tf.Graph) -> dict:
    """Op name → Exchanged, for every op graphsync marked as carrying a layer's statistics or
    their gradients across towers."""
    found = {}
    for op in graph.get_operations():
        exchanged = marks.exchanged(op)
        if exchanged is not None:
            found[op.name] = Exchanged(exchanged[0], exchanged[1].value, marks.has(op, Mark.AGGREGATION))
    return found


def _exchanged(node: str, marked: dict) -> Exchanged | None:
    """The marks of the graph op step statistics name `node` after: the op itself, or the call
    TensorFlow inlined it from (`<call>/<node of the function>`, as the aggregation's merge)."""
    while node not in marked and "/" in node:
        node = node.rpartition("/")[0]
    return marked.get(node)


_INLINED_BRANCH = re.compile(r"/(?:then|else)/_\d+/")


def executed(metadata) -> set:
    """Names of the nodes that ran; a node TensorFlow inlined from an If's branch
    (`<If>/then/_N/<node>`) also as `<If>/<node>`, how batch_norm.batch_norm_ops names it."""
    names = {node.node_name for dev in metadata.step_stats.dev_stats for node in dev.node_stats}
    return names | {_INLINED_BRANCH.sub("/", name) for name in names if "/_" in name}


def _output_bytes(metadata) -> dict:
    """(node, slot) → bytes of that output, from its tensor description."""
    sizes = {}
    for dev in metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            for output in node.output:
                description = output.tensor_description
                try:
                    itemsize = tf.dtypes.as_dtype(description.dtype).size
                except (TypeError, ValueError):
                    continue
                count = 1
                for dim in description.shape.dim:
                    count *= max(dim.size, 0)
                sizes[(node.node_name, output.slot)] = count * itemsize
    return sizes


def _edges(metadata):
    """(source node, slot, names of the nodes reading it on the other device) of every tensor sent
    from one device to another, from the partition graphs' _Send/_Recv pairs."""
    receivers = {}
    for partition in metadata.partition_graphs:
        readers = {}
        for node in partition.node:
            for source in node.input:
                readers.setdefault(source.lstrip("^").partition(":")[0], []).append(node.name)
        for node in partition.node:
            if node.op in ("_Recv", "_HostRecv"):
                receivers[node.attr["tensor_name"].s] = readers.get(node.name, [])
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if node.op not in ("_Send", "_HostSend") or not node.input or node.input[0].startswith("^"):
                continue
            if node.attr["send_device"].s == node.attr["recv_device"].s:
                continue
            name, _, slot = node.input[0].partition(":")
            yield name, int(slot or 0), receivers.get(node.attr["tensor_name"].s, [])


def traffic(metadata, layers: list[str], marked: dict) -> tuple[list[LayerTraffic], int]:
    """Per synchronized layer, the bytes it exchanges each step; and the bytes of every other
    cross-device edge (variables, feeds, gradients, layer outputs). `marked`: `exchanges` of the
    graph that ran."""
    sizes = _output_bytes(metadata)
    per_layer = {layer: LayerTraffic(layer) for layer in layers}
    other = 0

    def aggregated(node: str) -> Exchanged | None:
        found = _exchanged(node, marked)
        return found if found is not None and found.aggregation else None

    for name, slot, readers in _edges(metadata):
        size = sizes.get((name, slot), 0)
        source = aggregated(name)
        target = next((found for found in map(aggregated, readers) if found), None)
        if source and source.layer in per_layer:
            per_layer[source.layer].add(source.direction, "down", size)
        elif target and target.layer in per_layer:
            per_layer[target.layer].add(target.direction, "up", size)
        else:
            other += size
    for dev in metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            if not node.timeline_label.partition(" = ")[2].startswith("CollectiveReduce"):
                continue
            found = _exchanged(node.node_name, marked)
            if found and found.layer in per_layer:
                size = sum(sizes.get((node.node_name, o.slot), 0) for o in node.output)
                per_layer[found.layer].add(found.direction, "reduced", size)
    return list(per_layer.values()), other
