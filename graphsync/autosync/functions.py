"""TF2: the training steps `tf.function` traces under a distribution strategy, synchronized as
they are traced.

MirroredStrategy traces every replica of a step into one FuncGraph: replica 0 unscoped, the others
under `replica_1/`… on their own devices, each with its own copy of the variables, and the tape's
gradients already built. That is the layout rewrite_towers knows (towers found by their scopes,
gradients built before the rewrite), so the FuncGraph is rewritten like a TF1 graph, in place,
after the trace and before TensorFlow turns it into a function: at every trace and retrace (a new
input shape, a partial last batch), whoever traces it (tf_keras' and Keras 3's `fit` and
`train_on_batch`, a custom loop's `strategy.run`).

Every trace outside one replica is looked at: Keras 3's step is a tf.function its `fit` loop
calls, with `strategy.run` inside. What one replica traces (inside `strategy.run`: a tf.function
the replica calls, a branch on its training flag) is part of the step being traced around it, which
the rewrite inlines. Only in TF2 mode: a TF1 graph's functions are rewritten with the graph, at its
first session.

MultiWorkerMirroredStrategy traces each worker's replicas in its own process: they are synchronized
with every other worker's through cross-process collectives (strategy "allreduce" with the
worker's ProcessGroup, ranked as TF_CONFIG ranks the training tasks), in the collective runtime the
strategy itself configured.

What cannot be synchronized is said before the first step, like a graph's refusal: a strategy
graphsync does not support, a step with one replica, a step it cannot rewrite; and a step whose
batch norms the model already synchronizes (Keras' `synchronized=True`) is left alone, said.
Functions that train nothing (evaluation, prediction) have no batch statistics and are left alone;
nor is a function without a gradient a step: what a strategy traces to save a SavedModel (one
layer's call, in training mode) finds no replicas and is left alone, not refused.
"""
from __future__ import annotations

# tf.distribute strategies whose replicas graphsync cannot see in one traced step yet: what each
# would train, said instead of a silent per-replica step
UNSUPPORTED = {
    "TPUStrategy": "replicas compiled for TPU cores",
    "TPUStrategyV2": "replicas compiled for TPU cores",
    "ParameterServerStrategyV2": "steps scheduled on each worker alone",
    "ParameterServerStrategy": "steps scheduled on each worker alone",
}
# one process per worker, each tracing its own replicas: synchronized with every other worker's
# through cross-process collectives, as between-graph TF1 workers are (graphsync/exchange/allreduce.py)
MULTI_WORKER = ("MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy")


def traced(decisions, graph, strategy) -> None:
    """Decides one FuncGraph just traced outside any one replica (`strategy`: the tf.distribute
    strategy in scope when the trace began or ended, or whose `run` made its replicas; None for
    the default), then guards the decision: a training step whose batch norms run in several
    replicas is rewritten or said, whichever way the decision went."""
    from graphsync import match
    from graphsync.graph import tf_private
    starts = match.starting_types()
    if starts is not None and not any(op.type in starts for op in graph.get_operations()):
        return   # no op a batch norm could start from: nothing to say
    label = f"tf.function {graph.name}"
    with tf_private.tensors_compared_as_nodes():
        trains = _trains_batch_norm(graph)
    told = decisions.told
    _decide(decisions, graph, strategy, label, trains)
    if trains and decisions.told == told and not decisions.synchronized(graph):
        _guard(decisions, graph, strategy, label)


def _guard(decisions, graph, strategy, label: str) -> None:
    """The line below the decision: a training step (a gradient in it) whose batch statistics run
    in more than one replica, here or on other workers, that was neither rewritten nor said."""
    devices = _devices_normalizing(graph)
    replicas = strategy.num_replicas_in_sync if strategy is not None and devices else devices
    message = (f"{label} trains batch norms in {replicas} replicas that graphsync leaves unsynchronized: each "
               "replica would normalize with its own examples")
    if replicas > 1 and _steps(graph):
        decisions.once(message, lambda line: decisions.failed(graph, line))


