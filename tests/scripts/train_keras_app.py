"""An unchanged MonitoredTrainingSession script around a tf_keras application: one MobileNetV2
model object (alpha 0.35, 32×32 input, 52 batch norms) called on every tower of the CIFAR10
multi-GPU pattern, only tower 0's batch-norm updates run with the train op (Keras keeps them per
call: `model.get_updates_for(inputs)`). tests/test_run.py runs it under `graphsync run` and
plain python.

    python train_keras_app.py OUT [--sizes 3,5]...

One training step for each --sizes asked for (`--sizes 8`: one device), each on its own graph from
the same initial weights (keras.utils.set_random_seed). Saves OUT (.npz): every weight of the
model before (`SIZES/before/NAME`) and after (`SIZES/after/NAME`) the step.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # tf.keras is Keras 2 (tf_keras) from TensorFlow 2.16 on too
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras   # Keras 2: TensorFlow's own up to 2.15, tf_keras from 2.16 (TF_USE_LEGACY_KERAS)

tf1 = tf.compat.v1
tf1.disable_eager_execution()


CONFIG = tf1.ConfigProto(device_count={"CPU": 4}, inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
CONFIG.graph_options.rewrite_options.disable_meta_optimizer = True   # grappler: 3–4 s per graph of 8k ops
IMAGE = (32, 32, 3)
CLASSES = 5


def data(total, seed=0):
    """Images whose mean drifts along the batch (so each tower's statistics differ), and labels."""
    rng = np.random.RandomState(seed)
    images = rng.randn(total, *IMAGE).astype(np.float32) + np.linspace(-2, 2, total, dtype=np.float32)[:, None, None, None]
    return images, rng.randint(0, CLASSES, total).astype(np.int32)


def build(sizes, learning_rate=0.1):
    """The model and its towers in the default graph: (model, train_op)."""
    images, labels = data(sum(sizes))
    model = keras.applications.MobileNetV2(input_shape=IMAGE, alpha=0.35, weights=None, classes=CLASSES,
                                              classifier_activation=None)
    optimizer = tf1.train.GradientDescentOptimizer(learning_rate)
    tower_grads, updates, start = [], [], 0
    for i, size in enumerate(sizes):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"):
            x = tf.constant(images[start:start + size])
            logits = model(x, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.constant(labels[start:start + size]), logits=logits)
            tower_grads.append(optimizer.compute_gradients(tf.reduce_sum(per_example) / sum(sizes),
                                                           var_list=model.trainable_weights))
            if i == 0:
                updates = model.get_updates_for(x)
            start += size
    summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
    with tf.control_dependencies(updates):
        train_op = optimizer.apply_gradients(summed, global_step=tf1.train.get_or_create_global_step())
    return model, train_op


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sizes", action="append")
    args = parser.parse_args()
    saved = {}
    for text in args.sizes or ["3,5"]:
        sizes = [int(s) for s in text.split(",")]
        with tf.Graph().as_default():
            keras.utils.set_random_seed(0)
            model, train_op = build(sizes)
            weights = {v.name: v for v in model.weights}
            with tf1.train.MonitoredTrainingSession(config=CONFIG, log_step_count_steps=None,
                                                    save_checkpoint_secs=None, save_summaries_steps=None) as sess:
                before = sess.run(weights)
                sess.run(train_op)
                after = sess.run(weights)
        saved.update({f"{text}/before/{k}": v for k, v in before.items()})
        saved.update({f"{text}/after/{k}": v for k, v in after.items()})
        print(f"trained {len(weights)} weights of {model.name} on towers of {sizes}")
    np.savez(args.out, **saved)


if __name__ == "__main__":
    main()
