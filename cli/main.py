"""The `graphsync` command line: a thin click shell over `graphsync.io` and `graphsync.rewrite_towers`.

Every failure is one line on stderr and a non-zero exit status: 2 for usage errors (bad options,
missing or clashing paths), 1 for graphs that cannot be read or rewritten. TensorFlow is imported
only when a command needs it, with its start-up chatter on stderr kept from the terminal.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import warnings

import click

from cli.verify import verify

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
PROGRESS_DELAY = 0.5  # seconds before a progress bar appears


class Failure(Exception):
    """A one-line error for the user, with its exit status."""

    def __init__(self, message: str, status: int = EXIT_ERROR):
        super().__init__(message)
        self.status = status


class GraphsyncGroup(click.Group):
    """Runs commands with one-line errors and no tracebacks, whoever calls `main` (console script,
    `python -m graphsync`, click's CliRunner)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        prog_name = prog_name or "graphsync"
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            status = status if isinstance(status, int) else 0
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help())
            status = 0
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else prog_name
            _error(f"{_one_line(exc.format_message())} (see '{command} --help')")
            status = EXIT_USAGE
        except click.ClickException as exc:
            _error(_one_line(exc.format_message()))
            status = exc.exit_code
        except Failure as exc:
            _error(_one_line(str(exc)))
            status = exc.status
        except (click.Abort, KeyboardInterrupt):
            _error("interrupted")
            status = EXIT_INTERRUPTED
        except BrokenPipeError:
            status = EXIT_ERROR
        except Exception as exc:  # noqa: BLE001 - the user gets one line, never a traceback
            if os.environ.get("GRAPHSYNC_DEBUG"):
                raise
            _error(f"internal error: {type(exc).__name__}: {_one_line(str(exc))} "
                   "(set GRAPHSYNC_DEBUG=1 for the traceback, and please report it)")
            status = EXIT_ERROR
        sys.exit(status)


def _error(message: str) -> None:
    click.echo(f"graphsync: error: {message}", err=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("graphsync")
    except Exception:  # noqa: BLE001 - not installed: read it from the source
        init = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "graphsync", "__init__.py")
        with open(init, encoding="utf-8") as f:
            found = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
        return found.group(1) if found else "unknown"


# ---------------------------------------------------------------------------------------------
# Importing TensorFlow quietly


@contextlib.contextmanager
def _stderr_to_file():
    """Points file descriptor 2 at a temporary file (TensorFlow's C++ logging writes there before
    any Python setting applies); yields the file, to show it if the import fails."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield None
        return
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _library(verbose: bool = False):
    """Imports graphsync (and TensorFlow) without TensorFlow's start-up lines on the terminal."""
    if "graphsync.io" not in sys.modules:
        # C++ log lines (e.g. "NodeDef mentions attribute … not in the op definition") would break
        # the one-line contract; graphsync reports what matters itself. -v lets warnings through.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1" if verbose else "3")
        with _stderr_to_file() as captured:
            try:
                import graphsync.io  # noqa: F401
                import graphsync.plan  # noqa: F401
            except Exception as exc:  # noqa: BLE001
                detail = ""
                if captured is not None:
                    captured.seek(0)
                    lines = captured.read().decode("utf-8", "replace").strip().splitlines()
                    detail = f" ({lines[-1]})" if lines else ""
                raise Failure(f"cannot import TensorFlow: {type(exc).__name__}: {_one_line(str(exc))}{detail}") from None
    import logging

    import graphsync
    import graphsync.io
    import graphsync.plan
    level = logging.INFO if verbose else logging.ERROR
    logging.getLogger("tensorflow").setLevel(level)
    with contextlib.suppress(ImportError):
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.INFO if verbose else absl_logging.ERROR)
    return graphsync


@contextlib.contextmanager
def _library_errors():
    """GraphsyncError → Failure: PathError (paths that cannot work) is a usage error."""
    import graphsync.io
    try:
        yield
    except graphsync.io.PathError as exc:
        raise Failure(str(exc), EXIT_USAGE) from None
    except graphsync.GraphsyncError as exc:
        raise Failure(str(exc)) from None