def _decide(decisions, graph, strategy, label: str, trains: bool) -> None:
    from graphsync.graph import tf_private
    kind = type(strategy).__name__ if strategy is not None else None
    if kind in UNSUPPORTED and trains:
        decisions.once(f"{label} runs under {kind} ({UNSUPPORTED[kind]}): its batch norms would use each replica's "
                       "statistics; graphsync synchronizes MirroredStrategy steps",
                       lambda line: decisions.failed(graph, line))
        return
    if strategy is not None and strategy.num_replicas_in_sync == 1 and trains:
        decisions.once(f"{label}: one replica under {kind}: its batch norms already see the whole batch", decisions.say)
        return
    if not trains and (strategy is not None or _on_several_devices(graph)):
        merged = _merged_by_the_model(graph)
        if merged:
            decisions.once(f"{label}: left alone: its {merged} batch statistics are merged across replicas by the "
                           "model itself (Keras' synchronized=True)", decisions.say)
            return
    from graphsync.plan.options import RewriteOptions
    # the options given, validated at install (autosync/patching.py): a TF1 server's TF_CONFIG logic
    # (autosync/worker.py options_for) is not a trace's
    options = RewriteOptions.of(**decisions.options)
    group = _process_group(strategy) if kind in MULTI_WORKER else None
    if group is not None:
        options = options.across_processes(group)
    with tf_private.tensors_compared_as_nodes():
        decisions.decide_function(graph, label, replicated=strategy is not None and trains and _steps(graph),
                                  options=options)


def _steps(graph) -> bool:
    """Whether the function holds a training step: a gradient (a tape's, Keras' step's). What a
    strategy traces for saving or serving (a SavedModel's layer-call functions, `predict`) holds
    one copy of the model and no gradient: with no replicas in it, nothing to synchronize and
    nothing to refuse (it is left alone, said only with --verbose)."""
    from graphsync.graph.backward import has_backward
    return has_backward(graph)


def _process_group(strategy):
    """The ProcessGroup of this worker among a MultiWorkerMirroredStrategy's training processes
    (chief first, then the workers, as TF_CONFIG ranks them), or None for a single worker."""
    from graphsync.between_graph.process_group import ProcessGroup
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    chiefs, workers = len(cluster.get("chief", ())), len(cluster.get("worker", ()))
    if chiefs + workers < 2:
        return None
    rank = 0 if resolver.task_type == "chief" else chiefs + int(resolver.task_id)
    return ProcessGroup(chiefs + workers, rank)


def _devices_normalizing(graph) -> int:
    """On how many devices the function computes batch statistics that nothing has synchronized
    yet (0: none)."""
    from graphsync import match
    from graphsync.graph import tf_private
    try:
        with tf_private.tensors_compared_as_nodes():
            return len({c.op.device for c in match.candidates(graph) if not c.skip_reason})
    except Exception:  # noqa: BLE001 - as _trains_batch_norm
        return 0


def _trains_batch_norm(graph) -> bool:
    """Whether the step itself computes batch statistics (a batch norm in training mode, moments),
    not only functions it calls (a step that calls another step traced and rewritten before it)."""
    from graphsync import match
    try:
        return bool(match.candidates(graph))
    except Exception:  # noqa: BLE001 - a graph the matchers cannot read is said by the rewrite
        return True


def _merged_by_the_model(graph) -> int:
    """How many batch statistics the step already merges across replicas itself (an all-reduce
    of local sums: Keras' synchronized batch norm): those the rule finds merged, and those whose
    value reaches a cross-replica sum within a few ops: a collective all-reduce (Keras 3 packs its
    sums into one), or a sum of the replicas' values on one device (MirroredStrategy's reduction
    to one device, which tf.keras' all-reduce takes on TensorFlow 2.12's CPUs)."""
    from graphsync import batch_axis
    from graphsync.graph import tf_private
    with tf_private.tensors_compared_as_nodes():
        analysis = batch_axis.analyze(graph)
        return sum(batch_axis.judge(analysis, crossed).verdict is batch_axis.Verdict.SYNCHRONIZED
                   or _all_reduced(op)
                   for op, crossed in analysis.cross.items())


def _all_reduced(op, depth: int = 6, summed_within: int = 3) -> bool:
    from graphsync.graph.op_types import COLLECTIVE_TYPES
    frontier, seen = [op], {op}
    for hop in range(depth):
        frontier = [c for o in frontier for t in o.outputs for c in t.consumers() if c not in seen]
        if any(c.type in COLLECTIVE_TYPES or (hop < summed_within and _sums_replicas(c)) for c in frontier):
            return True
        seen.update(frontier)
    return False


def _sums_replicas(op) -> bool:
    """Whether `op` adds up the replicas' copies of one value: an AddN of ops of one type, each on
    its own device."""
    inputs = [t.op for t in op.inputs]
    return (op.type == "AddN" and len({i.type for i in inputs}) == 1
            and len({i.device for i in inputs}) == len(inputs) > 1)


def _on_several_devices(graph) -> bool:
    """Whether the step runs on several devices (Keras 3 traces its step outside the strategy's
    scope: this is how its replicas show)."""
    return len({op.device for op in graph.get_operations() if op.device}) > 1
