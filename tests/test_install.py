"""Installing graphsync changes nothing the user has, and a Python without a TensorFlow graphsync
supports is told so in one line.

The dry runs ask pip, in the Python running the tests, what `pip install .` and the README's test
command (tests/install.py) would install: nothing already installed may be upgraded, downgraded or
replaced; only what is missing is added. CI runs this module in the environment holding the oldest
supported TensorFlow too (.ci/run), where pip would otherwise take TensorFlow 2.21, Keras 3 and
numpy 2 for tf_keras and matplotlib.
"""
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

import tiers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [tiers.plumbing, tiers.environment]   # tiers.py: no kernel of its own, run on every TensorFlow


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dry_run(command: list, tmp_path) -> dict:
    """Canonical name → version of each distribution pip would install."""
    report = tmp_path / "report.json"
    done = subprocess.run([*command, "--dry-run", "--quiet", "--report", str(report)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {_canonical(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


def _changed(would_install: dict) -> list:
    """The installed distributions the install would touch (graphsync itself aside)."""
    installed = {_canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    return sorted(f"{name} {installed[name]} -> {version}" for name, version in would_install.items()
                  if name in installed and name != "graphsync")


def test_installing_the_package_changes_no_installed_package(tmp_path):
    would_install = _dry_run([sys.executable, "-m", "pip", "install", "."], tmp_path)
    assert "graphsync" in would_install
    assert not _changed(would_install)
    assert not {"tensorflow", "tensorflow-cpu", "keras", "tf-keras", "numpy"} & set(would_install)


@tiers.full
def test_the_test_install_changes_no_installed_package(tmp_path):
    """The README's test command's install step, as a dry run: the same promise for the test extras."""
    would_install = _dry_run([sys.executable, os.path.join(ROOT, "tests", "install.py")], tmp_path)
    assert "graphsync" in would_install
    assert not _changed(would_install)


def _fake_site(tmp_path, version):
    """A folder to put first on sys.path: a `tensorflow` of `version` (metadata and module), or
    none at all (None)."""
    site = tmp_path / "site"
    site.mkdir()
    if version is not None:
        (site / "tensorflow").mkdir()
        (site / "tensorflow" / "__init__.py").write_text(f"__version__ = {version!r}\n")
        info = site / f"tensorflow-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorflow\nVersion: {version}\n")
    return site


def _isolated(site, code: list, args=()) -> subprocess.CompletedProcess:
    """`code` run by a Python without site-packages (-S): only the fake site and the repository."""
    prelude = f"import sys; sys.path[:0] = [{str(site)!r}, {ROOT!r}]; sys.argv[1:] = {list(args)!r}; "
    return subprocess.run([sys.executable, "-S", *code[:-1], prelude + code[-1]], capture_output=True,
                          text=True, timeout=60, cwd=str(site))


@pytest.mark.parametrize("version,said", [
    (None, "graphsync needs TensorFlow 2.12 or newer, and this Python has none: "
           "pip install 'graphsync[tensorflow]' (or tensorflow-cpu)"),
    ("2.11.1", "graphsync needs TensorFlow 2.12 or newer; this Python has 2.11.1"),
])
def test_without_a_supported_tensorflow_every_entry_point_says_so_in_one_line(tmp_path, version, said):
    site = _fake_site(tmp_path, version)
    imported = _isolated(site, ["-c", "import graphsync"])
    assert imported.returncode != 0 and imported.stderr.strip().splitlines()[-1] == f"ImportError: {said}"

    console_script = _isolated(site, ["-c", "import cli.main; cli.main.main()"], ["rewrite", "x.meta", "-o", "y"])
    assert (console_script.returncode, console_script.stderr) == (1, f"graphsync: error: {said}\n")

    module = subprocess.run([sys.executable, "-S", "-m", "graphsync", "rewrite", "x.meta", "-o", "y"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), ROOT])))
    assert (module.returncode, module.stderr) == (1, f"graphsync: error: {said}\n")
    assert not list(site.glob("y*")) and not os.path.exists(os.path.join(ROOT, "y"))


def test_a_supported_tensorflow_passes_the_check(tmp_path):
    site = _fake_site(tmp_path, "2.12.0")
    imported = _isolated(site, ["-c", "import graphsync.requirements as r; print(r.tensorflow_problem())"])
    assert imported.stdout == "None\n", imported.stderr
