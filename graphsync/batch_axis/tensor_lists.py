"""Lists of tensors: TensorList (a variant tensor, control flow v2) and TensorArray (control flow
v1, whose flow tensor stands for the list; its handle carries nothing). A list is given the batch
axes of its elements: unstacking a [T, n, …] tensor over time gives a list whose elements carry the
batch on axis 0, and stacking it back puts the batch on axis 1 again. A list over the examples
themselves (the batch on the unstacked axis 0) ends the trace."""
from __future__ import annotations

from graphsync.batch_axis.registry import End, register


def _same(op, *found):
    """The one set of batch axes among `found` (None when none carries the batch)."""
    values = {a for a in found if a}
    if len(values) > 1:
        raise End(f"{op.type} combines a list and elements carrying the batch on different axes")
    return values.pop() if values else None


def _none_of(op, ins, indices):
    """Ends the trace if an index, a size or a handle carries the batch."""
    if any(ins[i] for i in indices if i < len(ins)):
        raise End(f"{op.type} reads the batch on an index, a size or a handle")


def _unstacked(op, axes):
    """The element axes of a list unstacked from a tensor along its axis 0."""
    if not axes:
        return None
    if 0 in axes:
        raise End(f"{op.type} makes a list over the examples (the batch on the axis it unstacks)")
    return frozenset(a - 1 for a in axes)


def _stacked(axes):
    return frozenset(a + 1 for a in axes) if axes else None


def _list_rule(element, lst=None, indices=(), out="list", split=False):
    """A rule for a list op: `element` the input index of a tensor of elements (or of a tensor to
    unstack, for "from"), `lst` that of the list, `indices` inputs that must not carry the batch;
    `out` what the first output is: "list", "element" (the list's axes), "stacked" (axis 1 and on),
    "concat" (the elements concatenated along their axis 0: the batch stays where it was)."""
    def rule(op, ins, context):
        _none_of(op, ins, indices)
        listed = ins[lst] if lst is not None else None
        if element is not None and out == "from":
            value = ins[element]
            if split and value and 0 in value:
                raise End(f"{op.type} splits a list over the examples")
            axes = _same(op, listed, value if split else _unstacked(op, value))
        elif element is not None:
            axes = _same(op, listed, ins[element])
        else:
            axes = listed
        first = _stacked(axes) if out == "stacked" else axes
        return [first] + [axes if out == "element" else None] * (len(op.outputs) - 1), None
    return rule


def _no_batch(op, ins, context):
    """A list's length, element shape or size; closing an array."""
    return [None] * len(op.outputs), None


_RULES = {
    # control flow v2: TensorList (a list tensor: the axes of its elements)
    "TensorListFromTensor": _list_rule(0, out="from", indices=(1,)),
    "TensorListScatter": _list_rule(0, out="from", indices=(1, 2)),
    "TensorListScatterV2": _list_rule(0, out="from", indices=(1, 2, 3)),
    "TensorListScatterIntoExistingList": _list_rule(1, 0, out="from", indices=(2,)),
    "TensorListSplit": _list_rule(0, out="from", indices=(1, 2), split=True),
    "TensorListGetItem": _list_rule(None, 0, indices=(1, 2), out="element"),
    "TensorListSetItem": _list_rule(2, 0, indices=(1,)),
    "TensorListPushBack": _list_rule(1, 0),
    "TensorListPopBack": _list_rule(None, 0, indices=(1,), out="element"),
    "TensorListStack": _list_rule(None, 0, indices=(1,), out="stacked"),
    "TensorListGather": _list_rule(None, 0, indices=(1, 2), out="stacked"),
    "TensorListConcat": _list_rule(None, 0, out="concat"),
    "TensorListConcatV2": _list_rule(None, 0, indices=(1, 2), out="concat"),
    "TensorListResize": _list_rule(None, 0, indices=(1,)),
    "TensorListReserve": _list_rule(None, indices=(0, 1)),
    "EmptyTensorList": _list_rule(None, indices=(0, 1)),
    "TensorListLength": _no_batch,
    "TensorListElementShape": _no_batch,
    # control flow v1: TensorArrayV3 (the flow tensor: the axes of the elements; the handle: none)
    "TensorArrayV3": _list_rule(None, indices=(0,)),
    "TensorArrayScatterV3": _list_rule(2, 3, out="from", indices=(0, 1)),
    "TensorArraySplitV3": _list_rule(1, 3, out="from", indices=(0, 2), split=True),
    "TensorArrayWriteV3": _list_rule(2, 3, indices=(0, 1)),
    "TensorArrayReadV3": _list_rule(None, 2, indices=(0, 1), out="element"),
    "TensorArrayGatherV3": _list_rule(None, 2, indices=(0, 1), out="stacked"),
    "TensorArrayConcatV3": _list_rule(None, 1, indices=(0,), out="concat"),
    "TensorArraySizeV3": _no_batch,
    "TensorArrayCloseV3": _no_batch,
}
for _op_type, _rule in _RULES.items():
    register("tensor lists", _op_type)(_rule)
