"""A third-party trainer, unchanged: tensorpack 0.11's multi-GPU trainers own the graph, the towers,
the session and the loop. tests/test_run.py runs this script under `graphsync run` and plain python.

    python train_tensorpack.py OUT [--trainer replicated|ps|simple]... [--towers 2]

One step of one epoch with each trainer asked for, each on its own graph; the trained variables are
in OUT/<trainer>'s checkpoint (ModelSaver). The data are BATCH fixed examples: `simple` (one
device) trains on all of them as one batch, the multi-GPU trainers on BATCH // towers per tower,
one dequeued batch each (in whatever order the towers dequeue them: one step of batch norm with
averaged gradients does not depend on it).

The trainers place tower k on /gpu:k; on a machine without GPUs the session needs soft placement
(tensorpack's default session config has it; this one also asks for several CPU devices).
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

from tensorpack import (  # noqa: E402
    BatchNorm, Conv2D, DataFromList, FullyConnected, GlobalAvgPooling, InferenceRunner, ModelDesc, ModelSaver,
    QueueInput, ScalarStats, SimpleTrainer, SyncMultiGPUTrainerParameterServer, SyncMultiGPUTrainerReplicated,
    TrainConfig, launch_train_with_config, logger)
from tensorpack.tfutils.collection import freeze_collection  # noqa: E402
from tensorpack.tfutils.tower import get_current_tower_context  # noqa: E402

BATCH = 8
CLASSES = 5
CONFIG = tf1.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=True,
                         inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)


def data(seed=0):
    """Images whose mean drifts along the batch (so each tower's statistics differ), and labels."""
    rng = np.random.RandomState(seed)
    images = rng.randn(BATCH, 8, 8, 3).astype(np.float32) + np.linspace(-2, 2, BATCH, dtype=np.float32)[:, None, None, None]
    return images, rng.randint(0, CLASSES, BATCH).astype(np.int32)


class Model(ModelDesc):
    """conv → tensorpack BatchNorm → relu → conv → tf.layers batch norm (moments) → relu → conv →
    tensorpack BatchNorm updating its moving averages inside the forward pass → relu → dense.
    bn1's updates run by tensorpack's RunUpdateOps callback, bn3's with the output, only in the
    main tower; the InferenceRunner's tower uses them all in inference mode."""

    def inputs(self):
        return [tf.TensorSpec((None, 8, 8, 3), tf.float32, "images"), tf.TensorSpec((None,), tf.int32, "labels")]

    def build_graph(self, images, labels):
        h = Conv2D("conv1", images, 4, 3, use_bias=False, kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
        h = tf.nn.relu(BatchNorm("bn1", h))
        h = Conv2D("conv2", h, 6, 3, use_bias=False, kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
        # like tensorpack's own BatchNorm, only the main tower's moving-average updates go to UPDATE_OPS
        # (with the parameter-server trainer's shared variables, every tower's would update them)
        context = get_current_tower_context()
        with freeze_collection([] if context.is_main_training_tower else [tf1.GraphKeys.UPDATE_OPS]):
            h = tf1.layers.batch_normalization(h, training=context.is_training, fused=False, name="bn2",
                                               gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=3))
        h = tf.nn.relu(h)
        h = Conv2D("conv3", h, 6, 3, use_bias=False, kernel_initializer=tf1.glorot_uniform_initializer(seed=5))
        h = tf.nn.relu(BatchNorm("bn3", h, ema_update="internal"))
        logits = FullyConnected("logits", GlobalAvgPooling("gap", h), CLASSES,
                                kernel_initializer=tf1.glorot_uniform_initializer(seed=4))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits), name="cost")

    def optimizer(self):
        return tf1.train.GradientDescentOptimizer(0.5)


TRAINERS = {"replicated": lambda towers: SyncMultiGPUTrainerReplicated(towers),
            "ps": lambda towers: SyncMultiGPUTrainerParameterServer(towers, ps_device="cpu"),
            "simple": lambda towers: SimpleTrainer()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--trainer", action="append", choices=sorted(TRAINERS))
    parser.add_argument("--towers", type=int, default=2)
    args = parser.parse_args()
    images, labels = data()
    for trainer in args.trainer or ["replicated"]:
        towers = 1 if trainer == "simple" else args.towers
        per_tower = BATCH // towers
        batches = [[images[i:i + per_tower], labels[i:i + per_tower]] for i in range(0, BATCH, per_tower)]
        logger.set_logger_dir(os.path.join(args.out, trainer), action="d")
        with tf.Graph().as_default():
            config = TrainConfig(model=Model(), data=QueueInput(DataFromList(batches, shuffle=False)),
                                 callbacks=[ModelSaver(), InferenceRunner(DataFromList(batches, shuffle=False), ScalarStats("cost"))],
                                 session_config=CONFIG, steps_per_epoch=1, max_epoch=1)
            launch_train_with_config(config, TRAINERS[trainer](towers))
        print(f"tensorpack trained {towers} tower(s) with {trainer}")


if __name__ == "__main__":
    main()
