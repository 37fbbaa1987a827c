"""What every benchmark shares: quiet TensorFlow import, the repo on sys.path, timing helpers and
the header that says where and when a figure was measured.

Benchmarks print Markdown to stdout (pasted into BENCHMARKS.md) and, with --json PATH, the raw numbers.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# GRAPHSYNC_SRC: a directory holding the graphsync package to measure (e.g. a `git archive` of a
# commit), so a recorded run is not disturbed by work in progress in the checkout.
SOURCE = os.path.abspath(os.environ.get("GRAPHSYNC_SRC") or REPO)
for _path in (REPO, SOURCE):
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@contextlib.contextmanager
def quiet_stderr():
    """Hides the absl/cudart/oneDNN lines TensorFlow's C++ side prints on import."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def import_tf():
    with quiet_stderr():
        import tensorflow as tf  # noqa: F401
        tf.get_logger().setLevel("ERROR")
        tf.config.list_physical_devices("CPU")  # the cuInit line comes on first device query
    return tf


def logical_cpus(tf, count: int, inter_op: int = 2, **session_options):
    """Splits the CPU into `count` logical devices for the eager runtime (the Keras peer) and returns
    the TF1 session config with the same devices and `inter_op` inter-op / 1 intra-op threads."""
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
    return tf.compat.v1.ConfigProto(device_count={"CPU": count}, inter_op_parallelism_threads=inter_op,
                                    intra_op_parallelism_threads=1, **session_options)


def median(values):
    return statistics.median(values) if values else float("nan")


def now() -> float:
    return time.perf_counter()


def header(title: str, argv=None) -> str:
    """A Markdown heading with the command, date, machine and versions."""
    import tensorflow as tf
    command = "python " + " ".join([os.path.relpath(sys.argv[0], REPO)] + list(argv if argv is not None
                                                                              else sys.argv[1:]))
    commit = graphsync_version()
    load = os.getloadavg()
    return (f"### {title}\n\n"
            f"`{command}` — {datetime.date.today().isoformat()}, {platform.node() or 'host'}: "
            f"{os.cpu_count()} CPUs, load average {load[0]:.2f} at start, Python {platform.python_version()}, "
            f"TensorFlow {tf.__version__}, graphsync {commit}\n")


def graphsync_version() -> str:
    """Which graphsync code is measured: the commit, and whether graphsync/ differed from it."""
    import graphsync
    where = os.path.dirname(os.path.dirname(os.path.abspath(graphsync.__file__)))
    stamp = os.path.join(where, "COMMIT")
    if os.path.exists(stamp):
        return f"snapshot of {open(stamp).read().strip()} ({where})"

    def git(*args):
        try:
            return subprocess.run(["git", "-C", where, *args], capture_output=True, text=True,
                                  check=False).stdout.strip()
        except OSError:
            return ""
    commit = git("rev-parse", "--short", "HEAD") or "?"
    dirty = git("status", "--porcelain", "--", "graphsync")
    return f"@ {commit}" + (" + uncommitted changes in graphsync/" if dirty else "")


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A Markdown table; columns are (key, heading)."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(k, "")) for k, _ in columns) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "—"
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 0.01:
            return f"{value:.3g}"
        return f"{value:.2g}"
    return str(value)


def write_json(path: str | None, payload) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)

