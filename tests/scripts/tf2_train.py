"""A TF2 training script that knows nothing of graphsync (unless --autosync adds the one line): a small conv net with batch norm trained
for a few steps under tf.distribute.MirroredStrategy, then the same steps on one device without
a strategy (the reference: the whole batch on one device).

    python tf2_train.py OUT.npz --api fit|loop|keras3 --devices N [options]

`--api fit` trains with Keras 2's model.fit (tf.keras: tf_keras from TensorFlow 2.16), `loop` with a custom loop (strategy.run of a
tf.function step with a GradientTape, loss averaged over the global batch), `keras3` with Keras
3's model.fit. OUT.npz holds, for the strategy run and the reference: every weight after the
steps, and the moving mean and variance of every batch norm as each replica holds them.
"""
import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--api", choices=["fit", "loop", "keras3"], default="fit")
parser.add_argument("--devices", type=int, default=2, help="MirroredStrategy's; 0: none (the reference only)")
parser.add_argument("--multiworker", action="store_true",
                    help="MultiWorkerMirroredStrategy over TF_CONFIG's workers instead (one replica each)")
parser.add_argument("--local", type=int, default=1,
                    help="under --multiworker: replicas per worker (logical CPUs, as if each machine had N GPUs)")
parser.add_argument("--dataset", choices=["function", "experimental"], default="function",
                    help="the multi-worker loop's dataset: distribute_datasets_from_function (each worker its "
                         "shard) or experimental_distribute_dataset (each global batch split)")
parser.add_argument("--batch", type=int, default=8, help="global batch")
parser.add_argument("--examples", type=int, default=24, help="a partial last batch when not a multiple of --batch")
parser.add_argument("--flag", choices=["python", "tensor"], default="python", help="the loop's training flag")
parser.add_argument("--channels-first", action="store_true")
parser.add_argument("--mixed", action="store_true", help="mixed_float16")
parser.add_argument("--nested", action="store_true", help="the batch norms inside a nested model and a custom layer")
parser.add_argument("--synchronized", action="store_true", help="Keras' own synchronized batch norm")
parser.add_argument("--autosync", action="store_true", help="the one line: graphsync.autosync() first")
parser.add_argument("--decoder", action="store_true",
                    help="the second batch norm after a stride-2 transposed convolution (Conv2DBackpropInput)")
parser.add_argument("--save", metavar="DIR",
                    help="fit with a ModelCheckpoint to DIR/checkpoint (SavedModel), then model.save(DIR/model) "
                         "inside the strategy's scope, and the trained model's predictions kept")
parser.add_argument("--central", action="store_true",
                    help="CentralStorageStrategy (variables on the CPU, compute on --devices) instead of Mirrored")
parser.add_argument("--one-device", action="store_true", help="OneDeviceStrategy on /cpu:0 (with --devices 1)")
parser.add_argument("--evaluate", action="store_true",
                    help="model.evaluate on every example after training, under the strategy: its loss kept")
parser.add_argument("--on-batch", action="store_true", help="train_on_batch per batch instead of fit")
args = parser.parse_args()
if args.autosync:
    import graphsync
    graphsync.autosync()

if args.api != "keras3":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.api == "keras3":
    import keras
else:
    keras = tf.keras   # Keras 2: TensorFlow's own up to 2.15, tf_keras from 2.16 (TF_USE_LEGACY_KERAS)

if args.multiworker:
    if args.local > 1:   # TensorFlow gives a CPU-only worker one replica: these tests' workers have N "GPUs"
        from tensorflow.python.distribute import collective_all_reduce_strategy
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * args.local)
        collective_all_reduce_strategy.CollectiveAllReduceExtended._initialize_local_devices = (
            lambda self, resolver, worker: (tuple(f"{worker}/device:CPU:{i}" for i in range(args.local)), "CPU"))
    multiworker = tf.distribute.MultiWorkerMirroredStrategy()   # before anything touches the runtime
else:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * max(args.devices, 1))
if args.mixed:
    keras.mixed_precision.set_global_policy("mixed_float16")
axis = 1 if args.channels_first else -1
data_format = "channels_first" if args.channels_first else "channels_last"


class Block(keras.layers.Layer):
    """A custom layer holding a batch norm."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, padding="same", data_format=data_format)
        self.bn = keras.layers.BatchNormalization(axis=axis, synchronized=args.synchronized)

    def call(self, x, training=None):
        return tf.nn.relu(self.bn(self.conv(x), training=training))


def build():
    keras.utils.set_random_seed(1)
    shape = (3, 8, 8) if args.channels_first else (8, 8, 3)
    inputs = keras.Input(shape)
    h = keras.layers.Conv2D(6, 3, data_format=data_format)(inputs)
    h = keras.layers.BatchNormalization(axis=axis, synchronized=args.synchronized)(h)
    h = keras.layers.ReLU()(h)
    if args.nested:
        inner_in = keras.Input(h.shape[1:])
        inner = keras.Model(inner_in, Block()(inner_in), name="inner")
        h = inner(h)
    else:
        if args.decoder:
            h = keras.layers.Conv2DTranspose(4, 3, 2, padding="same", data_format=data_format)(h)
        else:
            h = keras.layers.Conv2D(4, 3, padding="same", data_format=data_format)(h)
        h = keras.layers.BatchNormalization(axis=axis, momentum=0.9, synchronized=args.synchronized)(h)
        h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D(data_format=data_format)(h)
    outputs = keras.layers.Dense(2, dtype="float32")(h)
    return keras.Model(inputs, outputs)


rng = np.random.RandomState(0)
x = rng.normal(1.0, 2.0, (args.examples, 8, 8, 3)).astype("float32")
if args.channels_first:
    x = x.transpose(0, 3, 1, 2).copy()
y = rng.normal(size=(args.examples, 2)).astype("float32")


def batch_norms(model):
    """Every batch norm, nested ones included, in the model's order."""
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if isinstance(layer, keras.layers.BatchNormalization)]