@contextlib.contextmanager
def _shown_warnings(quiet: bool, verbose: bool):
    """GraphsyncWarnings as one line each on stderr (unless quiet); others only with -v."""
    import graphsync
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        if issubclass(warning.category, graphsync.GraphsyncWarning):
            if not quiet:
                click.echo(f"graphsync: warning: {_one_line(str(warning.message))}", err=True)
        elif verbose:
            click.echo(f"graphsync: {warning.category.__name__}: {_one_line(str(warning.message))}", err=True)


# ---------------------------------------------------------------------------------------------
# Progress


class Progress:
    """A bar over the stages of a command on `file` (stderr), drawn by a background thread only if
    the command is still running after `delay` seconds, and only when `enabled` (stderr is a
    terminal): fast runs and pipes see nothing."""

    def __init__(self, stages, enabled: bool, file=None, delay: float | None = None, interval: float = 0.1):
        self.stages = list(stages)
        self.enabled = enabled
        self.file = file
        self.delay = PROGRESS_DELAY if delay is None else delay
        self.interval = interval
        self.done, self.label = 0, ""
        self._finished = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.enabled:
            self._thread = threading.Thread(target=self._draw, name="graphsync-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._finished.set()
        if self._thread is not None:
            self._thread.join()

    def stage(self, label: str) -> None:
        """Marks the previous stage done and `label` as running."""
        if self.label:
            self.done = min(self.done + 1, len(self.stages))
        self.label = label

    def _draw(self):
        if self._finished.wait(self.delay):
            return
        file = self.file or sys.stderr
        with click.progressbar(length=len(self.stages), label="graphsync", file=file, show_eta=False,
                               show_percent=False, show_pos=True,
                               item_show_func=lambda item: item) as bar:
            while True:
                finished = self._finished.wait(self.interval)
                target = len(self.stages) if finished else self.done
                bar.update(target - bar.pos, current_item="done" if finished else self.label)
                if finished:
                    break


# ---------------------------------------------------------------------------------------------
# Commands


def _precheck_paths(input_path: str, output_path: str | None = None) -> None:
    """The commonest mistakes, answered before the seconds TensorFlow takes to import (the same
    messages graphsync.io gives; it checks everything again)."""
    if not os.path.lexists(input_path) and not os.path.exists(input_path + ".index"):
        raise Failure(f"{input_path}: no such file or directory", EXIT_USAGE)
    if output_path is not None:
        parent = os.path.dirname(os.path.abspath(output_path))
        if not os.path.isdir(parent):
            raise Failure(f"cannot write {output_path}: directory {parent} does not exist", EXIT_USAGE)


def _check_regex(ctx, param, value):
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


def _check_device(device: str | None) -> None:
    if device is None:
        return
    import tensorflow as tf
    try:
        tf.DeviceSpec.from_string(device)
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(_one_line(str(exc)) or "not a device name", param_hint="'--device'") from None


towers_option = click.option(
    "--towers", metavar="REGEX", callback=_check_regex,
    help="Regular expression whose match at the start of an op name is its tower's scope "
         "(default: discover tower_0/, tower0/, clone_0/, replica_1/ …).")
device_option = click.option(
    "--device", metavar="DEV",
    help="Device that combines the towers' statistics (default: CPU 0 of tower 0's host).")
strategy_option = click.option(
    "--strategy", type=click.Choice(["gather", "allreduce"]), default="gather", show_default=True,
    help="gather: statistics combined on --device; allreduce: one CollectiveReduceV2 per layer and "
         "direction on the towers' own devices (every tower must run each step).")
group_size_option = click.option(
    "--group-size", type=click.IntRange(min=1), metavar="K",
    help="Synchronize within consecutive groups of K towers (default: all towers).")
tags_option = click.option(
    "--tags", metavar="TAGS",
    help="SavedModel input: comma-separated tags of the meta graph to use (needed when it has several).")
verbose_option = click.option("-v", "--verbose", is_flag=True, help="Say more: every layer, skipped op and stage time.")


@click.group("graphsync", cls=GraphsyncGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="""\b
Examples:
  graphsync inspect train.meta
  graphsync rewrite train.meta -o train_sync.meta
  graphsync rewrite frozen.pb -o frozen_sync.pb --towers 'gpu_\\d+/' --device /cpu:0
  graphsync rewrite export_dir --tags train -o export_dir_sync --logdir /tmp/tb
  tensorboard --logdir /tmp/tb

Run 'graphsync COMMAND --help' for a command's options.""")
@click.version_option(_version(), "-V", "--version", prog_name="graphsync", message="%(prog)s %(version)s")
def main():
    """Synchronized batch norm for TF1-style multi-tower graphs, without touching model code.

    Reads a saved graph (GraphDef .pb/.pbtxt, MetaGraphDef .meta, or a SavedModel directory),
    makes every batch norm in every tower use the statistics of the whole multi-tower batch,
    forward and backward, and writes the result in the same format.
    """


@main.command(epilog="""\b
Examples:
  graphsync rewrite train.meta -o train_sync.meta
  graphsync rewrite train.meta -o train_sync.meta --logdir /tmp/tb   # then: tensorboard --logdir /tmp/tb
  graphsync rewrite train.meta --dry-run --json | jq .layers
  graphsync rewrite graph.pbtxt -o graph_sync.pb     # text in, binary out
  graphsync rewrite export_dir --tags train -o export_dir_sync

\b
Then train as before, from the new file:
  saver = tf.compat.v1.train.import_meta_graph("train_sync.meta")
  saver.restore(sess, checkpoint)    # checkpoints work both ways: variable names are unchanged
  sess.run(tf.compat.v1.get_collection("train_op"), feed_dict)""")
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=True))
@click.option("-o", "--output", "output_path", metavar="OUTPUT", type=click.Path(dir_okay=True),
              help="Where to write the rewritten graph (a new path; written atomically).")
