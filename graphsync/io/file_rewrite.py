"""A saved graph rewritten end to end: load → rewrite_towers → save → TensorBoard log, what
`graphsync rewrite` runs.
"""
from __future__ import annotations

import warnings

from graphsync.errors import GraphsyncError
from graphsync.io.errors import PathError
from graphsync.io.files import check_paths, load, output_format, save
from graphsync.io.tensorboard import write_event_file
from graphsync.plan.options import RewriteOptions


def require_towers(report, path: str) -> None:
    """A file rewrite needs at least two towers (or one per worker process of a process group);
    raises GraphsyncError naming what was found."""
    if len(report.towers) >= 2 or (report.process_group and report.layers):
        return
    if not report.towers:
        if not report.skipped:
            raise GraphsyncError(f"{path} has no batch norm graphsync can synchronize")
        raise GraphsyncError(f"found no towers in {path} (expected name scopes like tower_0/, tower_1/): "
                             "name them with --towers REGEX")
    raise GraphsyncError(f"{path} has a single tower ({report.towers[0]}): nothing to synchronize across; "
                         "if the towers are named differently, name them with --towers REGEX")


def rewrite_file(input_path: str, output_path: str | None, *, towers=None, device: str | None = None,
                 strategy: str = "gather", group_size: int | None = None, recompute: bool = False, tags=None,
                 fmt: str | None = None, logdir: str | None = None, dry_run: bool = False,
                 stage=lambda name: None, process_group=None):
    """load → rewrite_towers → save (unless dry_run) → TensorBoard log; returns (report, details).

    `stage(name)` is called as each step starts ("loading", "rewriting", "saving", "logging").
    The saved-file entry point: the rewrite's options (as rewrite_towers takes them) are built
    and validated here, once, before the file is read.
    """
    from graphsync.rewrite import rewrite_with  # noqa: PLC0415 (keeps `import graphsync.io` light)

    options = RewriteOptions.of(towers=towers, device=device, strategy=strategy, group_size=group_size,
                                process_group=process_group, recompute=recompute)
    if output_path is not None:
        check_paths(input_path, output_path)
    elif not dry_run:
        raise PathError("no output path: pass one, or dry_run=True")
    stage("loading")
    loaded = load(input_path, tags)
    if output_path is not None:
        fmt = output_format(loaded, output_path, fmt)
    ops_before = len(loaded.graph.get_operations())
    stage("rewriting")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        report = rewrite_with(loaded.graph, options)
    require_towers(report, input_path)
    details = {"input": input_path, "input_format": loaded.format, "output": output_path,
               "output_format": fmt, "dry_run": dry_run, "ops_before": ops_before,
               "ops_after": len(loaded.graph.get_operations()), "event_file": None}
    if not dry_run:
        stage("saving")
        save(loaded, output_path, fmt)
        if logdir:
            stage("logging")
            details["event_file"] = write_event_file(loaded.graph, logdir, report.layers)
    return report, details
