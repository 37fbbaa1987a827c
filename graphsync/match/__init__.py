"""Finding batch-norm layers in a graph, by op type and edges, never by user-chosen names.

One module per form of batch norm; each offers `candidates(graph) -> list[Candidate]`, and
`candidates()` below asks every form in turn. Adding a form is one module and one line in FORMS.

    module       form                                                       Candidate.form (LayerForm)
    fused        FusedBatchNorm / V2 / V3 in training mode                  FUSED
    moments      the subgraph tf.nn.moments builds                          MOMENTS
    handwritten  mean and variance by hand: E[(x − m)²] or E[x²] − m²,      MOMENTS
                 Mean or Sum / count; sufficient_statistics without shift
    sufficient   sufficient_statistics + normalize_moments with a shift     MOMENTS
    weighted     tf.nn.weighted_moments, weights per example or pixel      MOMENTS
                 (per channel, or zeros_like folded: the rule's reductions)
    conditional  an If whose branches train / infer one fused batch norm    CONDITIONAL
                 (a tensor `training` flag under control flow v2)

Every MOMENTS candidate hands the splice parts x, variance (op), axes and keep_dims (and
weights, for weighted moments); the forms differ only in how they are found.

Helpers every form may use:

    candidate   the Candidate record the forms return
    layer_form  LayerForm: the four forms of a synchronized layer, and what each decides downstream
    gradients   gradient calls found by the scopes tf.gradients names after a forward op
    hidden      function bodies (If, While, calls) that hide a training batch norm
    reductions  a mean in any spelling; whether statistics are batch statistics that normalize x
    counts      whether a divisor is the number of elements a Sum reduces
    ghost       ghost batch norm (virtual_batch_size): sub-batch statistics, always left alone
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.match import conditional, fused, handwritten, hidden, moments, sufficient, weighted
from graphsync.match.candidate import Candidate, PerTower
from graphsync.match.layer_form import LayerForm
from graphsync.match.fused import (FUSED_TYPES, GRAPHSYNC_GRADIENTS, fused_gradient_ops, is_live,
                                   is_training, made_by_graphsync)
from graphsync.match.gradients import (SHAPE_TYPES, entry_readers, gradient_entry, gradient_scopes,
                                       passed_through_entry)
from graphsync.match.hidden import (FUNCTION_CALL_TYPES, called_functions, functions_with_batch_moments,
                                    functions_with_batch_norm_gradient, functions_with_training_batch_norm)

FORMS = (fused, moments, handwritten, sufficient, weighted, conditional)

__all__ = ["Candidate", "LayerForm", "PerTower", "FORMS", "FUNCTION_CALL_TYPES", "FUSED_TYPES", "GRAPHSYNC_GRADIENTS", "SHAPE_TYPES",
           "called_functions", "candidates", "entry_readers", "functions_with_batch_moments",
           "functions_with_batch_norm_gradient",
           "functions_with_training_batch_norm",
           "fused_gradient_ops", "gradient_entry", "gradient_scopes", "is_live", "is_training",
           "made_by_graphsync", "passed_through_entry", "starting_types"]


def starting_types() -> frozenset | None:
    """Every op type a form's match starts from (each module's STARTS, and the calls `hidden` looks
    into): ops added to a graph that include none of these add no batch norm, so `graphsync run`
    need not look at the graph again. None when a form does not say (no STARTS): any op may."""
    modules = FORMS + (hidden,)
    if not all(hasattr(module, "STARTS") for module in modules):
        return None
    return frozenset(t for module in modules for t in module.STARTS)


def candidates(graph: tf.Graph) -> list[Candidate]:
    """Every batch-norm candidate of every form, in the order of FORMS."""
    return [cand for form in FORMS for cand in form.candidates(graph)]
