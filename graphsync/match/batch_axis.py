"""The batch axis, traced; the ops that combine examples found by rule, whatever their spelling.

The rule SPMD partitioners (GSPMD, DTensor) apply to a batch-sharded program: any computation that
combines different examples of the batch must combine all of them. `analyze(graph)` follows the
axes that hold the examples from the data sources (placeholders, iterators, queues: their axis 0)
through the forward pass, op by op, with a small table of rules in the spirit of GSPMD's sharding
propagation (RULES: how each op type carries the batch axes of its inputs to its outputs). An op
type the table does not know ends the trace there, and is listed (`Analysis.ended`), never
silently passed through. Gradient ops (tf.gradients' scopes) are not the forward and are not traced.

A cross-example op (CrossOp) is one that combines examples: it reduces over an axis carrying the
batch (Sum, Mean, Max, Min, Prod, …, any keep_dims), contracts over it (MatMul, BatchMatMul,
Einsum), does so in a kernel (training-mode FusedBatchNorm*), or orders or selects among examples
(TopKV2, ArgMax, Cumsum over the batch). Its verdict (`verdict`):

    statistic  its value flows back into tensors that still carry the batch and on into the model
               (an op reading a variable): a batch statistic, to synchronize across towers
    terminal   its value only reaches losses, metrics, summaries, variable updates: stays per tower
    ghost      it reduces only part of the batch axes (a reshape split the batch: virtual batches)
    order      a sort, top-k or arg-max over the batch whose value flows back: cannot be synchronized

A reshape that splits the batch into several axes carries it on all of them; a reduction over
some of those is partial (ghost batch norm), over all of them full.

Function bodies are a tower's forward too: a tf.function call (PartitionedCall,
StatefulPartitionedCall) or a control flow v2 If has its bodies traced (`Analysis.bodies`), seeded
with the batch axes of the op's inputs, once per (function, input axes); the bodies' outputs carry
their axes to the op's, so gelu or swish in a call (tf_keras' ConvNeXt, RegNet) no longer end the
trace, and a body that ends its own trace ends it at the op, with the reason. A body holding a
statistic — a cross-example op read back into the examples there, or for a call returned — makes
the op a cross-example op itself (how "body", `CrossOp.inner` naming the op inside): graphsync
inlines such a call and synchronizes what it held (graphsync/plan/planner.py), and refuses such
an If unless it is a conditional batch norm it synchronizes (graphsync/plan/rule.py).

Loops are a tower's forward too (an RNN: tf.scan, tf_keras' SimpleRNN and LSTM). A control flow v2
`While` has its body traced like a call's, seeded with the loop inputs' axes, and again until every
loop variable's axes settle (a state built from zeros, or an output list, takes the batch in the
body); a body that moves a loop variable's batch to other axes ends the trace. Its cond only decides
when the loop stops and is not traced. A list of tensors carries the axes of its elements: a
TensorList (variant tensor) under v2, a TensorArray's flow tensor under v1 (its handle carries
nothing); unstacking [T, n, …] over time gives elements with the batch on axis 0, stacking them
back puts it on axis 1; a list over the examples themselves ends the trace. Under control flow v1
the loop's ops are in the graph: Enter, Exit and NextIteration pass their value on, and the Merge
joining a loop's entry and its NextIteration (the back edge) is met with the entry's axes first
and again when the body reaches the NextIteration, where a body that moved the batch ends the
trace. A statistic inside the recurrence (recurrent batch norm: a cross-example op read back into
the examples in the body) cannot be synchronized per step and is refused in one line: under v2 the
`While` is a cross-example op "body" naming the op in its body; under v1 the op itself, inside
the loop's frame, which graphsync/plan/reductions.py does not synchronize. A reduction whose value
only leaves the loop (a metric, the loop's termination) gets the verdict of where those outputs go.
"""
from __future__ import annotations

import dataclasses
import os
import re
import weakref

import numpy as np
import tensorflow as tf

from graphsync.graph import by_type, shapes, tf_private
from graphsync.graph.backward import is_backward
from graphsync.match.fused import LOCAL_MOMENTS_GRADIENT, gradient_type
from graphsync.match.hidden import is_inlined

SOURCES = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext", "IteratorGetNextSync",
                     "QueueDequeueMany", "QueueDequeueManyV2", "QueueDequeueUpTo", "QueueDequeueUpToV2",
                     "ParseExample", "ParseExampleV2", "DecodeCSV"})

_UNARY_BINARY = frozenset("""
Abs Acos Acosh Add AddV2 AddN Asin Asinh Atan Atan2 Atanh BiasAdd Cast Ceil CheckNumerics ClipByValue Cos
Cosh DebugIdentity Digamma Div DivNoNan Elu EnsureShape Equal Erf Erfc Exp Expm1 Floor FloorDiv FloorMod
Greater GreaterEqual Identity Inv IsFinite IsInf IsNan LeakyRelu Less LessEqual Lgamma Log Log1p
LogicalAnd LogicalNot LogicalOr Maximum Minimum Mod Mul MulNoNan Neg NotEqual OnesLike Pow
PreventGradient RealDiv Reciprocal Relu Relu6 Rint Round Rsqrt Select SelectV2 Selu Sigmoid Sign Sin
Sinh Snapshot Softplus Softsign Sqrt Square SquaredDifference StopGradient Sub Tan Tanh TruncateDiv
Xdivy Xlogy ZerosLike BitwiseAnd BitwiseOr BitwiseXor Angle Real Imag Conj Complex
""".split())
_PER_EXAMPLE = frozenset("""
Conv2D Conv3D DepthwiseConv2dNative MaxPool MaxPoolV2 AvgPool AvgPool3D MaxPool3D LRN Dilation2D
ResizeBilinear ResizeNearestNeighbor ResizeBicubic ResizeArea SpaceToDepth DepthToSpace ExtractImagePatches
Conv2DBackpropInput Conv3DBackpropInputV2 MaxPoolWithArgmax FusedResizeAndPadConv2D FusedPadConv2D
""".split())
_KEEP = frozenset("Pad PadV2 MirrorPad Tile ReverseV2 Roll Softmax LogSoftmax".split())
_REDUCTIONS = frozenset("Sum Mean Max Min Prod All Any EuclideanNorm".split())
_NO_BATCH = frozenset("""
Shape ShapeN Size Rank BroadcastArgs BroadcastGradientArgs Assign AssignAdd AssignSub AssignVariableOp
AssignAddVariableOp AssignSubVariableOp ScalarSummary HistogramSummary ImageSummary AudioSummary
AudioSummaryV2 TensorSummary TensorSummaryV2 MergeSummary WriteSummary WriteScalarSummary
WriteHistogramSummary WriteImageSummary Print PrintV2 Assert NoOp SaveV2 Save SaveSlices StringFormat
OptionalFromValue OptionalNone
""".split())   # cond_v2 wraps a branch's intermediates in optionals for the If's gradient alone
_ORDER = frozenset("TopKV2 TopK ArgMax ArgMin Cumsum Cumprod CumulativeLogsumexp Unique UniqueV2 UniqueWithCounts".split())
_FUSED = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
REDUCTION_TYPES, ORDER_TYPES, ELEMENTWISE = _REDUCTIONS, _ORDER, _UNARY_BINARY   # for other modules' walks
NO_RULE = "no rule for op type"           # how an op type the table lacks ends the trace (match/unfollowed.py)
PER_EXAMPLE_ENV = "GRAPHSYNC_PER_EXAMPLE_OPS"   # the user's own per-example op types (declared_per_example)
_VARIABLES = frozenset({"VariableV2", "Variable", "VarHandleOp", "ReadVariableOp", "ResourceGather"})


