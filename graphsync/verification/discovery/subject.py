"""Everything verify feeds and fetches in one graph, found by the other modules of this package."""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from graphsync.graph import shapes
from graphsync.errors import GraphsyncError
from graphsync.towers.scopes import Tower
from graphsync.verification.discovery import (batch_norm, copies as tower_copies, entries, example_sources as sources,
                                              inputs, layer_statistics, loss as losses, names, pairing, state,
                                              statistics, synthetic, tower_scopes)
from graphsync.verification.discovery.example_sources import SourceKind
from graphsync.verification.discovery.inputs import Feed, Input, given as given_input
from graphsync.verification.discovery.state import Variable


@dataclasses.dataclass
class Subject:
    """A graph and everything verify runs in it (names, so the same names can be found in the
    un-rewritten graph)."""

    graph: tf.Graph
    towers: list[Tower]
    inputs: list[Input]
    loss: list[str]
    loss_source: str
    gradients: list[str]
    updates: list[str]             # writes of batch statistics: judged
    batch_norm_ops: list[str]
    layers: list[str]
    variables: list[Variable]
    notes: list[str]
    other_writes: list[str] = dataclasses.field(default_factory=list)   # compared, not judged
    copies: tower_copies.Copies = dataclasses.field(default_factory=lambda: tower_copies.Copies({}, ""))
    layer_statistics: list = dataclasses.field(default_factory=list)   # per layer, judged one by one

    @property
    def fetched(self) -> list[list[str]]:
        """What every run fetches, in run.Fetched's order: losses, gradients, judged updates, other
        writes, every layer's statistics (the side-effect check walks from exactly these)."""
        return [self.loss, self.gradients, self.updates, self.other_writes,
                [name for layer in self.layer_statistics for name in layer.tensors]]


def discover(graph: tf.Graph, *, towers=None, inputs=None, loss=None, num_classes=None, feeds=None,
             losses_collection=None) -> Subject:
    """Finds towers, inputs, loss, gradients, updates and batch-norm ops; raises GraphsyncError with
    the option to pass when something cannot be found."""
    notes: list[str] = []
    found_towers = tower_scopes.find(graph, towers)
    loss_options = losses.options(graph, found_towers, loss, losses_collection)
    loss_tensors, loss_source = next(iter(loss_options), ([], ""))
    gradients = state.gradients(graph, notes)
    writes = state.writes(graph)
    by_user = [_named(graph, found_towers, name, num_classes) for name in (inputs or [])]
    by_user += [given_input(names.tensor(graph, name), value) for name, value in (feeds or {}).items()]
    fed_by_user = {t for item in by_user for t in item.tensors}
    flags = []
    for flag in batch_norm.training_flags(graph, found_towers):
        if flag.name not in fed_by_user:
            flags.append(flag.name)
            by_user.append(given_input(flag, True))
            by_user[-1].origin = "the towers' training flag: fed True so that their batch norms train"
            notes.append(f"fed {flag.name} = True, the flag under which the towers' batch norms train "
                         f"(--feed {flag.name}=VALUE overrides)")
    user_tensors = {t for item in by_user for t in item.tensors}
    fetches = [graph.get_tensor_by_name(n) for n in loss_tensors + gradients]
    found_notes: list[str] = []
    found_inputs = by_user + _found(graph, found_towers, fetches, user_tensors, num_classes, found_notes)
    if not (fetches and any(i.kind in (Feed.PER_TOWER, Feed.SHARED) for i in found_inputs)):
        # no optimizer, and a first loss no example reaches (or none): what the other losses and the writes read
        fetches = [graph.get_tensor_by_name(n) for names_, _ in loss_options[1:] for n in names_] + \
            [w.inputs[1] for w in writes]
        found_notes = []
        found_inputs = by_user + _found(graph, found_towers, fetches, user_tensors, num_classes, found_notes)
    notes.extend(found_notes)
    if not any(i.kind in (Feed.PER_TOWER, Feed.SHARED) for i in found_inputs):
        raise GraphsyncError("found no batch input to feed (no placeholder, input pipeline or random input "
                             "read by the towers): name the tensors that carry each tower's examples with "
                             "--input NAME")
    fed = {t for i in found_inputs for t in i.tensors} - set(flags)   # what the examples reach, not the flag
    downstream = state.downstream(graph, fed)
    loss_tensors, loss_source = _depending_loss(graph, loss_options, downstream, bool(loss), notes)
    judged, others = statistics.split(graph, [w for w in writes if w.inputs[1].op in downstream], fed)
    updates = [w.inputs[1].name for w in judged]
    if not (loss_tensors or gradients or updates):
        raise GraphsyncError("nothing to compare: found no loss, no optimizer and no moving statistics "
                             "that depend on the inputs; name the loss with --loss NAME")
    if not loss_options:
        notes.append("no loss found (no `losses` collection, no scalar named loss): comparing the gradients "
                     "and moving statistics; name it with --loss NAME to compare it too")
    if others:
        notes.append(f"{len(others)} writes that depend on the examples but on no batch statistic (moving "
                     f"summaries of one tower's loss or error rates, e.g. {_written(others[0])}) are compared "
                     "apart and not judged: they change when that tower's examples do")
    variables = state.variables(graph)
    copies = tower_copies.find(graph, found_towers, variables, tower_scopes.membership(graph, found_towers))
    layers = layer_statistics.find(graph, found_towers, towers, updates, notes)
    return Subject(graph, found_towers, found_inputs, loss_tensors, loss_source, gradients, updates,
                   batch_norm.batch_norm_ops(graph, found_towers),
                   batch_norm.synchronized_layers(graph, found_towers), variables, notes,
                   [w.inputs[1].name for w in others], copies, layers)