@towers_option
@device_option
@strategy_option
@group_size_option
@tags_option
@click.option("--format", "fmt", type=click.Choice(["graphdef", "graphdef-text", "metagraph", "metagraph-text",
                                                    "savedmodel"]),
              help="Output format (default: the input's, unless OUTPUT's extension says otherwise).")
@click.option("--logdir", metavar="DIR", type=click.Path(file_okay=False),
              help="Also write the rewritten graph as a TensorBoard event file in DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("-n", "--dry-run", is_flag=True, help="Rewrite in memory and report; write no file.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@verbose_option
def rewrite(input_path, output_path, towers, device, strategy, group_size, tags, fmt, logdir, as_json, dry_run,
            quiet, verbose):
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
    _precheck_paths(input_path, output_path)
    graphsync = _library(verbose)
    _check_device(device)
    stages = ["loading", "rewriting"] + ([] if dry_run else ["saving"] + (["logging"] if logdir else []))
    started, timings = time.perf_counter(), {}

    def stage(name):
        timings[name] = time.perf_counter()
        progress.stage(name)

    with _library_errors(), _shown_warnings(quiet, verbose), \
            Progress(stages, enabled=sys.stderr.isatty() and not quiet) as progress:
        report, details = graphsync.io.rewrite_file(input_path, output_path, towers=towers, device=device,
                                                     strategy=strategy, group_size=group_size,
                                                     tags=tags, fmt=fmt, logdir=logdir, dry_run=dry_run,
                                                     stage=stage)
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


@main.command(epilog="""\b
Examples:
  graphsync inspect train.meta
  graphsync inspect train.meta -v           # every op of every layer in every tower
  graphsync inspect export_dir --tags train --json""")
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=True))
@towers_option
@device_option
@strategy_option
@group_size_option
@tags_option
@click.option("--json", "as_json", is_flag=True, help="Print the inspection as JSON on stdout.")
@verbose_option
def inspect(input_path, towers, device, strategy, group_size, tags, as_json, verbose):
    """Show the towers in INPUT and every batch-norm candidate: what a rewrite would synchronize,
    what it would leave alone and why, and whether gradients are already built. Writes nothing."""
    _precheck_paths(input_path)
    graphsync = _library(verbose)
    _check_device(device)
    with _library_errors(), _shown_warnings(False, verbose):
        loaded = graphsync.io.load(input_path, tags)
        plan = graphsync.plan.make_plan(loaded.graph, towers, device, strategy=strategy, group_size=group_size)
    info = _inspection(loaded, plan)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(_format_inspection(info, verbose))