class _End(Exception):
    """The trace ends at this op: why."""


@dataclasses.dataclass(frozen=True)
class CrossOp:
    """An op that combines examples: how (reduce, contract, kernel, order), and whether it covers
    only part of the batch axes (partial: ghost batch norm's virtual batches)."""

    op: tf.Operation
    how: str
    partial: bool = False
    inner: tuple = ()           # how == "body": (function name, the body's op, why it is a statistic there)
    returned: tuple = ()        # an If's or a While's: the outputs a body's cross-example value leaves by,
                                # when the body does not read it back itself (its verdict: where they go)


@dataclasses.dataclass
class Analysis:
    batch: dict                 # tensor ref → frozenset of the axes that carry the batch
    cross: dict                 # op → CrossOp, in the order found
    ended: list                 # (op, why) where a trace ended: an op type the table does not know, …
    bodies: dict = dataclasses.field(default_factory=dict)   # call or If op → [(function name, body Analysis)]
    outputs: tuple = ()         # a function body's: its output tensors, in order

    def carries(self, tensor: tf.Tensor) -> bool:
        return bool(self.batch.get(tensor.ref()))


def analyze(graph: tf.Graph, ops=None) -> Analysis:
    """Traces the batch axes through `graph` (or from `ops`, the graph's ops, when given)."""
    seeds = []
    for op in by_type.ops_of_types(graph, SOURCES) if ops is None else (op for op in ops if op.type in SOURCES):
        if not is_backward(op):
            seeds += [(t, frozenset({0})) for t in op.outputs if t.shape.rank is None or t.shape.rank >= 1]
    return _trace(seeds, _Bodies.of(graph))


def _trace(seeds, bodies) -> Analysis:
    batch, cross, ended, called = {}, {}, {}, {}
    queue = []
    for t, axes in seeds:
        if axes:
            batch[t.ref()] = axes
            queue.append(t)
    seen_ops = set()
    while queue:
        tensor = queue.pop()
        for op in tensor.consumers():
            if is_backward(op) or is_inlined(op):   # an inlined call no longer runs
                continue
            ins = [batch.get(t.ref()) for t in op.inputs]
            key = (op, tuple(ins))
            if key in seen_ops:
                continue
            seen_ops.add(key)
            try:
                if op.type in _CALLS or op.type in _IFS:
                    outs, crossed, called[op] = _function_op(op, ins, bodies)
                elif op.type in _WHILES:
                    outs, crossed, called[op] = _while_op(op, ins, bodies)
                else:
                    outs, crossed = _apply(op, ins, batch)
            except _End as why:
                ended.setdefault(op, str(why))
                continue
            except (ValueError, TypeError, IndexError, ZeroDivisionError) as exc:
                ended.setdefault(op, f"its batch axes cannot be read ({type(exc).__name__})")
                continue
            if crossed is not None:
                cross[op] = crossed
            for t, axes in zip(op.outputs, outs):
                if axes and batch.get(t.ref()) != axes and t.ref() not in batch:
                    batch[t.ref()] = axes
                    queue.append(t)
    return Analysis(batch, cross, list(ended.items()), called)


# ---------------------------------------------------------------------------------------------
# Function bodies: tf.function calls and the branches of control flow v2's If, traced like the
# graph, seeded with the batch axes of the op's inputs on the body's arguments.

_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
_IFS = frozenset({"If", "StatelessIf"})


class _Bodies:
    """The function bodies of one graph, each traced once per (function name, input shapes, input
    axes), and kept with the graph: a rewrite analyzes its graph twice (the plan, then the check of
    the result), and building a body's FuncGraph is most of a body's cost (tf_keras' two Ifs per
    batch norm: a second on DenseNet121 × 4). A function's body never changes under its name."""

    _of_graph = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, graph: tf.Graph) -> "_Bodies":
        if graph not in cls._of_graph:
            cls._of_graph[graph] = cls(graph)
        return cls._of_graph[graph]

    def __init__(self, graph: tf.Graph):
        self.graph, self._library, self._traced, self._graphs = graph, None, {}, {}

    def trace(self, name: str, inputs, ins, op=None) -> Analysis:
        key = (name, tuple(str(t.shape) for t in inputs), tuple(ins))
        if key not in self._traced:
            if self._library is None or name not in self._library:   # functions added since
                self._library = tf_private.function_library(self.graph)
            fdef = self._library.get(name)
            if fdef is None:
                raise _End(f"its function {name} is not in the graph's library")
            self._traced[key] = None   # a recursive call ends the trace
            try:
                body = self._graph(name, fdef, inputs, op)
                found = _trace(list(zip(body.inputs, ins)), self)
            except BaseException:
                del self._traced[key]
                raise
            found.outputs = tuple(body.outputs)
            self._traced[key] = found
        found = self._traced[key]
        if found is None:
            raise _End(f"{name} calls itself")
        if found.ended:
            op, why = found.ended[0]
            raise _End(f"in its function {name}, {op.name} ({op.type}): {why}")
        return found

    def _graph(self, name, fdef, inputs, op):
        """The body's FuncGraph: the one control flow v2 left on the op, else built once per input
        shapes (a loop's body is traced again while its loop variables' axes settle)."""
        body = (tf_private.branch_graph(op, name) or tf_private.loop_body_graph(op, name)) if op is not None else None
        if body is None:
            key = (name, tuple(str(t.shape) for t in inputs))
            if key not in self._graphs:
                self._graphs[key] = tf_private.function_graph(self.graph, fdef, [t.shape for t in inputs])
            body = self._graphs[key]
        return body


def _function_op(op, ins, bodies):
    """(each output's batch axes, a CrossOp "body" when a body holds a batch statistic, the bodies
    traced) for a tf.function call or an If."""
    if op.type in _CALLS:
        names, args = [op.get_attr("f").name], list(op.inputs)
    else:
        if ins[0]:
            raise _End("an If whose predicate carries the batch")
        names, args = [op.get_attr(k).name for k in ("then_branch", "else_branch")], list(op.inputs)[1:]
        ins = ins[1:]
    traced = [(name, bodies.trace(name, args, ins, op if op.type in _IFS else None)) for name in names]
    outs = []
    for k in range(len(op.outputs)):
        found = {body.batch.get(body.outputs[k].ref()) for _, body in traced} - {None}
        if len(found) > 1:
            raise _End("branches that carry the batch on different axes")
        outs.append(found.pop() if found else None)
    returning = None
    for name, body in traced:
        for crossed in body.cross.values():
            why = _statistic_in_body(body, crossed, returned=op.type in _CALLS)
            if why is not None:
                return outs, CrossOp(op, "body", inner=(name, crossed.op, why)), traced
            leaves = _outputs_reached(body, crossed.op) if returning is None and op.type in _IFS else ()
            if leaves:   # returned by the branch: the graph around the If decides (verdict)
                how = verdict(body, crossed)[1].split(";")[0]
                returning = CrossOp(op, "body", inner=(name, crossed.op, f"{how}, and the branch returns it"),
                                    returned=leaves)
    return outs, returning, traced


# ---------------------------------------------------------------------------------------------
# Loops under control flow v2: a While's body traced like a call's, seeded with the loop inputs'
# axes, again until every loop variable's axes settle (the body's output k is loop variable k of
# the next iteration). Its cond only decides when the loop ends and is not traced.

_WHILES = frozenset({"While", "StatelessWhile"})