def _written(write: tf.Operation) -> str:
    """The variable a write assigns, for the report (else the write itself)."""
    op = write.inputs[0].op
    while op.type in tower_copies.READS and op.inputs:
        op = op.inputs[0].op
    return op.name if op.type in state.VARIABLE_TYPES else write.name


def _depending_loss(graph, options, downstream: set, named: bool, notes: list) -> tuple[list[str], str]:
    """The first of the loss `options` whose tensors all depend on the examples (--loss as given)."""
    if named or not options:
        return next(iter(options), ([], ""))
    for index, (tensor_names, source) in enumerate(options):
        if all(graph.get_tensor_by_name(n).op in downstream for n in tensor_names):
            if index:
                skipped, how = options[0]
                notes.append(f"loss: {names.tower_pattern(skipped)} ({how}) does not depend on the examples; "
                             f"compared {names.tower_pattern(tensor_names)} ({source}) instead")
            return tensor_names, source
    skipped, how = options[0]
    notes.append(f"loss: {names.tower_pattern(skipped)} ({how}) does not depend on the examples: not compared")
    return [], ""


def _named(graph, towers, name, num_classes) -> Input:
    """--input NAME: per tower when NAME exists in every tower (given relative to the tower or as
    one tower's tensor), else one tensor holding the whole batch."""
    in_towers = names.per_tower(graph, towers, name)
    if in_towers:
        return inputs.batch(graph, Feed.PER_TOWER, in_towers, num_classes, origin="--input")
    return inputs.batch(graph, Feed.SHARED, [names.tensor(graph, name).name], num_classes, origin="--input")


