"""Function bodies are a tower's forward too: tf.function calls, the branches of control flow v2's
If, and its While loops.

A call (PartitionedCall, StatefulPartitionedCall) or an If has its bodies traced, seeded with the
batch axes of the op's inputs, once per (function, input axes) (`Bodies`, kept in
`Analysis.bodies`); the bodies' outputs carry their axes to the op's, so gelu or swish in a call
(tf_keras' ConvNeXt, RegNet) do not end the trace, and a body that ends its own trace ends it at the
op, with the reason. A body holding a statistic — a cross-example op read back into the examples
there, or for a call returned — makes the op a cross-example op itself (how BODY, `CrossOp.inner`
naming the op inside): graphsync inlines such a call and synchronizes what it held
(graphsync/plan/planner.py), and refuses such an If unless it is a conditional batch norm it
synchronizes (graphsync/plan/rule.py).

Loops (an RNN: tf.scan, tf_keras' SimpleRNN and LSTM): a `While` has its body traced like a call's,
seeded with the loop inputs' axes, and again until every loop variable's axes settle (a state built
from zeros, or an output list, takes the batch in the body; the body's output k is loop variable k
of the next iteration); a body that moves a loop variable's batch to other axes ends the trace. Its
cond only decides when the loop stops and is not traced. A statistic inside the recurrence
(recurrent batch norm) cannot be synchronized per step: the `While` is a cross-example op "body"
naming the op in its body, refused in one line. A reduction whose value only leaves the loop (a
metric, the loop's termination) gets the verdict of where those outputs go.
"""
from __future__ import annotations

import weakref

import tensorflow as tf

from graphsync.batch_axis.findings import Analysis, CrossOp, Crossing
from graphsync.batch_axis.registry import End, register
from graphsync.batch_axis.verdicts import Verdict, judge
from graphsync.graph import tf_private
from graphsync.graph.walks import descendants

CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
IFS = frozenset({"If", "StatelessIf"})
WHILES = frozenset({"While", "StatelessWhile"})


class Bodies:
    """The function bodies of one graph, each traced once per (function name, input shapes, input
    axes), and kept with the graph: a rewrite analyzes its graph twice (the plan, then the check of
    the result), and building a body's FuncGraph is most of a body's cost (tf_keras' two Ifs per
    batch norm: a second on DenseNet121 × 4). A function's body never changes under its name.
    `trace(seeds, bodies) -> Analysis` traces a body (graphsync/batch_axis/trace.py's, handed in:
    the trace runs these rules, which run the trace again)."""

    _of_graph = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, graph: tf.Graph, trace) -> "Bodies":
        if graph not in cls._of_graph:
            cls._of_graph[graph] = cls(graph, trace)
        return cls._of_graph[graph]

    def __init__(self, graph: tf.Graph, trace):
        self.graph, self._trace, self._library, self._traced, self._graphs = graph, trace, None, {}, {}

    def trace(self, name: str, inputs, ins, op=None) -> Analysis:
        key = (name, tuple(str(t.shape) for t in inputs), tuple(ins))
        if key not in self._traced:
            if self._library is None or name not in self._library:   # functions added since
                self._library = tf_private.function_library(self.graph)
            fdef = self._library.get(name)
            if fdef is None:
                raise End(f"its function {name} is not in the graph's library")
            self._traced[key] = None   # a recursive call ends the trace
            try:
                body = self._graph(name, fdef, inputs, op)
                found = self._trace(list(zip(body.inputs, ins)), self)
            except BaseException:
                del self._traced[key]
                raise
            found.outputs = tuple(body.outputs)
            self._traced[key] = found
        found = self._traced[key]
        if found is None:
            raise End(f"{name} calls itself")
        if found.ended:
            first = found.ended[0]
            raise End(f"in its function {name}, {first.op.name} ({first.op.type}): {first.why}", first.no_rule_for)
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


@register("calls", *CALLS)
@register("branches", *IFS)
def _function_op(op, ins, context):
    """Each output's batch axes, and a CrossOp "body" when a body holds a batch statistic, for a
    tf.function call or an If; the bodies traced go to `context.called`."""
    if op.type in CALLS:
        names, args = [op.get_attr("f").name], list(op.inputs)
    else:
        if ins[0]:
            raise End("an If whose predicate carries the batch")
        names, args = [op.get_attr(k).name for k in ("then_branch", "else_branch")], list(op.inputs)[1:]
        ins = ins[1:]
    traced = [(name, context.bodies.trace(name, args, ins, op if op.type in IFS else None)) for name in names]
    outs = []
    for k in range(len(op.outputs)):
        found = {body.batch.get(body.outputs[k].ref()) for _, body in traced} - {None}
        if len(found) > 1:
            raise End("branches that carry the batch on different axes")
        outs.append(found.pop() if found else None)
    crossed = _call_cross(op, traced)
    context.called[op] = traced
    return outs, crossed