def _while_op(op, ins, bodies):
    """(each output's batch axes, a CrossOp "body" when the body holds a cross-example value, the
    body traced) for a While. A loop variable that enters without the batch and leaves the body
    with it (a state built from zeros, an output list written per step) carries it from then on;
    one the body moves to other axes ends the trace."""
    name, args = op.get_attr("body").name, list(op.inputs)
    state = list(ins)
    for _ in range(len(args) + 1):   # each pass adds the batch to one loop variable at least, or settles
        body = bodies.trace(name, args, state, op)
        settled = [_loop_variable(k, entered, body.batch.get(out.ref()))
                   for k, (entered, out) in enumerate(zip(state, body.outputs))]
        if settled == state:
            return state, _loop_cross(op, name, body), [(name, body)]
        state = settled
    raise _End("loop variables whose batch axes do not settle")


def _loop_variable(index, entered, left):
    """The axes loop variable `index` carries across iterations, from the axes it entered the body
    with and those the body's output gives it."""
    if entered and left and entered != left:
        raise _End(f"a loop whose body moves the batch of loop variable {index} from axes "
                   f"{sorted(entered)} to {sorted(left)}")
    return entered or left


def _loop_cross(op, name, body):
    """The While's CrossOp: a cross-example op of its body read back into the examples there (a
    statistic inside the recurrence: refused, it cannot be synchronized per step), else one whose
    value leaves the loop (its verdict is where those outputs go), else None."""
    returned = None
    for crossed in body.cross.values():
        why = _statistic_in_body(body, crossed, returned=False)
        if why is not None:
            return CrossOp(op, "body", inner=(name, crossed.op, why))
        leaves = _outputs_reached(body, crossed.op)
        if leaves and returned is None:
            how = verdict(body, crossed)[1].split(";")[0]
            returned = CrossOp(op, "body", inner=(name, crossed.op, f"{how}, and the loop returns it"),
                               returned=leaves)
    return returned


def _outputs_reached(body: Analysis, start: tf.Operation) -> tuple:
    """The indices of the body's outputs downstream of `start`."""
    index = {}
    for k, t in enumerate(body.outputs):   # a loop variable passed through may be several outputs
        index.setdefault(t.ref(), []).append(k)
    found, seen, stack = set(), {start}, [start]
    while stack:
        for t in stack.pop().outputs:
            found.update(index.get(t.ref(), ()))
            for reader in t.consumers():
                if reader not in seen:
                    seen.add(reader)
                    stack.append(reader)
    return tuple(sorted(found))


def _statistic_in_body(body: Analysis, crossed: CrossOp, returned: bool):
    """Why a cross-example op of a body is a statistic there, or None: read back into the
    examples inside the body (a body may read no variable: any tensor carrying the batch counts),
    or (`returned`: a call, which graphsync inlines to see where it goes) handed out through the
    body's outputs. An If's branch or a loop body that only returns such a value makes the op a
    cross-example op whose verdict the graph around it decides (`CrossOp.returned`): a statistic
    when read back there (`mean = tf.cond(training, batch mean, moving mean)`, then `x - mean`),
    terminal otherwise (a metric's, tf_keras' If)."""
    if crossed.how == "body":
        name, inner, why = crossed.inner
        return f"calls {name}, whose {inner.name} ({inner.type}) {why}"
    found, why = verdict(body, crossed)
    if found != TERMINAL:
        return why
    how = why.split(";")[0]
    outputs = {t.ref() for t in body.outputs}
    seen, stack = {crossed.op}, [crossed.op]
    while stack:
        for t in stack.pop().outputs:
            if returned and t.ref() in outputs:
                return f"{how}; its body returns it ({t.name})"
            for reader in t.consumers():
                if reader in seen:
                    continue
                seen.add(reader)
                if any(body.carries(o) for o in reader.outputs):
                    return f"{how}, and {reader.name} reads it back into the examples"
                stack.append(reader)
    return None


# ---------------------------------------------------------------------------------------------
# The rules: (op, each input's batch axes or None) → (each output's batch axes, CrossOp or None)

def _apply(op, ins, batch=None):
    kind = op.type
    if kind == "Reshape":   # a computed shape is read against the batch axes traced so far
        return _reshape(op, ins, batch)
    if kind in _UNARY_BINARY:
        return _broadcast(op, ins), None
    if kind in _NO_BATCH:
        return [None] * len(op.outputs), None
    if kind in _PER_EXAMPLE:
        data = 2 if kind.startswith(("Conv2DBackpropInput", "Conv3DBackpropInput")) else 0
        return _per_example(op, ins, data), None
    if kind in _FUSED:
        outs = _per_example(op, ins, 0)
        training = op.get_attr("is_training")
        if training and ins[0] and _local_moments(op):   # graphsync's statistics kernel: its y feeds only the
            return [None] * len(op.outputs), CrossOp(op, "kernel")   # residual graphsync sums over the towers
        return [outs[0]] + [None] * (len(op.outputs) - 1), (CrossOp(op, "kernel") if training and ins[0] else None)
    if kind in _KEEP:
        axes = _only(ins, 0, op)
        if kind in ("Softmax", "LogSoftmax") and axes and _rank(op.inputs[0]) is not None and \
                _rank(op.inputs[0]) - 1 in axes:
            return [None], CrossOp(op, "reduce")
        return [axes] * len(op.outputs), None
    if kind in _REDUCTIONS:
        return _reduction(op, ins)
    if kind in _ORDER:
        return _order(op, ins)
    rule = RULES.get(kind)
    if rule is None:
        if kind in declared_per_example():
            carrying = [i for i, axes in enumerate(ins) if axes]
            return _per_example(op, ins, carrying[0] if carrying else 0), None
        raise _End(f"{NO_RULE} {kind}")
    return rule(op, ins)


def declared_per_example() -> frozenset:
    """The op types the user declares to keep each example apart, the batch on axis 0 of the one
    input holding it and of the first output (`GRAPHSYNC_PER_EXAMPLE_OPS=TypeA,TypeB`): a custom
    op, or one the table lacks, which would otherwise end the trace and, read back, be refused
    (graphsync/match/unfollowed.py). Read from the environment so that every way in (the CLI,
    `graphsync run`, no edit at all) takes the same declaration."""
    return frozenset(t.strip() for t in os.environ.get(PER_EXAMPLE_ENV, "").split(",") if t.strip())


def _local_moments(op) -> bool:
    return gradient_type(op) == LOCAL_MOMENTS_GRADIENT


def _rank(tensor):
    return tensor.shape.rank


def _only(ins, index, op):
    """The batch axes of input `index`; the trace ends if another input carries the batch."""
    if any(a for i, a in enumerate(ins) if i != index):
        raise _End(f"{op.type} reads the batch on an input it does not carry it from")
    return ins[index]


def _broadcast(op, ins):
    out_rank = _rank(op.outputs[0]) if op.outputs else None
    found = set()
    for t, axes in zip(op.inputs, ins):
        if not axes:
            continue
        rank = _rank(t)
        if rank == out_rank:
            found.add(axes)
        elif rank is None or out_rank is None:
            raise _End(f"{op.type} broadcasts a tensor of unknown rank")
        else:
            found.add(frozenset(a + out_rank - rank for a in axes))
    widest = max(found, key=len) if found else None
    if any(not axes <= widest for axes in found):   # nested sets: a ghost statistic meets its virtual batches
        raise _End(f"{op.type} combines inputs that carry the batch on different axes")
    axes = widest
    return [axes] * len(op.outputs)


def _per_example(op, ins, data):
    axes = _only(ins, data, op)
    if axes is not None and axes != frozenset({0}):
        raise _End(f"{op.type} reads the batch on axes {sorted(axes)}, not 0")
    return [axes] + [None] * (len(op.outputs) - 1)


