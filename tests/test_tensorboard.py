"""TensorBoard shows the rewritten graph: a real `tensorboard` serves the event file that
`graphsync rewrite --logdir` writes, its graph endpoint holds every synchronized layer's aggregation
in one `graphsync/<layer>/` scope on one device with the towers as they were, and headless Chromium
renders the graph dashboard.

Both processes run in their own process groups and are always ended. Without `tensorboard` or
`chromium` the tests skip locally and fail under CI (.ci/run installs both). Set
GRAPHSYNC_SCREENSHOT=docs/tensorboard.png to refresh the screenshot docs/tensorboard.md shows.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from google.protobuf import text_format

import cluster
from cli.main import main
import tiers

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "fixtures", "cifar10_2towers.meta")
LAYERS = ("bn1/FusedBatchNormV3", "bn2/FusedBatchNormV3")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                  "--disable-component-update", "--disable-sync", "--disable-quic", "--hide-scrollbars",
                  "--window-size=1400,900", "--virtual-time-budget=20000"]


def _tool(name: str) -> str:
    found = shutil.which(name) or (shutil.which(name, path=os.path.dirname(sys.executable)) if name == "tensorboard"
                                   else None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")
    return found


def _free_port() -> int:
    return cluster.free_ports(1)[0]


@contextlib.contextmanager
def _process_group(args, **kw):
    """A process in its own group, ended (TERM, then KILL) with everything it started."""
    process = subprocess.Popen(args, start_new_session=True, stdin=subprocess.DEVNULL, **kw)
    try:
        yield process
    finally:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback only)
        return response.read()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensorboard")
    result = CliRunner().invoke(main, ["rewrite", FIXTURE, "-o", str(root / "synced.meta"), "--logdir",
                                       str(root / "logs")], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return root / "logs"


@pytest.fixture(scope="module")
def tensorboard(logdir, tmp_path_factory):
    """A running TensorBoard on a free loopback port: its base URL."""
    executable = _tool("tensorboard")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("tb-log") / "tensorboard.log", "w+b")
    with log, _process_group([executable, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
                             stdout=log, stderr=subprocess.STDOUT) as process:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if b'"run_graph": true' in _get(f"{base}/data/plugin/graphs/info", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"tensorboard did not serve the graph: {log.read()[-2000:].decode(errors='replace')}")
            time.sleep(0.5)
        yield base


def test_graph_endpoint_serves_the_rewritten_graph(tensorboard):
    graph_def = tf1.GraphDef()
    text_format.Parse(_get(f"{tensorboard}/data/plugin/graphs/graph?run=.&conversions=false").decode(), graph_def)
    nodes = {node.name: node for node in graph_def.node}
    for layer in LAYERS:
        aggregation = [n for name, n in nodes.items() if name.startswith(f"graphsync/{layer}/")]
        assert aggregation, f"no graphsync/{layer}/ scope served"
        assert {n.device for n in aggregation} == {"/device:CPU:0"}   # one box per layer, on one device
        assert any(n.name.startswith(f"graphsync/{layer}/forward") for n in aggregation)
        assert any(n.name.startswith(f"graphsync/{layer}/backward") for n in aggregation)
    scopes = {name.split("/")[0] for name in nodes}
    assert {"tower_0", "tower_1", "graphsync"} <= scopes
    assert not any(re.match(r"graphsync/[^/]+$", name) for name in nodes)   # layers are scopes, not ops
    # the towers are as they were: their original ops are all still there, on their devices (ops
    # without one show where colocation put them)
    with open(FIXTURE, "rb") as f:
        original = tf1.MetaGraphDef.FromString(f.read()).graph_def
    for node in original.node:
        assert node.name in nodes, node.name
        assert nodes[node.name].device == node.device or not node.device, node.name


@tiers.full   # needs chromium, which .ci/run installs
def test_graph_dashboard_renders_in_headless_chromium(tensorboard, tmp_path):
    executable = _tool("chromium")
    screenshot = tmp_path / "tensorboard.png"
    args = [executable] + CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={screenshot}",
                                            f"{tensorboard}/#graphs&run=."]
    with _process_group(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        process.wait(180)
    assert screenshot.exists() and screenshot.stat().st_size > 20_000, "no screenshot, or a blank one"
    pixels = _decode_png(screenshot.read_bytes())
    assert pixels.shape[:2] == (900, 1400)
    header = pixels[10:50, 600:800].reshape(-1, pixels.shape[2])[:, :3]
    assert np.abs(header.astype(int) - [245, 124, 0]).max(axis=1).mean() < 30   # TensorBoard's orange bar
    canvas = pixels[100:850, 360:1380, :3]
    drawn = (canvas.astype(int).sum(axis=2) < 3 * 235).mean()
    assert drawn > 0.01, f"the graph area is empty ({drawn:.2%} drawn)"
    target = os.environ.get("GRAPHSYNC_SCREENSHOT")
    if target:
        shutil.copyfile(screenshot, os.path.join(ROOT, target))


def _decode_png(data: bytes) -> np.ndarray:
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as session:
        return session.run(tf.io.decode_png(data, channels=3))
