"""`graphsync run`: an unchanged training script, run as `python` would, with every multi-tower
graph synchronized just before its first session, finalization or run (see graphsync.autosync.patching).

The script gets what `python SCRIPT ARGS` (or `python -m MODULE ARGS`) gives it: sys.argv,
__name__ == "__main__", __file__, sys.path[0], the same standard streams, its exit status, and an
uncaught exception's traceback with status 1. Everything after SCRIPT (or MODULE) is the script's.
"""
from __future__ import annotations

import builtins
import importlib.machinery
import io
import json
import os
import runpy
import sys
import types
import zipfile

import click

from cli import shell


class ScriptCommand(click.Command):
    """Options up to SCRIPT or `-m MODULE` are graphsync's; everything after belongs to the script,
    options included (`-m MODULE` ends graphsync's options, as it ends python's)."""

    def parse_args(self, ctx, args):
        takes_value = {name for param in self.params if isinstance(param, click.Option) and not param.is_flag
                       for name in param.opts}
        args = list(args)
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--" or not arg.startswith("-") or arg == "-":
                break
            if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
                module_end = i + 2 if arg == "-m" else i + 1
                if module_end <= len(args):
                    args.insert(module_end, "--")
                break
            if arg in takes_value:
                i += 1
            i += 1
        return super().parse_args(ctx, args)


@click.command(cls=ScriptCommand, context_settings={"allow_interspersed_args": False,
                                                    "ignore_unknown_options": True},
               epilog="""\b
Examples:
  graphsync run train.py --batch_size 64          # the script's own options after it
  graphsync run --report sync.json train.py
  graphsync run --strategy allreduce -m trainer.main --epochs 1
  python -m graphsync run train.py

\b
Exit status: the script's (an uncaught exception: 1, with its traceback); 1 when a graph cannot
be synchronized (one line on stderr, the graph untouched; --on-error=warn runs on instead);
1 when another between-graph worker is lost (last line on stderr names it); 2 usage error.""")
@click.option("-m", "module", metavar="MODULE", help="Run library module MODULE as a script, as python -m does.")
@shell.towers_option
@shell.device_option
@shell.strategy_option
@shell.group_size_option
@shell.recompute_option
@shell.peer_timeout_option
@shell.heartbeat_option
@click.option("--report", "report_path", metavar="FILE", type=click.Path(dir_okay=False),
              help="Write the report of every rewritten graph to FILE as JSON when the script ends.")
@click.option("--on-error", type=click.Choice(["fail", "warn"]), default="fail", show_default=True,
              help="A graph that cannot be synchronized: stop the script (fail), or say so and let it "
                   "run unsynchronized (warn).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("-v", "--verbose", is_flag=True, help="Say more: every layer, and the graphs left alone.")
@click.argument("script_args", metavar="SCRIPT [ARGS]...", nargs=-1, type=click.UNPROCESSED)
def run(module, towers, device, strategy, group_size, recompute, peer_timeout, heartbeat, report_path, on_error, quiet,
        verbose, script_args):
    """Run a training script unchanged, with every batch norm of every tower synchronized.

    Each multi-tower graph is rewritten once, just before the first session is created on it
    (tf.compat.v1.Session, InteractiveSession, MonitoredTrainingSession, Supervisor …), before
    it is finalized, or, for a session opened before the towers were built, at its first run
    after they exist; stderr gets one line per rewritten graph. Graphs without towers or without
    batch norm, and graphs the script rewrites itself, are left alone. A tower that an open
    session already ran before the others were built cannot be synchronized: one line, and exit
    status 1 (or, with --on-error=warn, the script runs on unsynchronized).

    On a between-graph worker (its cluster and task from the tf.distribute.Server the script
    creates, else from TF_CONFIG), the towers of every worker process are synchronized together
    through cross-process collectives (--strategy is then allreduce), after a bounded wait for
    the other workers (--peer-timeout); a worker lost later (its server silent for --heartbeat
    seconds, or restarted) stops every other one, with status 1 and one line naming it.
    """
    if quiet and verbose:
        raise click.UsageError("choose -q or -v, not both")
    if module is None and not script_args:
        raise click.UsageError("missing SCRIPT (or -m MODULE)")
    if module is None:
        script, script_args = script_args[0], list(script_args[1:])
        shell.precheck_paths(script)
    if report_path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(report_path))):
        raise shell.Failure(f"cannot write {report_path}: directory {os.path.dirname(os.path.abspath(report_path))} "
                            "does not exist", shell.EXIT_USAGE)
    from graphsync.autosync.worker import BetweenGraphSync
    options = {k: v for k, v in (("towers", towers), ("device", device), ("strategy", strategy),
                                 ("group_size", group_size)) if v is not None}
    if recompute:
        options["recompute"] = recompute
    autosync = BetweenGraphSync(on_error=on_error, quiet=quiet, verbose=verbose, peer_timeout=peer_timeout,
                                heartbeat=heartbeat, **options)
    with autosync:
        try:
            if module is None:
                _run_script(script, script_args)
            else:
                _run_module(module, list(script_args))
        finally:
            if report_path is not None:
                _write_report(report_path, autosync.reports)


