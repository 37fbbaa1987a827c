"""TF2's ParameterServerStrategy, as its tutorial writes it: the chief (this script, from TF_CONFIG)
schedules a tf.function step with `strategy.run` through a ClusterCoordinator onto workers that
step asynchronously, the variables on the parameter servers. A small conv net with a batch norm.

    python ps_strategy_train.py    (TF_CONFIG: the chief of a cluster of workers and ps tasks)

Prints `trained` once the scheduled steps are done."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras   # Keras 2: TensorFlow's own up to 2.15, tf_keras from 2.16 (TF_USE_LEGACY_KERAS)

strategy = tf.distribute.experimental.ParameterServerStrategy(
    tf.distribute.cluster_resolver.TFConfigClusterResolver())
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    model = keras.Sequential([keras.layers.Conv2D(4, 3, use_bias=False, input_shape=(8, 8, 3)),
                              keras.layers.BatchNormalization(), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)
rng = np.random.RandomState(0)
x, y = rng.normal(size=(16, 8, 8, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")


def dataset_fn():
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4)


@tf.function
def train_step(iterator):
    def step_fn(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.run(step_fn, args=(next(iterator),))


iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
for _ in range(4):
    coordinator.schedule(train_step, args=(iterator,))
coordinator.join()
print("trained", flush=True)
