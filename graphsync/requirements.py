"""What graphsync needs of the Python it runs in, said in one line before anything fails deeper.

graphsync does not install TensorFlow itself (setup.cfg lists it under the `tensorflow` extra):
TensorFlow is published under several names (tensorflow, tensorflow-cpu, …) that pip cannot tell
apart, and a dependency on one of them would install it beside, or over, the user's own. So the
version is checked here, at import, without importing TensorFlow (the command line keeps its
start-up lines off the terminal until a command needs it).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

MINIMUM_TENSORFLOW = (2, 12)
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                            "tensorflow-macos", "tf-nightly", "tf-nightly-cpu", "intel-tensorflow")


def tensorflow_version() -> str | None:
    """The version of the TensorFlow this Python imports, or None when it has none; "" when it
    has one whose version its files do not say (a build from source)."""
    if "tensorflow" in sys.modules:
        module = sys.modules["tensorflow"]
        return None if module is None else getattr(module, "__version__", "")
    if importlib.util.find_spec("tensorflow") is None:
        return None
    for name in TENSORFLOW_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def _release(version: str) -> tuple:
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())   # "2.12.0rc1", "2.21.0-dev"
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers)


def tensorflow_problem() -> str | None:
    """One line saying what is missing, or None when this Python's TensorFlow will do."""
    need = "graphsync needs TensorFlow {}.{} or newer".format(*MINIMUM_TENSORFLOW)
    install = "pip install 'graphsync[tensorflow]' (or tensorflow-cpu)"
    version = tensorflow_version()
    if version is None:
        return f"{need}, and this Python has none: {install}"
    if version and _release(version) < MINIMUM_TENSORFLOW:
        return f"{need}; this Python has {version}"
    return None
