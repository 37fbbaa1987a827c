"""Installs graphsync and what its tests need into the Python running this script, leaving the
TensorFlow found there, and every package it requires, as they are: the README's test command.

`pip install '.[test]'` alone cannot promise that. tf_keras 2.16 and later requires the TensorFlow of
its own minor version, and today's matplotlib a numpy newer than TensorFlow 2.12 allows; pip
resolves either by upgrading TensorFlow, Keras and numpy under the user's code. So:

- the installed TensorFlow and the installed packages it requires, transitively (Keras, numpy,
  protobuf, tensorboard, …), go to pip as constraints, at the versions found;
- tf_keras is asked for only where `tf.keras` is Keras 3 (TensorFlow 2.16 on), at TensorFlow's
  minor version (without its dependencies where TensorFlow is installed as tensorflow-cpu: tf_keras
  requires the package named tensorflow); up to 2.15, `tf.keras` is Keras 2 itself;
- with no TensorFlow yet, the newest one comes with graphsync's `tensorflow` extra.

    python tests/install.py [PIP-ARGS…]     # e.g. -e for an editable install
"""
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_KERAS_3 = (2, 16)   # the first TensorFlow whose tf.keras is Keras 3


def _requirements():
    """graphsync/requirements.py, loaded from its file: importing the graphsync package needs the
    TensorFlow this script may be about to install."""
    spec = importlib.util.spec_from_file_location("graphsync_requirements",
                                                  os.path.join(ROOT, "graphsync", "requirements.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str):
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_tensorflow():
    """The installed TensorFlow distribution (under whichever name it was published), or None."""
    return next(filter(None, map(_installed, _requirements().TENSORFLOW_DISTRIBUTIONS)), None)


def requirement_closure(distribution) -> dict:
    """Canonical name → version of `distribution` and of every installed package it requires,
    transitively (optional extras' requirements aside)."""
    found, pending = {}, [distribution]
    while pending:
        dist = pending.pop()
        name = _canonical(dist.metadata["Name"])
        if name in found:
            continue
        found[name] = dist.version
        for requirement in dist.requires or ():
            if "extra ==" in requirement.replace('"', "").replace("'", ""):
                continue
            required = _installed(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
            if required is not None:
                pending.append(required)
    return found


def pip_arguments(tensorflow) -> tuple:
    """(requirements, constraints, requirements to install without their own) for this environment.

    tf_keras requires the package named `tensorflow`: where TensorFlow is installed under another
    name (tensorflow-cpu), it goes in on its own, without dependencies, so that pip does not add a
    second TensorFlow over the first."""
    if tensorflow is None:
        return [f"{ROOT}[tensorflow,test]", "tf_keras"], {}, []
    kept = requirement_closure(tensorflow)
    for name in ("tf-keras", "keras"):      # a Keras installed beside TensorFlow stays as it is too
        if _installed(name) is not None:
            kept.setdefault(name, _installed(name).version)
    requirements, alone = [f"{ROOT}[test]"], []
    major, minor = (int(part) for part in tensorflow.version.split(".")[:2])
    if (major, minor) >= FIRST_KERAS_3 and "tf-keras" not in kept:
        keras = f"tf_keras>={major}.{minor},<{major}.{minor + 1}"
        (requirements if _canonical(tensorflow.metadata["Name"]) == "tensorflow" else alone).append(keras)
    return requirements, kept, alone


def main(extra_pip_arguments: list) -> int:
    requirements, kept, alone = pip_arguments(installed_tensorflow())
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("".join(f"{name}=={version}\n" for name, version in sorted(kept.items())))
    pip = [sys.executable, "-m", "pip", "install", *extra_pip_arguments]
    try:
        command = [*pip, *requirements, "--constraint", constraints.name]
        print("+", " ".join(command[2:]), f"({len(kept)} installed packages kept as they are)", flush=True)
        status = subprocess.call(command)
    finally:
        os.unlink(constraints.name)
    if status == 0 and alone:
        print("+", " ".join([*pip[2:], "--no-deps", *alone]), flush=True)
        status = subprocess.call([*pip, "--no-deps", *alone])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