def _const_axes(tensor, rank):
    value = tf.get_static_value(tensor)
    if value is None:
        raise _End("its axes are not constant")
    axes = [int(a) for a in np.ravel(value)]
    if rank is None:
        if any(a < 0 for a in axes):
            raise _End("negative axes of a tensor of unknown rank")
        return frozenset(axes)
    return frozenset(a % rank for a in axes) if rank else frozenset()


def _reduction(op, ins):
    axes = _only(ins, 0, op)
    if not axes:
        return [None], None
    rank = _rank(op.inputs[0])
    reduced = _const_axes(op.inputs[1], rank)
    if rank is not None and not reduced and np.size(tf.get_static_value(op.inputs[1])) == 0:
        return [axes], None   # an empty reduction: the identity
    return _reduced(op, axes, reduced, bool(op.get_attr("keep_dims")), "reduce")


def _reduced(op, axes, reduced, keep, how):
    """Output axes and the CrossOp of reducing `reduced` from a tensor whose batch is on `axes`."""
    hit = axes & reduced
    left = axes - reduced
    out = left if keep else frozenset(a - sum(r < a for r in reduced) for a in left)
    crossed = CrossOp(op, how, partial=bool(left)) if hit else None
    return [out or None] + [None] * (len(op.outputs) - 1), crossed


def _order(op, ins):
    kind = op.type
    axes = _only(ins, 0, op)
    if not axes:
        return [None] * len(op.outputs), None
    rank = _rank(op.inputs[0])
    if kind in ("TopKV2", "TopK"):
        if rank is None:
            raise _End("top-k of a tensor of unknown rank")
        last = frozenset({rank - 1})
        if axes & last:
            return [None] * len(op.outputs), CrossOp(op, "order", partial=bool(axes - last))
        return [axes] * len(op.outputs), None
    if kind in ("Unique", "UniqueV2", "UniqueWithCounts"):
        return [None] * len(op.outputs), CrossOp(op, "order")
    along = _const_axes(op.inputs[1], rank)
    if kind in ("ArgMax", "ArgMin"):
        return _reduced(op, axes, along, False, "order")
    if axes & along:   # a cumulative sum or product along the batch
        return [axes], CrossOp(op, "order")
    return [axes], None


# ---------------------------------------------------------------------------------------------
# Rules for ops that move axes

def _transpose(op, ins):
    axes = _only(ins, 0, op)
    perm = tf.get_static_value(op.inputs[1])
    if perm is None:
        raise _End("its permutation is not constant")
    perm = [int(p) for p in np.ravel(perm)]
    return [frozenset(perm.index(a) for a in axes)], None


_BATCH_PROBE = 720720   # an unknown batch size divisible by 2…16: a split into k virtual batches divides it
_OTHER_PROBES = (17, 19, 23, 29, 31, 37, 41, 43)


def _reshape(op, ins, batch=None):
    """Where the batch axes go through a reshape. Its static shapes first (a constant shape, at
    most one unknown dimension: the probe sizes below), unless it can be read by structure
    (`_by_factors`): a shape computed at run time (tf.tensordot's, on an unknown batch size, from
    `Shape` ops) is read as products of the dimensions it gathers, and an input made by a merging
    reshape as the axes it merged, so that [N, H, W, C] → [N·H·W, C] → [N, H, W, C] carries the
    batch on N alone again (the probes, on the merged axis alone, would keep it on N, H and W)."""
    axes = _only(ins, 0, op)
    if batch is not None:   # by its factors first: they say more than sizes
        found = _by_factors(op, axes, batch)
        if found is not None:
            return [found], None
    return _by_probes(op, axes)


def _by_probes(op, axes):
    dims_in, dims_out = shapes.dims(op.inputs[0].shape), shapes.dims(op.outputs[0].shape)
    if dims_in is None or dims_out is None:
        raise _End("a reshape of unknown rank")
    probe = [d if d is not None else (_BATCH_PROBE if i in axes else _OTHER_PROBES[i % 8])
             for i, d in enumerate(dims_in)]
    total = int(np.prod(probe, dtype=object))
    unknown = [i for i, d in enumerate(dims_out) if d is None]
    if len(unknown) > 1:
        raise _End("a reshape to more than one unknown dimension")
    out = list(dims_out)
    if unknown:
        known = int(np.prod([d for d in dims_out if d is not None], dtype=object))
        if known == 0 or total % known:
            raise _End("a reshape whose unknown dimension cannot be read")
        out[unknown[0]] = total // known
    lo, hi = min(axes), max(axes)
    before = int(np.prod(probe[:lo], dtype=object))
    through = int(np.prod(probe[:hi + 1], dtype=object))
    if total == 0:
        raise _End("a reshape of an empty tensor")
    found, cum = set(), 1
    for b, d in enumerate(out):
        nxt = cum * d
        if nxt > before and cum < through:
            found.add(b)
        cum = nxt
    return [frozenset(found) or None], None


def _broadcast_to(op, ins):
    axes = _only(ins, 0, op)
    rank_in, rank_out = _rank(op.inputs[0]), _rank(op.outputs[0])
    if rank_in is None or rank_out is None:
        raise _End("a broadcast of unknown rank")
    return [frozenset(a + rank_out - rank_in for a in axes)], None


def _space_batch(op, ins):
    """SpaceToBatchND / BatchToSpaceND (atrous convolution): blocks of the spatial axes moved into
    the batch axis and back. Axis 0 carries the examples on both sides (with spatial blocks in
    between, which a reduction over axis 0 and the spatial axes sums all the same)."""
    axes = _only(ins, 0, op)
    if axes != frozenset({0}):
        raise _End("spatial blocks moved into or out of an axis other than the batch's")
    return [axes], None


# A dimension by structure: the ordered factors (outermost first) it is the product of, each
# (key, size): key (tensor ref, axis) names the dimension of a tensor it was read from (None for a
# constant), size its static size or None. Read through the ops tf.tensordot and reshapes build:
# Shape, GatherV2, Prod, Pack, ConcatV2, StridedSlice, Cast; a tensor's dimensions through Transpose,
# MatMul, Reshape and one-input elementwise ops. Anything else is a factor of its own.

_SAME_DIMS = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient", "EnsureShape"}) | \
    frozenset(k for k in _UNARY_BINARY if k not in ("Select", "SelectV2"))


def _dim_factors(t, memo, depth=0):
    """Each axis of `t` as its factors, or None (unknown rank)."""
    if t.ref() in memo:
        return memo[t.ref()]
    dims = shapes.dims(t.shape)
    if dims is None:
        return None
    op, found = t.op, None
    if depth < 64:
        if op.type == "Transpose":
            perm, src = tf.get_static_value(op.inputs[1]), _dim_factors(op.inputs[0], memo, depth + 1)
            if perm is not None and src is not None:
                found = [src[int(p)] for p in np.ravel(perm)]
        elif op.type in _SAME_DIMS and len(op.inputs) == 1 and op.outputs[0] is t:
            found = _dim_factors(op.inputs[0], memo, depth + 1)
        elif op.type == "MatMul":
            a, b = (_dim_factors(x, memo, depth + 1) for x in op.inputs[:2])
            if a is not None and b is not None and len(a) == len(b) == 2:
                found = [a[1 if op.get_attr("transpose_a") else 0], b[0 if op.get_attr("transpose_b") else 1]]
        elif op.type == "Reshape":
            value = _shape_value(op.inputs[1], memo, depth + 1)
            if value is not None and not value[0] and all(v is not None for v in value[1]):
                src = _dim_factors(op.inputs[0], memo, depth + 1)
                if all(len(v) == 1 and v[0][0] is None for v in value[1]):   # constant: a regrouping?
                    found = _regrouped(src, [v[0][1] for v in value[1]])
                else:   # computed: only as a regrouping of the input's own factors, in their order
                    found = _regrouped_as(src, value[1])
    if found is None or len(found) != len(dims):
        found = [None] * len(dims)
    out = []
    for i, (d, factors) in enumerate(zip(dims, found)):
        sizes = [s for _, s in factors] if factors is not None else [None]
        if factors is None or (d is not None and (None in sizes or int(np.prod(sizes, dtype=object)) != d)):
            factors = [((t.ref(), i), d)]
        out.append(list(factors))
    memo[t.ref()] = out
    return out


