"""`graphsync rewrite`: a saved graph in, its synchronized copy out (see graphsync.io.rewrite_file)."""
from __future__ import annotations

import json
import os
import sys
import time

import click

from cli import shell


@click.command(epilog="""\b
Examples:
  graphsync rewrite train.meta -o train_sync.meta
  graphsync rewrite train.meta -o train_sync.meta --logdir /tmp/tb   # then: tensorboard --logdir /tmp/tb
  graphsync rewrite train.meta --dry-run --json | jq .layers
  graphsync rewrite graph.pbtxt -o graph_sync.pb     # text in, binary out
  graphsync rewrite export_dir --tags train -o export_dir_sync
  graphsync rewrite worker.meta --process-group 2:1 -o worker1_sync.meta   # between-graph: task 1 of 2
  graphsync rewrite worker.meta --process-group TF_CONFIG -o worker_sync.meta

\b
Then train as before, from the new file:
  saver = tf.compat.v1.train.import_meta_graph("train_sync.meta")
  saver.restore(sess, checkpoint)    # checkpoints work both ways: variable names are unchanged
  sess.run(tf.compat.v1.get_collection("train_op"), feed_dict)""")
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=True))
@click.option("-o", "--output", "output_path", metavar="OUTPUT", type=click.Path(dir_okay=True),
              help="Where to write the rewritten graph (a new path; written atomically).")
@shell.towers_option
@shell.device_option
@shell.strategy_option
@shell.group_size_option
@shell.recompute_option
@click.option("--process-group", metavar="TASKS:INDEX",
              help="Between-graph replication: the graph is worker INDEX of TASKS worker processes (or "
                   "TF_CONFIG: read both from that variable); its towers synchronize with every worker's "
                   "through cross-process collectives (implies --strategy allreduce; each server needs "
                   "experimental.collective_group_leader).")
@shell.peer_timeout_option
@shell.tags_option
@click.option("--format", "fmt", type=click.Choice(["graphdef", "graphdef-text", "metagraph", "metagraph-text",
                                                    "savedmodel"]),
              help="Output format (default: the input's, unless OUTPUT's extension says otherwise).")
@click.option("--logdir", metavar="DIR", type=click.Path(file_okay=False),
              help="Also write the rewritten graph as a TensorBoard event file in DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("-n", "--dry-run", is_flag=True, help="Rewrite in memory and report; write no file.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@shell.verbose_option
def rewrite(input_path, output_path, towers, device, strategy, group_size, recompute, process_group, peer_timeout, tags, fmt,
            logdir, as_json, dry_run, quiet, verbose):
    """Synchronize the batch norms of the towers in INPUT and write the result to OUTPUT.

    INPUT is a binary or text GraphDef or MetaGraphDef, or a SavedModel directory; the format is
    read from the content. OUTPUT gets the same format unless its name says otherwise (.meta,
    .meta.txt: MetaGraphDef; .pb, .pbtxt: binary or text of the input's kind). Collections
    (train_op, UPDATE_OPS, variables, savers, summaries), signatures, the function library and
    device strings are kept.
    """
    if quiet and verbose:
        raise click.UsageError("choose -q or -v, not both")
    if output_path is None and not dry_run:
        raise click.UsageError("missing option '-o' / '--output' (or pass --dry-run)")
    if process_group is not None:
        strategy = _allreduce_for_process_group(strategy)
    shell.precheck_paths(input_path, output_path)
    graphsync = shell.library(verbose)
    shell.check_device(device)
    group = _process_group(process_group, peer_timeout) if process_group is not None else None
    stages = ["loading", "rewriting"] + ([] if dry_run else ["saving"] + (["logging"] if logdir else []))
    started, timings = time.perf_counter(), {}

    def stage(name):
        timings[name] = time.perf_counter()
        progress.stage(name)

    with shell.library_errors(), shell.shown_warnings(quiet, verbose), \
            shell.Progress(stages, enabled=sys.stderr.isatty() and not quiet) as progress:
        report, details = graphsync.io.rewrite_file(input_path, output_path, towers=towers, device=device,
                                                     strategy=strategy, group_size=group_size,
                                                     recompute=recompute, tags=tags, fmt=fmt, logdir=logdir, dry_run=dry_run,
                                                     stage=stage, process_group=group)
    elapsed = time.perf_counter() - started
    if as_json:
        click.echo(json.dumps({**report.to_dict(), **details, "seconds": round(elapsed, 3)}, indent=2))
        return
    if quiet:
        return
    click.echo(str(report) if verbose else report.summary)
    if dry_run:
        click.echo(f"dry run: would write {output_path or 'nothing'} "
                   f"({details['ops_before']} → {details['ops_after']} ops)")
    else:
        click.echo(f"wrote {output_path} ({details['output_format']}, "
                   f"{details['ops_before']} → {details['ops_after']} ops)")
        if details["event_file"]:
            click.echo(f"wrote {details['event_file']} (tensorboard --logdir {logdir})")
    if verbose:
        marks = list(timings.items()) + [("end", started + elapsed)]
        click.echo("time: " + ", ".join(f"{name} {marks[i + 1][1] - t:.2f}s" for i, (name, t) in enumerate(marks[:-1])))


def _allreduce_for_process_group(strategy: str) -> str:
    if click.get_current_context().get_parameter_source("strategy") == click.core.ParameterSource.COMMANDLINE \
            and strategy != "allreduce":
        raise click.UsageError("--process-group synchronizes through collectives: it needs --strategy allreduce")
    return "allreduce"


def _process_group(text: str, timeout: float):
    """TASKS:INDEX, or TF_CONFIG (the training tasks of the variable's cluster, and its task)."""
    from graphsync import GraphsyncError, ProcessGroup
    from graphsync.between_graph import cluster
    if text == "TF_CONFIG":
        try:
            task = cluster.from_tf_config(os.environ.get("TF_CONFIG"))
        except GraphsyncError as exc:
            raise click.BadParameter(str(exc), param_hint="'--process-group'") from None
        if task is None or not task.between_graph:
            raise click.BadParameter("TF_CONFIG names no training task of a cluster of several"
                                     if task is None or task.rank is None else "TF_CONFIG's cluster has one training task",
                                     param_hint="'--process-group'")
        return ProcessGroup.of_task(task, timeout)
    tasks, _, index = text.partition(":")
    if not (tasks.isdigit() and index.isdigit()) or int(tasks) < 2 or int(index) >= int(tasks):
        raise click.BadParameter(f"{text!r} is not TASKS:INDEX (e.g. 2:0, with 0 <= INDEX < TASKS and TASKS >= 2) "
                                 "or TF_CONFIG", param_hint="'--process-group'")
    return ProcessGroup(int(tasks), int(index), timeout)
