"""Finding batch-norm layers in a graph, by op type and edges, never by user-chosen names.

One module per form of batch norm; each offers `candidates(graph) -> list[Candidate]`, and
`candidates()` below asks every form in turn. Adding a form is one module and one line in FORMS.

    module      form                                           Candidate.kind
    fused       FusedBatchNorm / V2 / V3 in training mode      "fused"
    moments     the subgraph tf.nn.moments builds              "moments"
    conditional an If whose branches train / infer one fused   "conditional"
                batch norm (a tensor `training` flag, v2)

Helpers every form may use:

    candidate   the Candidate record the forms return
    gradients   gradient calls found by the scopes tf.gradients names after a forward op
    hidden      function bodies (If, While, calls) that hide a training batch norm
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.match import conditional, fused, moments
from graphsync.match.candidate import Candidate
from graphsync.match.fused import (FUSED_TYPES, GRAPHSYNC_GRADIENTS, fused_gradient_ops, is_live,
                                   is_training, made_by_graphsync)
from graphsync.match.gradients import SHAPE_TYPES, gradient_entry, gradient_scopes
from graphsync.match.hidden import FUNCTION_CALL_TYPES, called_functions, functions_with_training_batch_norm

FORMS = (fused, moments, conditional)

__all__ = ["Candidate", "FORMS", "FUNCTION_CALL_TYPES", "FUSED_TYPES", "GRAPHSYNC_GRADIENTS", "SHAPE_TYPES",
           "called_functions", "candidates", "functions_with_training_batch_norm", "fused_gradient_ops",
           "gradient_entry", "gradient_scopes", "is_live", "is_training", "made_by_graphsync"]


def candidates(graph: tf.Graph) -> list[Candidate]:
    """Every batch-norm candidate of every form, in the order of FORMS."""
    return [cand for form in FORMS for cand in form.candidates(graph)]