def _regrouped(factors, sizes):
    """The input's factors grouped into the output's axes of `sizes` when each output axis is a
    run of whole input axes of static sizes (a merge such as [N, H, W, C] → [N·H·W, C]), else None."""
    if factors is None or any(s is None for axis in factors for _, s in axis):
        return None
    out, k = [], 0
    for size in sizes:
        group, product = [], 1
        while k < len(factors) and (product < size or not group):
            group += factors[k]
            product *= int(np.prod([s for _, s in factors[k]], dtype=object))
            k += 1
        if product != size:
            return None
        out.append(group)
    return out if k == len(factors) else None


def _regrouped_as(factors, groups):
    """The input's factors grouped as `groups` (a shape's factors) when these are the same factors
    in the same order (a dimension read from the same tensor, or of the same static size), else
    None: a reshape to the shape of another layout (a transposed tensor put back into its
    original's shape) mixes the factors, and says nothing about which of them holds the examples."""
    if factors is None:
        return None
    flat = [f for axis in factors for f in axis if f[1] != 1]
    out, k = [], 0
    for group in groups:
        regrouped = []
        for key, size in group:
            if size == 1:
                continue
            if k >= len(flat) or not ((key is not None and key == flat[k][0]) or
                                      (size is not None and size == flat[k][1])):
                return None
            regrouped.append(flat[k])
            k += 1
        out.append(regrouped or [(None, 1)])
    return out if k == len(flat) else None


def _shape_value(t, memo, depth=0):
    """An int tensor's value as factors: (scalar?, [each element's factors, or None]), or None."""
    if depth > 64 or t.shape.rank not in (0, 1):
        return None
    op = t.op
    const = tf.get_static_value(t) if op.type == "Const" else None
    if const is not None:
        return np.ndim(const) == 0, [[(None, int(v))] if v >= 0 else None for v in np.ravel(const)]
    if op.type == "Shape":
        dims = _dim_factors(op.inputs[0], memo, depth + 1)
        return None if dims is None else (False, dims)
    if op.type in ("Identity", "Cast"):
        return _shape_value(op.inputs[0], memo, depth + 1)
    if op.type == "GatherV2":
        params, indices, axis = _shape_value(op.inputs[0], memo, depth + 1), \
            tf.get_static_value(op.inputs[1]), tf.get_static_value(op.inputs[2])
        if params is None or params[0] or indices is None or axis is None or int(axis) != 0 or \
                op.get_attr("batch_dims"):
            return None
        picked = [params[1][int(k)] if -len(params[1]) <= int(k) < len(params[1]) else None for k in np.ravel(indices)]
        if None in picked and any(int(k) >= len(params[1]) or int(k) < -len(params[1]) for k in np.ravel(indices)):
            return None
        return np.ndim(indices) == 0, picked
    if op.type == "Prod":
        value, along = _shape_value(op.inputs[0], memo, depth + 1), tf.get_static_value(op.inputs[1])
        if value is None or along is None or any(int(a) not in (0, -1) for a in np.ravel(along)) or \
                any(v is None for v in value[1]):
            return None
        product = [f for v in value[1] for f in v] if not value[0] else value[1][0]
        return not op.get_attr("keep_dims") or value[0], [product or [(None, 1)]]
    if op.type == "Mul":
        a, b = (_shape_value(x, memo, depth + 1) for x in op.inputs)
        if a is None or b is None or not (a[0] and b[0]) or a[1][0] is None or b[1][0] is None:
            return None
        return True, [a[1][0] + b[1][0]]
    if op.type == "Pack" and op.get_attr("axis") == 0:
        pieces = [_shape_value(x, memo, depth + 1) for x in op.inputs]
        if any(p is None or not p[0] for p in pieces):
            return None
        return False, [p[1][0] for p in pieces]
    if op.type == "ConcatV2":
        axis = tf.get_static_value(op.inputs[-1])
        pieces = [_shape_value(x, memo, depth + 1) for x in op.inputs[:-1]]
        if axis is None or int(axis) not in (0, -1) or any(p is None or p[0] for p in pieces):
            return None
        return False, [v for p in pieces for v in p[1]]
    if op.type == "Slice":   # tf.nn.softmax_cross_entropy_with_logits: Slice(Shape(x), [rank − 1], [1])
        value, begin, size = _shape_value(op.inputs[0], memo, depth + 1), _small_int(op.inputs[1]), \
            _small_int(op.inputs[2])
        if value is None or value[0] or begin is None or size is None:
            return None
        end = len(value[1]) if size == -1 else begin + size
        return (False, value[1][begin:end]) if 0 <= begin <= end <= len(value[1]) else None
    if op.type == "StridedSlice":
        value = _shape_value(op.inputs[0], memo, depth + 1)
        spec = [tf.get_static_value(x) for x in op.inputs[1:4]]
        masks = [op.get_attr(k) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                          "shrink_axis_mask")]
        if value is None or value[0] or any(s is None or np.size(s) != 1 for s in spec) or any(masks[2:4]):
            return None
        begin, end, stride = (int(np.ravel(s)[0]) for s in spec)
        if masks[4] & 1:
            return (True, [value[1][begin]]) if -len(value[1]) <= begin < len(value[1]) else None
        sl = slice(None if masks[0] & 1 else begin, None if masks[1] & 1 else end, stride)
        return False, value[1][sl]
    return None


def _small_int(t, depth=0):
    """A one-element int tensor's value, also when computed by Add/Sub/Pack from constants and
    ranks (TensorFlow's static values stop at arithmetic), else None."""
    value = tf.get_static_value(t)
    if value is not None:
        return int(np.ravel(value)[0]) if np.size(value) == 1 else None
    op = t.op
    if depth < 8 and op.type in ("Sub", "Add", "AddV2"):
        a, b = (_small_int(x, depth + 1) for x in op.inputs)
        return None if a is None or b is None else a - b if op.type == "Sub" else a + b
    if depth < 8 and op.type in ("Pack", "Identity") and len(op.inputs) == 1:
        return _small_int(op.inputs[0], depth + 1)
    if op.type == "Rank" and op.inputs[0].shape.rank is not None:
        return op.inputs[0].shape.rank
    return None


