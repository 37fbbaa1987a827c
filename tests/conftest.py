"""TensorFlow in TF1 graph mode with legacy Keras, before any test module imports it."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(__file__))


def _keras_2_named_tf_keras():
    """The tests build their Keras models with Keras 2 and call it `tf_keras`, the package that is
    Keras 2 from TensorFlow 2.16 on (tests/install.py installs it there). Up to 2.15 there is no such
    package: Keras 2 is TensorFlow's own `tf.keras`, which then answers to that name."""
    import importlib.util
    if importlib.util.find_spec("tf_keras") is None:
        import tensorflow as tf
        assert tf.keras.__version__.startswith("2."), \
            f"tf.keras is Keras {tf.keras.__version__} and tf_keras is missing: python tests/install.py"
        sys.modules["tf_keras"] = tf.keras


_keras_2_named_tf_keras()


def pytest_collection_finish(session):
    """Importing a test module (or a script it imports for its reference) must not switch
    TensorFlow's behaviour for the whole run: every test not under tests/behaviours.py's switch
    would then build its graphs the TF1 way, and TensorFlow 2's defaults would go untested."""
    import pytest
    import tensorflow as tf
    tf1 = tf.compat.v1
    switched = [name for name, on in (("resource variables", tf1.resource_variables_enabled()),
                                      ("control flow v2", tf1.control_flow_v2_enabled()),
                                      ("TensorShape v2", type(tf.TensorShape([1])[0]) is int)) if not on]
    if switched:
        raise pytest.UsageError(f"a test module switched off {', '.join(switched)} at import: "
                                "switch behaviours inside tests (tests/behaviours.py)")


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="run the full tier too (tests marked full: sweeps, matrices, repeated and random "
                          "runs); CI runs it, the README's test command runs the fast tier")


def pytest_collection_modifyitems(config, items):
    """The fast tier by default: tests marked `full` are deselected (not skipped: nothing is
    reported as a case that did not run) unless --full is given."""
    if config.getoption("--full"):
        return
    fast, full = [], []
    for item in items:
        (full if item.get_closest_marker("full") else fast).append(item)
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = fast
