"""How an exchange combines the towers' values elementwise: their sum, or an extremum."""
from __future__ import annotations

import enum


class Merge(enum.StrEnum):
    """A sum (the moments, the gradients, a Sum or Mean reduction), or the extremum of a Max or
    Min reduction, whose op type it is named after (`Merge(op.type)`). Its value is what
    CollectiveReduceV2's merge_op attribute spells."""

    ADD = "Add"
    MAX = "Max"
    MIN = "Min"