def _by_factors(op, axes, batch):
    """The output's batch axes when the reshape regroups the factors its input is made of (the
    shape read from the graph by `_shape_value`), or None. A factor carries the batch when the axis
    it was read from does; an input axis carrying the batch without a factor that says so has all
    its factors count (merged examples: kept on every axis they reach)."""
    memo = {}
    dims_in, dims_out = _dim_factors(op.inputs[0], memo), shapes.dims(op.outputs[0].shape)
    value = _shape_value(op.inputs[1], memo)
    if dims_in is None or dims_out is None or value is None or value[0] or len(value[1]) != len(dims_out):
        return None
    flat, carrying = [], set()
    for i, factors in enumerate(dims_in):
        said = [k for k, (key, _) in enumerate(factors) if key is not None and key[1] in batch.get(key[0], ())]
        if i in axes:
            said = said or [k for k, (_, size) in enumerate(factors) if size != 1]
            if not said:
                return None
        elif said:
            return None   # the factors disagree with the trace: read nothing
        carrying |= {len(flat) + k for k in said}
        flat += factors
    probes, others = {}, iter(range(10 ** 6))
    for k, (key, size) in enumerate(flat):
        if size is None and key not in probes:
            probes[key] = _BATCH_PROBE if k in carrying else _OTHER_PROBES[next(others) % len(_OTHER_PROBES)]

    def size_of(factors):
        sizes = [s if s is not None else probes.get(key) for key, s in factors]
        return None if None in sizes else int(np.prod(sizes, dtype=object))

    sizes_in = [size_of([f]) for f in flat]
    total = int(np.prod(sizes_in, dtype=object))
    out = [d if d is not None else (size_of(v) if v is not None else None) for d, v in zip(dims_out, value[1])]
    unknown = [b for b, d in enumerate(out) if d is None]
    known = int(np.prod([d for d in out if d is not None], dtype=object))
    if len(unknown) > 1 or total == 0 or known == 0 or any(sizes_in[k] == 1 for k in carrying):
        return None
    if unknown:
        if total % known:
            return None
        out[unknown[0]] = total // known
    elif known != total:
        return None
    found, cum = set(), 1
    for b, d in enumerate(out):
        nxt = cum * d
        for k in carrying:
            before = int(np.prod(sizes_in[:k], dtype=object))
            if nxt > before and cum < before * sizes_in[k]:
                found.add(b)
        cum = nxt
    return frozenset(found) or None


def _expand_dims(op, ins):
    axes = _only(ins, 0, op)
    rank = _rank(op.inputs[0])
    dim = int(np.ravel(tf.get_static_value(op.inputs[1]))[0]) if tf.get_static_value(op.inputs[1]) is not None \
        else None
    if dim is None or (rank is None and dim < 0):
        raise _End("its axis is not constant")
    dim = dim % (rank + 1) if rank is not None else dim
    return [frozenset(a + (a >= dim) for a in axes)], None


def _squeeze(op, ins):
    axes = _only(ins, 0, op)
    dims_in = shapes.dims(op.inputs[0].shape)
    listed = list(op.get_attr("squeeze_dims"))
    if dims_in is None:
        raise _End("a squeeze of unknown rank")
    removed = {d % len(dims_in) for d in listed} if listed else {i for i, d in enumerate(dims_in) if d == 1}
    if _rank(op.outputs[0]) != len(dims_in) - len(removed):
        raise _End("a squeeze of unknown dimensions")
    if axes & removed:
        raise _End("a squeeze of the batch axis")
    return [frozenset(a - sum(r < a for r in removed) for a in axes)], None


def _concat(op, ins):
    values = [a for a in ins[:-1] if a]
    if ins[-1]:
        raise _End("a concatenation along a computed axis")
    if len(set(values)) > 1:
        raise _End("a concatenation of tensors carrying the batch on different axes")
    return [values[0] if values else None], None


def _pack(op, ins):
    values = {a for a in ins if a}
    if len(values) > 1:
        raise _End("a stack of tensors carrying the batch on different axes")
    rank = _rank(op.outputs[0])
    axis = op.get_attr("axis")
    if rank is None:
        raise _End("a stack of unknown rank")
    axis %= rank
    axes = values.pop() if values else frozenset()
    return [frozenset(a + (a >= axis) for a in axes) or None], None


def _unpack(op, ins):
    axes = _only(ins, 0, op)
    rank = _rank(op.inputs[0])
    if rank is None:
        raise _End("an unstack of unknown rank")
    axis = op.get_attr("axis") % rank
    if axis in axes:
        raise _End("an unstack of the batch axis into single examples")
    return [frozenset(a - (a > axis) for a in axes)] * len(op.outputs), None


def _split(op, ins):
    value = 1 if op.type == "Split" else 0
    axes = _only(ins, value, op)
    rank, axis = _rank(op.inputs[value]), tf.get_static_value(op.inputs[0 if op.type == "Split" else 2])
    if axes and (rank is None or axis is None or int(axis) % rank in axes) and len(op.outputs) > 1:
        raise _End("a split of the examples into parts")
    return [axes] * len(op.outputs), None


def _slice(op, ins):
    axes = _only(ins, 0, op)
    begin, size = tf.get_static_value(op.inputs[1]), tf.get_static_value(op.inputs[2])
    if axes and (begin is None or size is None or any(begin[a] != 0 or size[a] != -1 for a in axes)):
        raise _End("a slice that selects some of the examples")
    return [axes], None


