"""tf_keras.applications models, each as 2 uneven towers, the way users' multi-GPU scripts call
them: inspect (plan_towers, what `graphsync inspect` shows), rewrite, one training step. Anything
but a rewrite or a GraphsyncError fails the test, and the towers' outputs must equal one device
on the concatenated batch: a third call of the same model on the whole batch, outside the towers,
in the same graph and session (so with the same variables), which graphsync leaves alone. The
models are built in float64: in float32 at 32×32, normalizing 1×1 maps over 3 examples makes one
device disagree with itself (the batch in another order) by 0.1–48 %, so no comparison could mean
anything. The tolerance is 4× that device's own noise in float64 (a fourth call on the batch
reordered, put back in order), and at least 1e-9: measured errors 1e-13–7e-11, with and without
oneDNN, against an unsynchronized 0.6–1.7. A model still noisier than 1e-2 is checked for its
rewrite and step only, and none of the default ones is. ResNetRS* is built without its top
(include_top=False, pooling="avg"): the top's Dropout(0.25) makes each training-mode call random
(noise 0.46–0.49); without it ResNetRS50 measured 3.1e-10 against noise 6.9e-10, unsynchronized 1.
ResNetRS200 and larger drop whole blocks at random in training (stochastic depth): noise 0.95–1.4
even without the top, so they are checked for their rewrite and step only.

The default run takes two families' small models (inverted residuals with depthwise convolutions;
pre-activation residuals), CI's budget: DenseNet121 and InceptionV3 (concatenated branches) took
200 and 90 s more; set GRAPHSYNC_ALL_APPLICATIONS=1 for every model of tf_keras.applications
(about 40 minutes on 2 cores).
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import tf_keras
import whole_models

pytestmark = pytest.mark.full   # application sweeps (tf_keras applications, minutes)

tf1 = tf.compat.v1

SMALLEST = ["MobileNetV2", "ResNet50V2"]
EVERY = sorted(name for name in dir(tf_keras.applications) if name[0].isupper()
               and callable(getattr(tf_keras.applications, name)))
MODELS = EVERY if os.environ.get("GRAPHSYNC_ALL_APPLICATIONS") == "1" else SMALLEST
MIN_SIZE = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71, "NASNetMobile": 224, "NASNetLarge": 331}
SIZES = [1, 2]


def _build(name):
    size = MIN_SIZE.get(name, 32)
    graph = tf.Graph()
    floatx = tf_keras.backend.floatx()
    with graph.as_default():
        tf1.set_random_seed(0)
        kwargs = dict(input_shape=(size, size, 3), weights=None, classes=3)
        if name.startswith("ResNetRS"):   # its top's dropout makes one device disagree with itself
            kwargs.update(include_top=False, pooling="avg")
        tf_keras.backend.set_floatx("float64")   # float32 at 32×32 disagrees with itself by up to 5 %
        try:
            model = getattr(tf_keras.applications, name)(classifier_activation=None, **kwargs)
        except TypeError:
            model = getattr(tf_keras.applications, name)(**kwargs)
        finally:
            tf_keras.backend.set_floatx(floatx)
        inputs, outputs, losses = [], [], []
        for i, n in enumerate(SIZES):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"):
                x = tf1.placeholder(tf.float64, (n, size, size, 3), name="x")
                y = model(x, training=True)
                inputs.append(x), outputs.append(y), losses.append(tf.reduce_sum(tf.square(y)))
        with tf.device("/cpu:2"), tf1.name_scope("one_device"):
            whole = tf.concat(inputs, 0)
            order = np.random.RandomState(1).permutation(sum(SIZES))
            reference = model(whole, training=True)
            reordered = tf.gather(model(tf.gather(whole, order), training=True), np.argsort(order))
        opt = tf1.train.GradientDescentOptimizer(1e-3)
        grads = [opt.compute_gradients(loss) for loss in losses]
        pairs = [(tf.add_n([g[k][0] for g in grads]) / len(SIZES), grads[0][k][1])
                 for k in range(len(grads[0])) if grads[0][k][0] is not None]
        train = opt.apply_gradients(pairs)
        init = tf1.global_variables_initializer()
    return graph, inputs, outputs, (reference, reordered), train, init, size


@pytest.mark.parametrize("name", MODELS)
def test_application_rewrites_and_equals_one_device(name):
    whole_models.check(name, _build(name), SIZES, SMALLEST)
