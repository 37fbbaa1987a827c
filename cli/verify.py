"""`graphsync verify`: the self-check of a rewritten graph, as a command (see graphsync.verify).

Registered on the `graphsync` group by cli/main.py; uses only the shared shell (cli/shell.py).
"""
from __future__ import annotations

import json

import click

from cli import shell

EXIT_NOT_SYNCHRONIZED = 3


def _parse_feed(ctx, param, values):
    feeds = {}
    for item in values:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE")
        try:
            feeds[name] = json.loads(text)
        except ValueError:
            raise click.BadParameter(f"the value of {name} is not a number, true/false or a JSON list: {text!r}") \
                from None
    return feeds


def _parse_batch_size(ctx, param, value):
    """N (every tower) or N,N,… (one size per tower, for towers of different sizes)."""
    if value is None:
        return None
    try:
        sizes = [int(part) for part in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not N or N,N,… (examples per tower)") from None
    if any(n < 1 for n in sizes):
        raise click.BadParameter(f"{value!r}: every tower needs at least one example")
    return sizes[0] if len(sizes) == 1 else sizes


@click.command(epilog="""\b
Examples:
  graphsync verify train_sync.meta
  graphsync verify train_sync.meta --original train.meta      # the same figures before the rewrite
  graphsync verify export_dir_sync --tags train --json
  graphsync verify train_sync.meta --input images --input labels --loss total_loss --num-classes 10
  graphsync verify train_sync.meta --feed learning_rate=0.1 --batch-size 8
  graphsync verify train_sync.meta --batch-size 3,5                # towers of 3 and 5 examples

\b
Exit status: 0 synchronized, 3 not synchronized (the reason on stderr), 1 the graph cannot be
checked (inputs or loss not found, it does not run, or it reaches outside this process without
--allow-side-effects), 2 usage error.""")
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=True))
@click.option("--original", "original_path", metavar="ORIGINAL", type=click.Path(dir_okay=True),
              help="The graph before the rewrite: run with the same data and variable values, shown side by side.")
@click.option("--input", "inputs", metavar="NAME", multiple=True,
              help="A tensor to feed with random examples (repeatable): relative to a tower (images) or one "
                   "tower's (tower_0/images) for per-tower inputs, else one tensor holding the whole batch. "
                   "Default: found by structure (placeholders, a whole batch split into the towers, iterators, "
                   "queues, staging areas, random inputs made in each tower).")
@click.option("--loss", metavar="NAME",
              help="The loss tensor, per tower or global (default: the losses collection, else what tf.gradients "
                   "differentiates, else a scalar named total_loss, loss or *_loss in every tower; the first "
                   "that depends on the examples).")
@click.option("--num-classes", type=click.IntRange(min=1), metavar="K",
              help="Integer inputs get values in 0..K-1 (default: inferred from the logits' width, a one-hot "
                   "depth or a table size).")
@click.option("--feed", "feeds", metavar="NAME=VALUE", multiple=True, callback=_parse_feed,
              help="Feed a tensor a fixed value in both runs (repeatable; VALUE is JSON: 0.1, true, [1, 2]).")
@click.option("--batch-size", metavar="N[,N…]", callback=_parse_batch_size,
              help="Examples per tower, or one number per tower (default: what the graph fixes, else 4).")
@click.option("--group-size", type=click.IntRange(min=2), metavar="N",
              help="The towers were synchronized in groups of N (rewrite's group_size): exchange within groups.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random examples.")
@click.option("--tolerance", type=click.FloatRange(min=0.0), metavar="X",
              help="Largest relative change that passes (default: 1e-3; float rounding stays below 1e-4).")
@shell.towers_option
@shell.tags_option
@click.option("--allow-side-effects", is_flag=True,
              help="Run a graph that reaches outside this process (reads or writes files, opens connections, "
                   "calls Python). verify runs the graph, so by default it refuses such a graph before anything "
                   "runs; pass this only for a graph you trust.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("-v", "--verbose", is_flag=True, help="Say more: every layer's traffic.")
def verify(graph_path, original_path, inputs, loss, num_classes, feeds, batch_size, group_size, seed, tolerance,
           towers, tags, allow_side_effects, as_json, verbose):
    """Check on GRAPH itself that its towers share batch statistics, without a single-device model.

    Feeds random examples to every tower, then the same examples moved to other towers (every
    tower keeps its size), from the same variable values (a replicated trainer's per-tower copies
    start as the main tower's). With synchronized statistics the sum of the tower losses, the
    gradients the optimizer applies and the moving-statistics updates do not change beyond float
    rounding; with per-tower statistics they change by 1e-2 and more (other writes, such as moving
    summaries of one tower's loss, are shown apart and not judged). Also
    shows, from TensorFlow's step statistics, which per-tower batch-norm ops still run (after a
    rewrite: none) and the bytes each synchronized layer moves across devices per step.
    """
    shell.precheck_paths(graph_path)
    if original_path:
        shell.precheck_paths(original_path)
    graphsync = shell.library(verbose)
    from graphsync.verification import DEFAULT_TOLERANCE  # noqa: PLC0415
    with shell.library_errors(), shell.shown_warnings(False, verbose):
        report = graphsync.verify(
            graph_path, original=original_path, towers=towers, inputs=list(inputs), loss=loss,
            num_classes=num_classes, feeds=feeds, batch_size=batch_size, group_size=group_size, seed=seed,
            tolerance=DEFAULT_TOLERANCE if tolerance is None else tolerance, tags=tags,
            allow_side_effects=allow_side_effects)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(report.format(verbose))
    if not report.passed:
        raise shell.Failure(report.reason, EXIT_NOT_SYNCHRONIZED)