def _found(graph, towers, fetches, user_tensors, num_classes, notes) -> list[Input]:
    """The inputs the fetches depend on that the user did not name: per-tower inputs first, then
    tensors read as a whole batch, then fixed values for placeholders without a batch axis."""
    needed = sources.needed(fetches, user_tensors)
    tower_of_op = tower_scopes.membership(graph, towers)
    found_entries, whole, noise = [], [], []
    for source in sources.find(needed):
        tensor = source.tensor
        where = entries.find(tensor, needed, tower_of_op) if tensor.shape.rank != 0 else entries.GLOBAL
        if where == entries.GLOBAL:
            whole.append(source)
            continue
        for tower, tensors in where.items():
            for entry in tensors:
                read = entry if source.kind is SourceKind.PLACEHOLDER else synthetic.read_tensor(entry, needed)
                if source.kind is SourceKind.RANDOM and synthetic.is_noise(tensor, read, needed):
                    # fed as drawn, so only where the tower reads the random op's output itself
                    noise.append(pairing.Entry(tower, tensor if entry is tensor else entry,
                                               "noise in each tower (dropout?), drawn as the graph draws it and "
                                               "moved with its examples", tensor))
                    continue
                how = f"{source.what} in each tower" if entry is tensor else \
                    f"{entry.op.type} of {tensor.name} ({source.what})"
                if read is not entry:
                    how += f", fed after its preprocessing ({read.op.type})"
                found_entries.append(pairing.Entry(tower, read, how, tensor))
    found = []
    for group in sorted(pairing.pair(found_entries, towers, needed, tower_of_op), key=_images_first):
        tensor_names = [e.tensor.name for e in group]
        found.append(inputs.batch(graph, Feed.PER_TOWER, tensor_names, num_classes, origin=group[0].origin))
    for source in whole:
        tensor = source.tensor
        if source.kind is not SourceKind.PLACEHOLDER:
            if tensor.shape.rank:
                found.append(inputs.batch(graph, Feed.SHARED, [tensor.name], num_classes,
                                          origin=f"{source.what}, read as a whole"))
            continue
        if tensor.shape.rank and shapes.dim(tensor.shape, 0) is None:
            found.append(inputs.batch(graph, Feed.SHARED, [tensor.name], num_classes,
                                      origin=f"{source.what}, read as a whole"))
        else:
            found.append(inputs.fixed(tensor))
    found += _noise(graph, towers, noise, found, needed, tower_of_op, notes)
    return found


def _noise(graph, towers, noise: list, found: list, needed, tower_of_op, notes) -> list[Input]:
    """Dropout masks and noise, fed from their own distribution and exchanged with their examples
    (a mask that stayed in place while the examples moved would change every figure). Noise that
    cannot be fed that way (shape unknown, not per example) draws new values in every run: said."""
    sizes = {tuple(i.static_batches) for i in found if i.kind is Feed.PER_TOWER and any(i.static_batches)}
    fed, left = [], []
    feedable = [e for e in noise if e.tensor is e.source and synthetic.distribution(e.tensor)
                and e.tensor.shape.rank and e.tensor.shape[1:].is_fully_defined()]
    left += [e.tensor.name for e in noise if e not in feedable]
    try:
        groups = pairing.pair(feedable, towers, needed, tower_of_op)
    except GraphsyncError:
        groups, left = [], left + [e.tensor.name for e in feedable]
    for group in groups:
        batches = tuple(shapes.dim(e.tensor.shape, 0) for e in group)
        per_example = batches in sizes if sizes else all(b is None or b > 1 for b in batches)
        if all(b is None for b in batches) or per_example:
            item = inputs.batch(graph, Feed.PER_TOWER, [e.tensor.name for e in group], None, origin=group[0].origin)
            item.draw = synthetic.distribution(group[0].tensor)
            fed.append(item)
        else:
            left += [e.tensor.name for e in group]
    if left:
        notes.append(f"{len(set(left))} random tensors are no input and cannot be fed per example (dropout or noise, "
                     f"e.g. {sorted(left)[0]}): they draw new values in every run")
    return fed


def _images_first(group) -> tuple:
    """Float inputs (images) before integer ones (labels), then by name."""
    tensor = group[0].tensor
    return not tensor.dtype.is_floating, tensor.name
