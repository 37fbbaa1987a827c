"""The two test tiers (CONTRIBUTING.md, "Two tiers"): the fast tier, which the README's test command
runs, covers every capability once; the full tier (`--full`, CI) holds the sweeps and matrices.

A parametrized test keeps a few of its cases in the fast tier and marks the rest full:

    @pytest.mark.parametrize("model,sizes", tiers.cases(CASES, IDS, fast={"raw-v3-3x5x8", ...}))

`kernels` marks the cases whose kernels differ without oneDNN (channels-first, float16, bfloat16):
CI's pass without oneDNN runs them beside the fast tier. `plumbing` marks what computes nothing a
kernel could change (processes, signals, the command line, files, docs, the lines said): that pass
leaves it out. `environment` marks what the installed packages decide (what pip would change, the
TensorFlow found): CI runs it on every TensorFlow it tests.
"""
import pytest

full = pytest.mark.full
kernels = pytest.mark.kernels
plumbing = pytest.mark.plumbing
environment = pytest.mark.environment


def cases(values, ids, fast, kernel_ids=()):
    """pytest.param of each case (a tuple of arguments, or one argument), named by `ids`; the
    cases whose id is not in `fast` are marked full, those in `kernel_ids` also kernels."""
    unknown = (set(fast) | set(kernel_ids)) - set(ids)
    assert not unknown, f"no such case: {sorted(unknown)}"   # a renamed case must not leave the fast tier
    params = []
    for value, id_ in zip(values, ids):
        marks = ([] if id_ in fast else [full]) + ([kernels] if id_ in kernel_ids else [])
        args = value if isinstance(value, tuple) else (value,)
        params.append(pytest.param(*args, id=id_, marks=marks))
    return params