def _run_script(path: str, args: list) -> None:
    """As `python PATH ARGS`: argv[0] as given, __file__ absolute, sys.path[0] the real directory of
    the script (a directory or zip file with __main__.py: itself, through runpy)."""
    sys.argv = [path] + args
    if os.path.isdir(path) or zipfile.is_zipfile(path):
        del sys.path[0]
        _as_main(lambda: runpy.run_path(path, run_name="__main__"))
        return
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    filename = os.path.abspath(path)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=filename, __builtins__=builtins, __cached__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", filename))
    sys.modules["__main__"] = main
    with io.open_code(filename) as f:
        source = f.read()

    def execute():
        code = compile(source, filename, "exec", dont_inherit=True)   # not this module's __future__ flags
        exec(code, main.__dict__)  # noqa: S102 - running the user's script is the point

    _as_main(execute)


def _run_module(name: str, args: list) -> None:
    """As `python -m NAME ARGS`: sys.path[0] is the working directory; runpy sets argv[0]."""
    sys.argv = ["-m"] + args
    sys.path[0] = os.getcwd()
    _as_main(lambda: runpy.run_module(name, run_name="__main__", alter_sys=True))


def _as_main(execute) -> None:
    """Runs the script; an exception it does not catch is shown as Python shows it (through
    sys.excepthook, from the script's first frame on), with exit status 1."""
    try:
        execute()
    except SystemExit:
        raise
    except ImportError as exc:
        if exc.__traceback__ is not None and _script_frames(exc.__traceback__) is None:
            raise shell.Failure(f"{shell.one_line(exc)}") from None   # -m MODULE that does not exist
        _show_uncaught(exc)
    except BaseException as exc:  # noqa: BLE001 - exactly what python does with it
        _show_uncaught(exc)


def _show_uncaught(exc: BaseException) -> None:
    traceback = _script_frames(exc.__traceback__)
    if traceback is None and not isinstance(exc, SyntaxError):   # python shows a script's SyntaxError bare
        traceback = exc.__traceback__
    sys.excepthook(type(exc), exc.with_traceback(traceback), traceback)   # the hook prints exc.__traceback__
    sys.stderr.flush()
    raise SystemExit(130 if isinstance(exc, KeyboardInterrupt) else 1)


def _script_frames(traceback):
    """The traceback from the script's own first frame (runpy's and graphsync's dropped)."""
    while traceback is not None:
        if traceback.tb_frame.f_globals.get("__name__") == "__main__":
            return traceback
        traceback = traceback.tb_next
    return None


def _write_report(path: str, reports: list) -> None:
    """Atomically: a reader never sees half a file."""
    text = json.dumps({"graphs": [report.to_dict() for report in reports]}, indent=2)
    partial = f"{path}.partial-{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(partial, path)
