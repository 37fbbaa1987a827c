"""Step time of a TF2 `model.fit` under MirroredStrategy: `graphsync run` against plain python.

    python benchmarks/tf2_steps.py [--replicas 2] [--rounds 3] [--steps 30] [--strategy gather|allreduce]

Each round trains the same tf_keras conv net (6 conv–batch-norm–ReLU blocks, 32×32×16, 16 images
per replica) once under python and once under `graphsync run`, one after the other, in fresh
processes; a run times its steps after two warm-up epochs (Keras' own callback clock, so tracing
and the rewrite are not counted). The figure is the median over rounds of each run's median step
time, and their ratio: both sides share this machine's load alike.

Logical CPU devices share one thread pool: a synchronized step runs the replicas in lockstep
where an unsynchronized one may run them one after the other, so the ratio is what graphsync adds
on this machine, an upper bound for devices that each have their own compute.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import os, sys, time, json
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf, tf_keras as keras
replicas, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * replicas)
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
with strategy.scope():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    h = inputs
    for i in range(6):
        h = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(h)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
batch = 16 * replicas
x = np.random.RandomState(0).rand(batch * steps, 32, 32, 3).astype("float32")
y = np.random.RandomState(1).randint(0, 10, batch * steps)

class Clock(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()
    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)

model.fit(x[:batch * 4], y[:batch * 4], batch_size=batch, epochs=2, verbose=0)   # traces, warms up
clock = Clock(); clock.times = []
model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[clock])
json.dump(sorted(clock.times)[len(clock.times) // 2], open(out, "w"))
'''


def run(graphsync: bool, replicas: int, steps: int, strategy: str = "gather") -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "child.py"), os.path.join(tmp, "out.json")
        with open(script, "w") as f:
            f.write(CHILD)
        command = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())", "run", "-q",
                                             "--strategy", strategy] if graphsync else [sys.executable]
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
        subprocess.run(command + [script, str(replicas), str(steps), out], check=True, env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--strategy", choices=["gather", "allreduce"], default="gather")
    args = parser.parse_args()
    plain, synced = [], []
    for _ in range(args.rounds):
        plain.append(run(False, args.replicas, args.steps))
        synced.append(run(True, args.replicas, args.steps, args.strategy))
    p, s = statistics.median(plain), statistics.median(synced)
    print(f"replicas {args.replicas}, {args.strategy}: python {p * 1e3:.1f} ms/step, graphsync run {s * 1e3:.1f} ms/step, "
          f"ratio {s / p:.2f} (medians of {args.rounds} rounds × {args.steps} steps)")


if __name__ == "__main__":
    main()
