"""The ways TF1 code builds graphs, as switches a test turns on around what it builds and runs.

    v2               TensorFlow 2's defaults (graph mode): resource variables, control flow v2,
                     TensorShapes of ints
    v1               tf.compat.v1.disable_v2_behavior(): ref variables, Switch/Merge control
                     flow, TensorShapes of Dimension objects (tf_cnn_benchmarks, most TF1 scripts)
    control-flow-v1  tf.compat.v1.disable_control_flow_v2() alone

The switches are process-global: `behaviour(name)` restores TensorFlow 2's defaults (in graph
mode) when it ends; a subprocess started inside `in_children(name)` (tests/between_graph_worker.py)
turns the same switch on itself through `apply_from_environment()`.
"""
from __future__ import annotations

import contextlib
import os

import tensorflow as tf

tf1 = tf.compat.v1
BEHAVIOURS = ("v2", "v1", "control-flow-v1")
ENVIRONMENT = "GRAPHSYNC_TEST_BEHAVIOUR"


def switch_on(name: str) -> None:
    if name == "v1":
        tf1.disable_v2_behavior()
    elif name == "control-flow-v1":
        tf1.disable_control_flow_v2()
    elif name != "v2":
        raise ValueError(f"unknown behaviour {name!r}, not one of {BEHAVIOURS}")


def switch_off(name: str) -> None:
    if name == "v1":
        tf1.enable_v2_behavior()
        tf1.disable_eager_execution()
    elif name == "control-flow-v1":
        tf1.enable_control_flow_v2()


@contextlib.contextmanager
def behaviour(name: str):
    switch_on(name)
    try:
        yield name
    finally:
        switch_off(name)


@contextlib.contextmanager
def in_children(name: str):
    """Subprocesses started meanwhile (with a copy of os.environ) build their graphs this way."""
    saved = os.environ.get(ENVIRONMENT)
    os.environ[ENVIRONMENT] = name
    try:
        yield name
    finally:
        if saved is None:
            del os.environ[ENVIRONMENT]
        else:
            os.environ[ENVIRONMENT] = saved


def apply_from_environment() -> str:
    name = os.environ.get(ENVIRONMENT, "v2")
    switch_on(name)
    return name