def replica_values(variable):
    """Each replica's copy of a variable (one when not distributed)."""
    v = getattr(variable, "_value", variable)   # Keras 3 wraps the tf.Variable
    return [np.array(t.numpy()) for t in getattr(v, "values", [v])]


def multiworker_or_none():
    return multiworker if args.multiworker else None


def train(strategy):
    with strategy.scope():
        model = build()
        optimizer = keras.optimizers.SGD(0.1)
        if args.api != "loop":
            model.compile(optimizer, "mse")
    if args.api != "loop" and strategy is multiworker_or_none():
        options = tf.data.Options()   # each worker its share of every global batch
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).with_options(options),
                  epochs=1, verbose=0)
    elif args.api != "loop" and args.on_batch:
        for start in range(0, len(x), args.batch):
            model.train_on_batch(x[start:start + args.batch], y[start:start + args.batch])
    elif args.api != "loop" and args.save and strategy is not tf.distribute.get_strategy():
        checkpoints = [keras.callbacks.ModelCheckpoint(os.path.join(args.save, "checkpoint")),   # SavedModel
                       keras.callbacks.ModelCheckpoint(os.path.join(args.save, "checkpoint.h5"))]
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=checkpoints)
        with strategy.scope():
            model.save(os.path.join(args.save, "model"))
        np.save(os.path.join(args.save, "predictions.npy"), model.predict(x, batch_size=args.batch, verbose=0))
    elif args.api != "loop":
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False)
    elif strategy is multiworker_or_none():
        tutorial_loop(strategy, model, optimizer)
    else:
        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch))
        flag = tf.constant(True) if args.flag == "tensor" else True

        def step(xb, yb):
            with tf.GradientTape() as tape:
                out = model(xb, training=flag)
                per_example = tf.reduce_mean(tf.square(tf.cast(out, tf.float32) - yb), axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def train_step(xb, yb):
            return strategy.run(step, args=(xb, yb))

        for xb, yb in dataset:
            train_step(xb, yb)
    weights = [np.array(w) for w in model.get_weights()]
    moving = [[replica_values(bn.moving_mean), replica_values(bn.moving_variance)] for bn in batch_norms(model)]
    if args.evaluate:
        evaluations.append(model.evaluate(x, y, batch_size=args.batch, verbose=0))
    return weights, moving


evaluations = []   # --evaluate: the loss model.evaluate gives after each training (strategy, reference)


def tutorial_loop(strategy, model, optimizer):
    """TensorFlow's tutorial "Custom training loop with Keras and MultiWorkerMirroredStrategy": the
    dataset from distribute_datasets_from_function (each worker its shard; or --dataset experimental:
    each global batch split among the replicas), the step a tf.function defined outside the
    strategy's scope that takes the iterator, strategy.run inside it. Every step's examples, over
    all replicas, are the reference's batch (in another order); the last may be partial."""
    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).shard(
            context.num_input_pipelines, context.input_pipeline_id).batch(context.get_per_replica_batch_size(args.batch))

    if args.dataset == "function":
        iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    else:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        iterator = iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).with_options(options)))

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            xb, yb = inputs
            with tf.GradientTape() as tape:
                out = model(xb, training=True)
                per_example = tf.reduce_mean(tf.square(out - yb), axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(step_fn, args=(next(iterator),))

    for _ in range(-(-len(x) // args.batch)):
        train_step(iterator)


if args.multiworker:
    distributed = train(multiworker)
elif args.devices >= 1:
    devices = [f"/cpu:{i}" for i in range(args.devices)]
    distributed = train(tf.distribute.experimental.CentralStorageStrategy(devices, parameter_device="/cpu:0")
                        if args.central else tf.distribute.OneDeviceStrategy(devices[0]) if args.one_device
                        else tf.distribute.MirroredStrategy(devices))
else:
    distributed = None
with tf.device("/cpu:0"):
    reference = train(tf.distribute.get_strategy())

result = {}
for tag, run in (("strategy", distributed), ("reference", reference)):
    if run is None:
        continue
    weights, moving = run
    for i, w in enumerate(weights):
        result[f"{tag}/weight_{i}"] = w
    for i, (means, variances) in enumerate(moving):
        for r, (m, v) in enumerate(zip(means, variances)):
            result[f"{tag}/bn_{i}/replica_{r}/mean"] = m
            result[f"{tag}/bn_{i}/replica_{r}/variance"] = v
for tag, loss in zip(("strategy", "reference"), evaluations):
    result[f"evaluation/{tag}"] = np.float64(loss)
np.savez(args.out, **result)
print(f"trained {len(reference[0])} weights, {len(reference[1])} batch norms", file=sys.stderr)
