"""The `graphsync` command line: one click group over the commands, each in its own module
(cli/rewrite.py, cli/inspection.py, cli/verify.py, cli/run.py) on the shared shell (cli/shell.py: one-line
errors and exit statuses, the quiet TensorFlow import, progress, shared options).

The console script is `cli.main:main`; `python -m graphsync` runs the same group.
"""
from __future__ import annotations

import os
import re

import click

from cli.inspection import inspect
from cli.rewrite import rewrite
from cli.run import run
from cli.shell import GraphsyncGroup
from cli.verify import verify


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("graphsync")
    except Exception:  # noqa: BLE001 - not installed: read it from the source
        init = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "graphsync", "__init__.py")
        with open(init, encoding="utf-8") as f:
            found = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
        return found.group(1) if found else "unknown"


def _show_version(ctx, param, value):
    """-V: looked up only when asked (importlib.metadata costs ~10 ms of every start, `graphsync run`'s too)."""
    if value and not ctx.resilient_parsing:
        click.echo(f"graphsync {_version()}")
        ctx.exit()


@click.group("graphsync", cls=GraphsyncGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="""\b
Examples:
  graphsync run train.py --batch_size 64           # an unchanged script, synchronized
  graphsync inspect train.meta
  graphsync rewrite train.meta -o train_sync.meta
  graphsync rewrite frozen.pb -o frozen_sync.pb --towers 'gpu_\\d+/' --device /cpu:0
  graphsync rewrite export_dir --tags train -o export_dir_sync --logdir /tmp/tb
  tensorboard --logdir /tmp/tb

Run 'graphsync COMMAND --help' for a command's options.""")
@click.option("-V", "--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show the version and exit.")
def main():
    """Synchronized batch norm for TF1-style multi-tower graphs, without touching model code.

    Makes every batch norm in every tower use the statistics of the whole multi-tower batch,
    forward and backward: in an unchanged training script as it runs (run), or in a saved graph
    (GraphDef .pb/.pbtxt, MetaGraphDef .meta, or a SavedModel directory), written back in the
    same format (rewrite).
    """


for command in (rewrite, inspect, verify, run):
    main.add_command(command)

if __name__ == "__main__":
    main()
