"""Every op of an exchange marked with its layer and direction as it is made.

verify counts each layer's bytes across devices and finds the layers graphsync synchronized and
their statistics (graphsync/verification/); it reads these marks (graph/marks.py: `exchanged`),
never the ops' names, which stay what TensorBoard shows (`<op>_sync/forward/…`,
`graphsync/<layer>/backward_statistics/…`). A view's gradient, built by tf.gradients long after
the rewrite, finds its layer and the scope its sum goes under in the view's own marks
(`gradient_sum`, `gradient_scope`: `Mark.GRADIENT_SCOPE`).
"""
from __future__ import annotations

import contextlib

from graphsync.graph import marks
from graphsync.graph.marks import Direction, Mark
from graphsync.graph.tf_private import marked


def exchange(graph, layer: str, tag: str, aggregation: bool = False):
    """The ops made inside carry `layer` (LayerPlan.name) and the direction of the exchange the
    splice tags `tag` ("forward", "backward_0", …); `aggregation`: the ops of a sync group's merge
    on its aggregation device (strategy gather)."""
    direction = Direction.of_tag(tag)
    if direction is None:
        return contextlib.nullcontext()
    attrs = {Mark.LAYER.value: marks.value(layer), Mark.DIRECTION.value: marks.value(direction.value)}
    if aggregation:
        attrs[Mark.AGGREGATION.value] = marks.value(True)
    return marked(graph, attrs)


def gradient_sum(view, aggregation: bool = False):
    """The ops of the sum of view `view`'s gradients across towers: its layer's backward exchange."""
    return exchange(view.graph, marks.text(view, Mark.LAYER), Direction.BACKWARD.value, aggregation)


def gradient_scope(view) -> str:
    """The name scope the transport chose for the sum of view `view`'s gradients."""
    return marks.text(view, Mark.GRADIENT_SCOPE)
