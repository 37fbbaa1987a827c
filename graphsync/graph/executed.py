"""What one Session.run executes: the ancestors of what it runs through data and control edges,
not past a fed tensor (a fed tensor's producer does not run for it). One walk for verify's
discovery (which inputs the fetches need) and its side-effect check (which stateful ops a run
executes)."""
from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from graphsync.graph import walks


def executed(ops: Iterable[tf.Operation], fed: set) -> set:
    """`ops` and every op they depend on through data and control edges, not past a tensor whose
    name is in `fed`."""
    return set(walks.reach(ops, lambda op: [t.op for t in op.inputs if t.name not in fed] + list(op.control_inputs)))
