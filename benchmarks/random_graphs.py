"""The random-graph property test's long mode (tests/random_towers.py): thousands of seeds, each a net
drawn from the ways real code writes normalization, built as 2–4 uneven towers, rewritten and run
once against one device on the concatenated batch. Each seed ends one of four ways: equal to one
device, refused in one line, different from one device, or crashed (anything but GraphsyncError).
The last two are bugs: each seed found becomes a named case in tests/test_random_graphs.py.

    python benchmarks/random_graphs.py --seeds 600 --jobs 2       # ~2.9 s per seed on 2 jobs (29 min)
    python benchmarks/random_graphs.py --first 500 --seeds 100    # another range
    benchmarks/snapshot.sh HEAD /tmp/gs && GRAPHSYNC_SRC=/tmp/gs python benchmarks/random_graphs.py --seeds 600
                                                                  # a recorded run: one commit's graphsync

Prints every refusal, difference and crash with its seed, then the counts and the refusals by
cause (Markdown).
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import multiprocessing
import os
import re
import sys
import time

import _common

sys.path.insert(0, os.path.join(_common.REPO, "tests"))


def _check(seed: int) -> tuple:
    """(seed, outcome kind, text) in a worker process."""
    with _common.quiet_stderr():
        import random_towers as rt
        import warnings
        warnings.simplefilter("ignore")
    try:
        outcome = rt.check(seed)
    except Exception as exc:  # noqa: BLE001 - a crash is a finding, recorded with its seed
        first = str(exc).splitlines()[0] if str(exc) else ""
        return seed, "crashed", f"{rt.spec(seed)}\n  {type(exc).__name__}: {first}"
    kind = "refused" if outcome.refused else "equal" if outcome.ok else "different"
    return seed, kind, str(outcome)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    seeds = range(args.first, args.first + args.seeds)
    counts, findings, began = collections.Counter(), [], time.monotonic()
    # spawned workers: a forked one inherits TensorFlow's threads (and, recycled, hung the pool)
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for seed, kind, text in pool.map(_check, seeds, chunksize=4):
            counts[kind] += 1
            if kind != "equal":
                findings.append((seed, kind, text))
                print(f"{kind}: {text}", flush=True)
    wall = time.monotonic() - began
    print("\n" + _common.header("Random graphs: rewritten equals one device, or refused in one line"))
    print("| seeds | equal one device | refused in one line | different | crashed | wall |")
    print("|---|---|---|---|---|---|")
    print(f"| {seeds.start}–{seeds.stop - 1} | {counts['equal']} | {counts['refused']} | {counts['different']} | "
          f"{counts['crashed']} | {wall:.0f} s ({args.jobs} jobs) |")
    causes = collections.defaultdict(list)
    for seed, kind, text in findings:
        if kind == "refused":
            causes[_cause(text.split("\n  refused: ", 1)[-1])].append(seed)
    if causes:
        print("\n| refused because | seeds | which |\n|---|---|---|")
        for cause, found in sorted(causes.items(), key=lambda item: (-len(item[1]), item[0])):
            print(f"| {cause} | {len(found)} | {', '.join(map(str, sorted(found)))} |")
    return 1 if counts["different"] or counts["crashed"] else 0


def _cause(refusal: str) -> str:
    """What a refusal says, without the op and tower it names: the op type the batch-axis table has
    no rule for, or the message past its first op's name."""
    missing = re.search(r"no rule for op type (\w+)", refusal)
    if missing:
        return f"no batch-axis rule for op type `{missing.group(1)}`"
    return re.sub(r"tower_\d+/\S+", "…", refusal.split(" (and ", 1)[0])[:160]


if __name__ == "__main__":
    sys.exit(main())