def _inspection(loaded, plan) -> dict:
    """What `inspect` shows, as plain data."""
    devices = _tower_devices(loaded.graph, plan)
    layers = []
    for layer in plan.layers:
        layers.append({
            "name": layer.name, "kind": layer.kind, "synchronize": True,
            "gradients": layer.has_gradients, "grad_ops_per_tower": len(layer.sites[0].grad_ops),
            "sites": [{"tower": s.tower.label, "op": s.op.name, "device": s.device} for s in layer.sites]})
    skipped = []
    for op_name, reason in plan.skipped:
        tower = next((t.label for t in sorted(plan.towers, key=lambda t: -len(t.prefix))
                      if t.prefix and op_name.startswith(t.prefix)), None)
        skipped.append({"op": op_name, "tower": tower, "reason": reason})
    n_layers, n_towers = len(layers), len(plan.towers)
    with_grads = sum(layer["gradients"] for layer in layers)
    if not layers:
        if n_towers == 0:
            summary = "no towers found" if skipped else "no batch norm found"
        elif n_towers == 1:
            summary = f"1 tower ({plan.towers[0].label}): nothing to synchronize across"
        else:
            summary = f"0 layers × {n_towers} towers: nothing to synchronize"
    else:
        grads = ("gradients present" if with_grads == n_layers else "no gradients yet" if not with_grads
                 else f"gradients present for {with_grads} of {n_layers} layers")
        summary = f"{n_layers} layer{'s' * (n_layers != 1)} × {n_towers} towers, {grads}"
    return {"input": loaded.path, "format": loaded.format, "tags": list(loaded.tags),
            "ops": len(loaded.graph.get_operations()),
            "towers": [{"name": t.label, "prefix": t.prefix, "device": devices.get(t.label, "")}
                       for t in plan.towers],
            "device": plan.device, "strategy": plan.strategy,
            "groups": [[plan.towers[i].label for i in g] for g in plan.groups],
            "layers": layers, "skipped": skipped, "summary": summary}


def _tower_devices(graph, plan) -> dict:
    """Each tower's device: that of its batch-norm ops, else the most common among its ops."""
    devices = {}
    if plan.layers:
        for site in plan.layers[0].sites:
            devices[site.tower.label] = site.device
    for tower in plan.towers:
        if tower.label in devices:
            continue
        counts = {}
        for op in graph.get_operations():
            if op.device and op.name.startswith(tower.prefix):
                counts[op.device] = counts.get(op.device, 0) + 1
        devices[tower.label] = max(counts, key=counts.get) if counts else ""
    return devices


def _format_inspection(info: dict, verbose: bool) -> str:
    lines = [f"{info['input']}: {info['format']}"
             + (f" (tags {','.join(info['tags'])})" if info["tags"] else "") + f", {info['ops']} ops"]
    towers = info["towers"]
    lines.append(f"towers ({len(towers)}):" + ("" if towers else " none"))
    for t in towers:
        lines.append(f"  {t['name']:<12} {t['device'] or '(no device)'}")
    if info["layers"]:
        if info["strategy"] == "allreduce":
            lines.append("statistics all-reduced on the towers' own devices (CollectiveReduceV2)")
        else:
            lines.append(f"statistics combined on {info['device'] or '(default device)'}")
        if len(info["groups"]) > 1:
            lines.append(f"sync groups ({len(info['groups'])}): "
                         + "; ".join(", ".join(group) for group in info["groups"]))
        width = max(len(layer["name"]) for layer in info["layers"])
        kinds = max(4, max(len(layer["kind"]) for layer in info["layers"]))
        lines.append(f"batch-norm layers ({len(info['layers'])}), one op in each tower:")
        lines.append(f"  {'layer':<{width}}  {'kind':<{kinds}}  would  gradient ops per tower")
        for layer in info["layers"]:
            lines.append(f"  {layer['name']:<{width}}  {layer['kind']:<{kinds}}  sync   "
                         f"{layer['grad_ops_per_tower'] if layer['gradients'] else 'none yet'}")
            if verbose:
                for site in layer["sites"]:
                    lines.append(f"      {site['tower']:<10} {site['op']}  {site['device']}")
    if info["skipped"]:
        lines.append(f"left alone ({len(info['skipped'])}):")
        for s in info["skipped"]:
            lines.append(f"  {s['op']}" + (f" [{s['tower']}]" if s["tower"] else "") + f": {s['reason']}")
    lines.append(info["summary"])
    return "\n".join(lines)


main.add_command(verify)

if __name__ == "__main__":
    main()