def _strided_slice(op, ins):
    axes = _only(ins, 0, op)
    rank = _rank(op.inputs[0])
    n = op.inputs[1].shape.num_elements()   # which axes go where needs the spec's length and masks only
    if rank is None or n is None:            # (a loop's x[i] slices at a computed step)
        raise _End("a strided slice of unknown rank or spec length")
    masks = {k: op.get_attr(k) for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    mapping, spec, i_in, i_out = {}, {}, 0, 0
    for s in range(n):
        bit = 1 << s
        if masks["ellipsis_mask"] & bit:
            later = sum(1 for j in range(s + 1, n) if not masks["new_axis_mask"] & (1 << j))
            for _ in range(rank - i_in - later):
                mapping[i_in] = i_out
                i_in, i_out = i_in + 1, i_out + 1
        elif masks["new_axis_mask"] & bit:
            i_out += 1
        elif masks["shrink_axis_mask"] & bit:
            mapping[i_in] = None
            i_in += 1
        else:
            mapping[i_in], spec[i_in] = i_out, s
            i_in, i_out = i_in + 1, i_out + 1
    while i_in < rank:
        mapping[i_in] = i_out
        i_in, i_out = i_in + 1, i_out + 1
    if any(mapping.get(a) is None for a in axes):
        raise _End("a slice that selects single examples")
    if any(not _whole(op, spec.get(a)) for a in axes):
        raise _End("a slice that selects some of the examples")
    return [frozenset(mapping[a] for a in axes)], None


def _whole(op, s) -> bool:
    """Whether slice spec `s` of a StridedSlice (None: under the ellipsis) takes a whole axis."""
    if s is None:
        return True
    begin, end, strides = (tf.get_static_value(t) for t in op.inputs[1:4])
    bit = 1 << s
    starts = bool(op.get_attr("begin_mask") & bit) or (begin is not None and int(np.ravel(begin)[s]) == 0)
    ends = bool(op.get_attr("end_mask") & bit) or (end is not None and int(np.ravel(end)[s]) >= 2 ** 31 - 1)
    return starts and ends and strides is not None and int(np.ravel(strides)[s]) == 1


def _gather(op, ins):
    params, indices = ins[0], ins[1]
    if len(ins) > 2 and ins[2]:
        raise _End("a gather along a computed axis")
    rank_p, rank_i = _rank(op.inputs[0]), _rank(op.inputs[1])
    if op.type == "ResourceGather":
        axis = 0
    else:
        axis = 0 if op.type == "Gather" else tf.get_static_value(op.inputs[2])
    if axis is None or rank_i is None or (params and rank_p is None):
        raise _End("a gather of unknown rank or along a computed axis")
    axis = int(axis) % rank_p if rank_p else int(axis)
    if op.type != "ResourceGather" and op.get_attr("batch_dims") if op.type == "GatherV2" else False:
        raise _End("a gather with batch_dims")
    found = set()
    if params:
        if axis in params:
            raise _End("a gather of examples")
        found |= {a if a < axis else a - 1 + rank_i for a in params}
    if indices:
        found |= {a + axis for a in indices}
    return [frozenset(found) or None], None


def _one_hot(op, ins):
    axes = _only(ins, 0, op)
    axis = op.get_attr("axis")
    rank = _rank(op.inputs[0])
    if axis == -1:
        return [axes], None
    if rank is None:
        raise _End("a one-hot of unknown rank")
    return [frozenset(a + (a >= axis) for a in axes)], None


def _matmul(op, ins):
    a, b = ins[0], ins[1]
    ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    out, crossed = set(), False
    if a:
        rows, inner = (1, 0) if ta else (0, 1)
        out |= {0} if rows in a else set()
        crossed |= inner in a
    if b:
        cols, inner = (0, 1) if tb else (1, 0)
        out |= {1} if cols in b else set()
        crossed |= inner in b
    return [frozenset(out) or None], CrossOp(op, "contract") if crossed else None


def _batch_matmul(op, ins):
    out_rank = _rank(op.outputs[0])
    if out_rank is None or any(_rank(t) is None for t in op.inputs[:2]):
        raise _End("a batch matmul of unknown rank")
    adj_a = op.get_attr("adj_x")
    adj_b = op.get_attr("adj_y")
    out, crossed = set(), False
    for t, axes, is_a in ((op.inputs[0], ins[0], True), (op.inputs[1], ins[1], False)):
        if not axes:
            continue
        r = _rank(t)
        if is_a:
            rows, inner = (r - 1, r - 2) if adj_a else (r - 2, r - 1)
            keep_to = out_rank - 2
        else:
            inner, rows = (r - 1, r - 2) if adj_b else (r - 2, r - 1)
            keep_to = out_rank - 1
        for ax in axes:
            if ax == inner:
                crossed = True
            elif ax == rows:
                out.add(keep_to)
            else:
                out.add(ax + out_rank - r)
    return [frozenset(out) or None], CrossOp(op, "contract") if crossed else None


def _einsum(op, ins):
    equation = op.get_attr("equation").decode().replace(" ", "")
    if "..." in equation or "->" not in equation:
        raise _End("an einsum with an ellipsis or no output")
    lhs, rhs = equation.split("->")
    terms = lhs.split(",")
    out, crossed = set(), False
    for term, axes in zip(terms, ins):
        for ax in axes or ():
            label = term[ax]
            if label in rhs:
                out.add(rhs.index(label))
            else:
                crossed = True
    return [frozenset(out) or None], CrossOp(op, "contract") if crossed else None


def _switch(op, ins):
    axes = _only(ins, 0, op)
    return [axes, axes], None


def _merge(op, ins):
    values = {a for a in ins if a}
    if len(values) > 1:
        raise _End("a merge of branches carrying the batch on different axes")
    return [values.pop() if values else None, None], None


def _identity_n(op, ins):
    return list(ins), None


def _xent(op, ins):
    """Logits and labels hold one row per example (labels fed with the data carry the batch too)."""
    logits, labels = ins[0], ins[1]
    if logits and labels and logits != labels:
        raise _End("cross entropy whose logits and labels carry the batch on different axes")
    axes = logits or labels
    if axes and axes != frozenset({0}):
        raise _End("cross entropy with the batch off the rows")
    return [axes, axes], None


def _l2_loss(op, ins):
    axes = _only(ins, 0, op)
    return [None], CrossOp(op, "reduce") if axes else None


# ---------------------------------------------------------------------------------------------
# Rules for lists of tensors and loops. A list — a TensorList (a variant tensor, control flow v2)
# or a TensorArray's flow tensor (control flow v1; its handle carries nothing) — is given the
# batch axes of its elements: unstacking a [T, n, …] tensor over time gives a list whose elements
# carry the batch on axis 0, and stacking it back puts the batch on axis 1 again. A list over the
# examples themselves (the batch on the unstacked axis 0) ends the trace.

def _same(op, *found):
    """The one set of batch axes among `found` (None when none carries the batch)."""
    values = {a for a in found if a}
    if len(values) > 1:
        raise _End(f"{op.type} combines a list and elements carrying the batch on different axes")
    return values.pop() if values else None


def _none_of(op, ins, indices):
    """Ends the trace if an index, a size or a handle carries the batch."""
    if any(ins[i] for i in indices if i < len(ins)):
        raise _End(f"{op.type} reads the batch on an index, a size or a handle")


def _unstacked(op, axes):
    """The element axes of a list unstacked from a tensor along its axis 0."""
    if not axes:
        return None
    if 0 in axes:
        raise _End(f"{op.type} makes a list over the examples (the batch on the axis it unstacks)")
    return frozenset(a - 1 for a in axes)


def _stacked(axes):
    return frozenset(a + 1 for a in axes) if axes else None


def _list_rule(element, lst=None, indices=(), out="list", split=False):
    """A rule for a list op: `element` the input index of a tensor of elements (or of a tensor to
    unstack, for "from"), `lst` that of the list, `indices` inputs that must not carry the batch;
    `out` what the first output is: "list", "element" (the list's axes), "stacked" (axis 1 and on),
    "concat" (the elements concatenated along their axis 0: the batch stays where it was)."""
    def rule(op, ins):
        _none_of(op, ins, indices)
        listed = ins[lst] if lst is not None else None
        if element is not None and out == "from":
            value = ins[element]
            if split and value and 0 in value:
                raise _End(f"{op.type} splits a list over the examples")
            axes = _same(op, listed, value if split else _unstacked(op, value))
        elif element is not None:
            axes = _same(op, listed, ins[element])
        else:
            axes = listed
        first = _stacked(axes) if out == "stacked" else axes
        return [first] + [axes if out == "element" else None] * (len(op.outputs) - 1), None
    return rule


def _loop_frame(op, ins):
    """Enter, Exit, NextIteration (control flow v1): the value, unchanged, in or out of a loop's
    frame. The Merge that joins a loop's entry and its NextIteration (the back edge) is first met
    with the entry's axes alone and met again once the body reaches the NextIteration: a body that
    moves the batch then ends the trace there (_merge)."""
    return [_only(ins, 0, op)], None


def _loop_cond(op, ins):
    if ins[0]:
        raise _End("a loop whose condition carries the batch")
    return [None], None


_LIST_RULES = {
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
    "TensorListLength": lambda op, ins: ([None], None),
    "TensorListElementShape": lambda op, ins: ([None], None),
    # control flow v1: TensorArrayV3 (the flow tensor: the axes of the elements; the handle: none)
    "TensorArrayV3": _list_rule(None, indices=(0,)),
    "TensorArrayScatterV3": _list_rule(2, 3, out="from", indices=(0, 1)),
    "TensorArraySplitV3": _list_rule(1, 3, out="from", indices=(0, 2), split=True),
    "TensorArrayWriteV3": _list_rule(2, 3, indices=(0, 1)),
    "TensorArrayReadV3": _list_rule(None, 2, indices=(0, 1), out="element"),
    "TensorArrayGatherV3": _list_rule(None, 2, indices=(0, 1), out="stacked"),
    "TensorArrayConcatV3": _list_rule(None, 1, indices=(0,), out="concat"),
    "TensorArraySizeV3": lambda op, ins: ([None], None),
    "TensorArrayCloseV3": lambda op, ins: ([], None),
    "Enter": _loop_frame, "RefEnter": _loop_frame, "Exit": _loop_frame, "RefExit": _loop_frame,
    "NextIteration": _loop_frame, "RefNextIteration": _loop_frame, "LoopCond": _loop_cond,
}


RULES = {
    "Transpose": _transpose, "Reshape": _reshape, "ExpandDims": _expand_dims, "Squeeze": _squeeze,
    "ConcatV2": _concat, "Concat": lambda op, ins: _concat(op, ins[1:] + ins[:1]), "Pack": _pack,
    "Unpack": _unpack, "Split": _split, "SplitV": _split, "StridedSlice": _strided_slice, "Slice": _slice,
    "BroadcastTo": _broadcast_to, "SpaceToBatchND": _space_batch, "BatchToSpaceND": _space_batch,
    "SpaceToBatch": _space_batch, "BatchToSpace": _space_batch,
    "GatherV2": _gather, "Gather": _gather, "ResourceGather": _gather, "OneHot": _one_hot,
    "MatMul": _matmul, "BatchMatMul": _batch_matmul, "BatchMatMulV2": _batch_matmul,
    "BatchMatMulV3": _batch_matmul, "Einsum": _einsum, "Switch": _switch, "RefSwitch": _switch,
    "Merge": _merge, "RefMerge": _merge, "IdentityN": _identity_n,
    "SoftmaxCrossEntropyWithLogits": _xent, "SparseSoftmaxCrossEntropyWithLogits": _xent,
    "L2Loss": _l2_loss,
    **_LIST_RULES,
}


# ---------------------------------------------------------------------------------------------
# Verdicts

STATISTIC, TERMINAL, GHOST, ORDER = "statistic", "terminal", "ghost", "order"


SYNCHRONIZED = "synchronized"
_MERGES = ("Collective", "Nccl")
# The gradient names of graphsync's statistics views (graphsync/exchange/views.py): a tower's own
# statistics enter them beside the merged ones, so a view combines the tower with the others.
GRAPHSYNC_VIEWS = ("GraphsyncStatisticsView", "GraphsyncSumView", "GraphsyncExtremumView")


def verdict(analysis: Analysis, crossed: CrossOp, tower_of=None, skip=frozenset(), budget: int = 4000) -> tuple:
    """(verdict, why) for one cross-example op. `tower_of(op)`: the tower an op belongs to (None
    outside them), so that a value combined with other towers' (a merge reading several towers, a
    collective) counts as synchronized; `skip`: ops the walk does not enter."""
    op = crossed.op
    if crossed.how == "body":
        name, inner, why = crossed.inner
        where = "calls" if op.type in _CALLS else "runs the loop body" if op.type in _WHILES else "runs the branch"
        why = f"{where} {name}, whose {inner.name} ({inner.type}) {why}"
        if not crossed.returned:
            return STATISTIC, why
        start = [op.outputs[k] for k in crossed.returned]
        reader, merged = _flows_back(analysis, op, tower_of, skip, budget, start)
        if reader is _BEYOND_BUDGET:
            return STATISTIC, f"{why}; {_BEYOND_BUDGET_WHY % budget}"
        if reader is None:
            if merged is not None:
                return SYNCHRONIZED, f"{why}; {merged.name} combines it with the other towers'"
            return TERMINAL, f"{why}; it reaches no tensor that carries the batch into the model"
        return STATISTIC, f"{why}, and {reader.name} reads it back into the examples"
    how = {"reduce": "reduces over the batch", "contract": "contracts over the batch",
           "kernel": "normalizes with its batch statistics (training mode)",
           "order": "orders or selects among the examples"}[crossed.how]
    if crossed.how == "kernel":
        if any(not is_backward(c) for c in op.outputs[0].consumers()):
            return STATISTIC, how
        return TERMINAL, how + ", but nothing reads its output"
    reader, merged = _flows_back(analysis, op, tower_of, skip, budget)
    if reader is _BEYOND_BUDGET:
        return STATISTIC, f"{how}; {_BEYOND_BUDGET_WHY % budget}"
    if reader is None:
        if merged is not None:
            return SYNCHRONIZED, f"{how}; {merged.name} combines it with the other towers'"
        return TERMINAL, f"{how}; its value reaches no tensor that carries the batch into the model " \
                         "(a loss, a metric, a summary, a variable update)"
    if crossed.partial:
        return GHOST, f"{how} only in part (a reshape split the batch: virtual batches); {reader.name} reads it"
    if crossed.how == "order":
        return ORDER, f"{how}, and {reader.name} reads it back into the examples"
    return STATISTIC, f"{how}, and {reader.name} reads it back into the examples"


# A value whose readers outnumber the walk's budget is not judged terminal on what the walk saw.
_BEYOND_BUDGET = object()
_BEYOND_BUDGET_WHY = "its value reaches more than %d ops, not all followed: taken for a batch statistic"


def _flows_back(analysis: Analysis, op: tf.Operation, tower_of, skip, budget, start=None):
    """(the first forward op downstream of `op` (of its outputs `start` when given) whose output
    carries the batch and that reads one of the model's variables: the statistic went back into
    the model, or None, or _BEYOND_BUDGET when more than `budget` ops were left to walk; the first
    merge across towers met, or None). Merges, and products with a constant zero, are not entered."""
    seen, stack, merged = {op}, [list(op.outputs) if start is None else start], None
    while stack and budget > 0:
        for t in stack.pop():
            for reader in t.consumers():
                if reader in seen or reader in skip or is_backward(reader):
                    continue
                seen.add(reader)
                budget -= 1
                if _is_merge(reader, tower_of):
                    merged = merged or reader
                    continue
                if reader.type in ("Mul", "MulNoNan") and _times_zero(reader):
                    continue
                if any(analysis.carries(o) for o in reader.outputs) and reads_variable(reader):
                    return reader, merged
                stack.append(reader.outputs)
    return (_BEYOND_BUDGET if stack else None), merged


def _is_merge(op, tower_of) -> bool:
    if op.type.startswith(_MERGES) or _is_view(op):
        return True
    if tower_of is None or len(op.inputs) < 2:
        return False
    return len({tower_of(t.op) for t in op.inputs} - {None}) >= 2


def _is_view(op) -> bool:
    if op.type != "IdentityN":
        return False
    return gradient_type(op) in GRAPHSYNC_VIEWS


def _times_zero(op) -> bool:
    for t in op.inputs:
        value = tf.get_static_value(t) if t.op.type == "Const" else None
        if value is not None and np.size(value) and not np.any(value):
            return True
    return False


def forward_readers(op: tf.Operation, enter, budget: int = 400):
    """Each forward op downstream of `op`, once (gradient ops left out), walked on past those for
    which `enter(reader)` holds; at most `budget` of them."""
    seen, stack = {op}, [op]
    while stack and budget > 0:
        for t in stack.pop().outputs:
            for reader in t.consumers():
                if reader in seen or is_backward(reader):
                    continue
                seen.add(reader)
                budget -= 1
                yield reader
                if enter(reader):
                    stack.append(reader)


def reads_variable(op: tf.Operation, depth: int = 3) -> bool:
    """Whether `op` takes one of the model's variables in (through a few reads, casts, reshapes)."""
    frontier = [t.op for t in op.inputs]
    for _ in range(depth):
        if any(o.type in _VARIABLES for o in frontier):
            return True
        frontier = [t.op for o in frontier if o.type in ("Identity", "Cast", "Enter", "Switch", "ReadVariableOp",
                                                          "Reshape", "ExpandDims")
                    for t in o.inputs]
    return any(o.type in _VARIABLES for o in frontier)