def _call_cross(op, traced):
    """The call's or If's CrossOp: a body's statistic (read back there, or a call's returned),
    else a cross-example value an If's branch returns (its verdict: where those outputs go), else
    None."""
    returning = None
    for name, body in traced:
        for crossed in body.cross.values():
            why = _statistic_in_body(body, crossed, returned=op.type in CALLS)
            if why is not None:
                return CrossOp(op, Crossing.BODY, inner=(name, crossed.op, why))
            leaves = _outputs_reached(body, crossed.op) if returning is None and op.type in IFS else ()
            if leaves:   # returned by the branch: the graph around the If decides (verdict)
                how = judge(body, crossed).does
                returning = CrossOp(op, Crossing.BODY, inner=(name, crossed.op, f"{how}, and the branch returns it"),
                                    returned=leaves)
    return returning


@register("loops", *WHILES)
def _while_op(op, ins, context):
    """Each output's batch axes, and a CrossOp "body" when the body holds a cross-example value,
    for a While; the body traced goes to `context.called`. A loop variable that enters without the
    batch and leaves the body with it (a state built from zeros, an output list written per step)
    carries it from then on; one the body moves to other axes ends the trace."""
    name, args = op.get_attr("body").name, list(op.inputs)
    state = list(ins)
    for _ in range(len(args) + 1):   # each pass adds the batch to one loop variable at least, or settles
        body = context.bodies.trace(name, args, state, op)
        settled = [_loop_variable(k, entered, body.batch.get(out.ref()))
                   for k, (entered, out) in enumerate(zip(state, body.outputs))]
        if settled == state:
            crossed = _loop_cross(op, name, body)
            context.called[op] = [(name, body)]
            return state, crossed
        state = settled
    raise End("loop variables whose batch axes do not settle")


def _loop_variable(index, entered, left):
    """The axes loop variable `index` carries across iterations, from the axes it entered the body
    with and those the body's output gives it."""
    if entered and left and entered != left:
        raise End(f"a loop whose body moves the batch of loop variable {index} from axes "
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
            return CrossOp(op, Crossing.BODY, inner=(name, crossed.op, why))
        leaves = _outputs_reached(body, crossed.op)
        if leaves and returned is None:
            how = judge(body, crossed).does
            returned = CrossOp(op, Crossing.BODY, inner=(name, crossed.op, f"{how}, and the loop returns it"),
                               returned=leaves)
    return returned


def _outputs_reached(body: Analysis, start: tf.Operation) -> tuple:
    """The indices of the body's outputs downstream of `start`."""
    index = {}
    for k, t in enumerate(body.outputs):   # a loop variable passed through may be several outputs
        index.setdefault(t.ref(), []).append(k)
    found = {k for op in descendants([start]) for t in op.outputs for k in index.get(t.ref(), ())}
    return tuple(sorted(found))


def _statistic_in_body(body: Analysis, crossed: CrossOp, returned: bool):
    """Why a cross-example op of a body is a statistic there, or None: read back into the
    examples inside the body (a body may read no variable: any tensor carrying the batch counts),
    or (`returned`: a call, which graphsync inlines to see where it goes) handed out through the
    body's outputs. An If's branch or a loop body that only returns such a value makes the op a
    cross-example op whose verdict the graph around it decides (`CrossOp.returned`): a statistic
    when read back there (`mean = tf.cond(training, batch mean, moving mean)`, then `x - mean`),
    terminal otherwise (a metric's, tf_keras' If)."""
    if crossed.how is Crossing.BODY:
        name, inner, why = crossed.inner
        return f"calls {name}, whose {inner.name} ({inner.type}) {why}"
    judgement = judge(body, crossed)
    # a body holds no gradients: whether its value is read back is decided below
    if judgement.verdict not in (Verdict.TERMINAL, Verdict.UNDECIDED):
        return judgement.why
    how = judgement.does
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
