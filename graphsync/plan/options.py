"""RewriteOptions: the six options of a rewrite (towers, device, strategy, group_size,
process_group, recompute) as one frozen value, validated when it is built.

Why one value: the options used to be spelled out in every signature from the entry points down
to the planner and the exchange, and each layer checked what it needed, with its own message, at
its own moment (an unknown strategy was found only after the whole analysis). Here every rule
about the options alone, and about their combinations, is checked once, with its one message,
before anything looks at the graph. What needs the graph as well (group_size dividing the towers,
one device per tower for allreduce) is checked by the planner (graphsync/plan/planner.py).

Built at the entry points: rewrite_towers and plan_towers (graphsync/rewrite.py), graphsync.io's
rewrite_file, `graphsync inspect`, and `graphsync run` / autosync (graphsync/autosync/decide.py,
functions.py); everything below them takes `options: RewriteOptions`.

Nothing here imports TensorFlow: autosync validates its options before the script imports it.
"""
from __future__ import annotations

import dataclasses
import enum
import re

from graphsync.errors import GraphsyncError


class Strategy(enum.Enum):
    """Where the towers' statistics are combined (graphsync/exchange/)."""

    GATHER = "gather"         # merged on one device (`device`)
    ALLREDUCE = "allreduce"   # summed by collectives on the towers' own devices (or queues on a ps)

    @classmethod
    def of(cls, strategy) -> Strategy:
        """rewrite_towers' `strategy` ('gather' or 'allreduce') as a Strategy."""
        if isinstance(strategy, cls):
            return strategy
        for member in cls:
            if strategy == member.value:
                return member
        choices = " or ".join(repr(member.value) for member in cls)
        raise GraphsyncError(f"unknown strategy {strategy!r}: use {choices}")


class Recompute(enum.Enum):
    """What the backward reads recomputed instead of the forward's tensors. The values are the
    report's (RewriteReport.recompute); OFF is false."""

    OFF = ""
    LAYERS = "layers"       # each layer's normalized output and what follows it (splice/recompute.py)
    SEGMENTS = "segments"   # whole forward segments from checkpoints (splice/segments.py)

    def __bool__(self) -> bool:
        return self is not Recompute.OFF

    @classmethod
    def of(cls, recompute) -> Recompute:
        """rewrite_towers' `recompute` (False or None, True, "segments") as a Recompute."""
        if isinstance(recompute, cls):
            return recompute
        if recompute is None or recompute is False:
            return cls.OFF
        if recompute is True:
            return cls.LAYERS
        if recompute == "segments":
            return cls.SEGMENTS
        raise GraphsyncError(f"recompute={recompute!r}: use True (each layer's output) or 'segments' "
                             "(whole forward segments)")


@dataclasses.dataclass(frozen=True)
class RewriteOptions:
    """What the user asked of a rewrite, validated (see rewrite_towers for each option's meaning).

    towers:        None (discover them), a regular expression, or a tuple of scope prefixes
    device:        where strategy GATHER combines the statistics (None: CPU 0 of tower 0's host)
    strategy:      Strategy
    group_size:    synchronize within consecutive groups of this many towers (None: all)
    process_group: graphsync.ProcessGroup of a between-graph job, or None
    recompute:     Recompute
    """

    towers: str | re.Pattern | tuple | None = None
    device: str | None = None
    strategy: Strategy = Strategy.GATHER
    group_size: int | None = None
    process_group: object = None
    recompute: Recompute = Recompute.OFF

    def __post_init__(self):
        """The rules about combinations of options, each with its one message."""
        if not isinstance(self.strategy, Strategy) or not isinstance(self.recompute, Recompute):
            raise TypeError("RewriteOptions takes a Strategy and a Recompute: RewriteOptions.of converts the API's "
                            "strings")
        if self.towers is not None and not isinstance(self.towers, (str, re.Pattern, tuple)):
            object.__setattr__(self, "towers", tuple(self.towers))   # a list: frozen as the value is
        if self.process_group is not None and self.strategy is not Strategy.ALLREDUCE:
            raise GraphsyncError("between-graph replication (a process group) needs strategy='allreduce'")

    @classmethod
    def of(cls, *, towers=None, device: str | None = None, strategy="gather", group_size: int | None = None,
           process_group=None, recompute=False) -> RewriteOptions:
        """The options from rewrite_towers' keyword arguments (strategy and recompute as the API
        spells them); raises GraphsyncError, in the API's words, for a bad one."""
        recompute = Recompute.of(recompute)   # first, as before the strategy was checked here
        return cls(towers, device, strategy=Strategy.of(strategy), group_size=group_size,
                   process_group=process_group, recompute=recompute)

    def across_processes(self, process_group) -> RewriteOptions:
        """These options for one worker of a between-graph job: its towers synchronize with every
        worker's through cross-process collectives, which strategy ALLREDUCE implies."""
        return dataclasses.replace(self, strategy=Strategy.ALLREDUCE, process_group=process_group)
