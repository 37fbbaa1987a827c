"""What every `graphsync` command shares: one-line errors and exit statuses, the quiet TensorFlow
import, progress, and the options several commands take.

Every failure is one line on stderr and a non-zero exit status: 2 for usage errors (bad options,
missing or clashing paths), 1 for graphs that cannot be read or rewritten. TensorFlow is imported
only when a command needs it, with its start-up chatter on stderr kept from the terminal. The
commands live one per module (cli/rewrite.py, cli/inspection.py, cli/verify.py, cli/run.py) and
import only this module; cli/main.py puts them in one group.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import warnings

import click

from graphsync.plan.options import Recompute, Strategy

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
            error(f"{one_line(exc.format_message())} (see '{command} --help')")
            status = EXIT_USAGE
        except click.ClickException as exc:
            error(one_line(exc.format_message()))
            status = exc.exit_code
        except Failure as exc:
            error(one_line(str(exc)))
            status = exc.status
        except (click.Abort, KeyboardInterrupt):
            error("interrupted")
            status = EXIT_INTERRUPTED
        except BrokenPipeError:
            status = EXIT_ERROR
        except Exception as exc:  # noqa: BLE001 - the user gets one line, never a traceback
            if os.environ.get("GRAPHSYNC_DEBUG"):
                raise
            error(f"internal error: {type(exc).__name__}: {one_line(str(exc))} "
                  "(set GRAPHSYNC_DEBUG=1 for the traceback, and please report it)")
            status = EXIT_ERROR
        sys.exit(status)


def error(message: str) -> None:
    click.echo(f"graphsync: error: {message}", err=True)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


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


def library(verbose: bool = False):
    """Imports graphsync (and TensorFlow) without TensorFlow's start-up lines on the terminal."""
    if "graphsync.io" not in sys.modules:
        # C++ log lines (e.g. "NodeDef mentions attribute … not in the op definition") would break
        # the one-line contract; graphsync reports what matters itself. -v lets warnings through.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1" if verbose else "3")
        with _stderr_to_file() as captured:
            try:
                import graphsync.io  # noqa: F401
                import graphsync.rewrite  # noqa: F401
            except Exception as exc:  # noqa: BLE001
                detail = ""
                if captured is not None:
                    captured.seek(0)
                    lines = captured.read().decode("utf-8", "replace").strip().splitlines()
                    detail = f" ({lines[-1]})" if lines else ""
                raise Failure(f"cannot import TensorFlow: {type(exc).__name__}: {one_line(str(exc))}{detail}") from None
    import logging

    import graphsync
    import graphsync.io
    import graphsync.rewrite
    level = logging.INFO if verbose else logging.ERROR
    logging.getLogger("tensorflow").setLevel(level)
    with contextlib.suppress(ImportError):
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.INFO if verbose else absl_logging.ERROR)
    return graphsync


@contextlib.contextmanager
def library_errors():
    """GraphsyncError → Failure: PathError (paths that cannot work) is a usage error."""
    import graphsync.io
    try:
        yield
    except graphsync.io.PathError as exc:
        raise Failure(str(exc), EXIT_USAGE) from None
    except graphsync.GraphsyncError as exc:
        raise Failure(str(exc)) from None


@contextlib.contextmanager
def shown_warnings(quiet: bool, verbose: bool):
    """GraphsyncWarnings as one line each on stderr (unless quiet); others only with -v."""
    import graphsync
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        if issubclass(warning.category, graphsync.GraphsyncWarning):
            if not quiet:
                click.echo(f"graphsync: warning: {one_line(str(warning.message))}", err=True)
        elif verbose:
            click.echo(f"graphsync: {warning.category.__name__}: {one_line(str(warning.message))}", err=True)


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


def precheck_paths(input_path: str, output_path: str | None = None) -> None:
    """The commonest mistakes, answered before the seconds TensorFlow takes to import (the same
    messages graphsync.io gives; it checks everything again)."""
    if not os.path.lexists(input_path) and not os.path.exists(input_path + ".index"):
        raise Failure(f"{input_path}: no such file or directory", EXIT_USAGE)
    if output_path is not None:
        parent = os.path.dirname(os.path.abspath(output_path))
        if not os.path.isdir(parent):
            raise Failure(f"cannot write {output_path}: directory {parent} does not exist", EXIT_USAGE)


def check_regex(ctx, param, value):
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


def check_device(device: str | None) -> None:
    if device is None:
        return
    import tensorflow as tf
    try:
        tf.DeviceSpec.from_string(device)
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(one_line(str(exc)) or "not a device name", param_hint="'--device'") from None


towers_option = click.option(
    "--towers", metavar="REGEX", callback=check_regex,
    help="Regular expression whose match at the start of an op name is its tower's scope "
         "(default: found by structure, e.g. gpu_0/, gpu_1/ …; known names tower_0/, tower0/, clone_0/, replica_1/ first).")
device_option = click.option(
    "--device", metavar="DEV",
    help="Device that combines the towers' statistics (default: CPU 0 of tower 0's host).")
strategy_option = click.option(
    "--strategy", type=click.Choice([strategy.value for strategy in Strategy]), default=Strategy.GATHER.value,
    show_default=True,
    help="gather: statistics combined on --device; allreduce: one CollectiveReduceV2 per layer and "
         "direction on the towers' own devices (every tower must run each step).")
group_size_option = click.option(
    "--group-size", type=click.IntRange(min=1), metavar="K",
    help="Synchronize within consecutive groups of K towers (default: all towers).")
class RecomputeMode(click.ParamType):
    """--recompute [layers|segments]: the option alone is `layers` (rewrite_towers(recompute=True));
    what follows it is taken as its value, so a script path there gets a hint, not a puzzle."""

    name = "layers|segments"
    MODES = {mode.value: mode for mode in Recompute if mode}   # the words are the enum's values

    def convert(self, value, param, ctx):
        if value is True or isinstance(value, Recompute):
            return value
        if value in self.MODES:
            return self.MODES[value]
        self.fail(f"{value!r} is not a recompute mode: use `--recompute layers` or `--recompute segments` "
                  "(the option alone means layers)", param, ctx)


recompute_option = click.option(
    "--recompute", type=RecomputeMode(), is_flag=False, flag_value="layers", default=None,
    metavar="[layers|segments]",
    help="layers (the option alone): the backward reads each batch norm's output, and the activation, "
         "scale and bias after it, recomputed from the synchronized statistics. segments: whole forward "
         "segments, convolutions included, recomputed from checkpoints graphsync chooses (about half the "
         "memory). Either way the statistics are not recomputed and the step is the same bit for bit.")
peer_timeout_option = click.option(
    "--peer-timeout", type=click.FloatRange(min=0), default=300, show_default=True, metavar="SECONDS",
    help="Between-graph workers: how long a worker waits for the others (at its first step, and, with "
         "no heartbeat or under `graphsync rewrite`, in every cross-process collective) before failing with "
         "one line; 0 waits forever.")
heartbeat_option = click.option(
    "--heartbeat", type=click.FloatRange(min=0), default=10, show_default=True, metavar="SECONDS",
    help="Between-graph workers: a worker whose server answers no health check for SECONDS is lost, and "
         "every other worker stops with one line naming it (slow steps are waited for); 0: no heartbeat.")
tags_option = click.option(
    "--tags", metavar="TAGS",
    help="SavedModel input: comma-separated tags of the meta graph to use (needed when it has several).")
verbose_option = click.option("-v", "--verbose", is_flag=True, help="Say more: every layer, skipped op and stage time.")
