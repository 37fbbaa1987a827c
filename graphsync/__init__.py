"""graphsync: synchronized batch norm for TF1-style multi-tower graphs, without touching model code.

    import graphsync
    report = graphsync.rewrite_towers()   # after building the towers (and, ideally, their gradients)

or, for loops that own the session, `hooks=[graphsync.SyncBatchNormHook()]`; or, for TF2 steps
traced by tf.function under a distribution strategy (and everything else), `graphsync.autosync()`
on the script's first lines; or, with no edit at all, `graphsync run train.py` (graphsync.autosync).

Importing graphsync registers the gradients its rewritten graphs use. When TensorFlow is not
imported yet (e.g. `python -m graphsync`), the library loads on first use instead, so the command
line can keep TensorFlow's start-up lines off the terminal. Without a TensorFlow it supports,
the import fails with one line that says what is needed (graphsync/requirements.py).
"""
import importlib
import sys

from graphsync.requirements import tensorflow_problem

__version__ = "0.1.0"

_missing = tensorflow_problem()   # no TensorFlow, or one older than graphsync supports: one line, here
if _missing and sys.argv[:1] == ["-m"]:   # `python -m graphsync` (argv[0] is "-m" while it is found)
    sys.exit(f"graphsync: error: {_missing}")
if _missing:
    raise ImportError(_missing)

_EXPORTS = {
    "rewrite_towers": "graphsync.rewrite",
    "ProcessGroup": "graphsync.between_graph.process_group",
    "GraphsyncError": "graphsync.errors",
    "GraphsyncWarning": "graphsync.errors",
    "RewriteReport": "graphsync.report",
    "LayerReport": "graphsync.report",
    "SkippedReport": "graphsync.report",
    "SyncBatchNormHook": "graphsync.hook",
    "AutoSync": "graphsync.autosync.patching",
    "autosync": "graphsync.autosync",
    "verify": "graphsync.verification",
    "VerifyReport": "graphsync.verification",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'graphsync' has no attribute {name!r}")


if "tensorflow" in sys.modules:   # a training script: register graphsync's gradients now
    from graphsync.rewrite import rewrite_towers  # noqa: E402,F401
