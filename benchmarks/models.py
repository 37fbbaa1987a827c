"""The two small architectures the step-overhead and traffic benchmarks train, written once against a
builder so the same network is built

  * as a TF1 multi-tower graph (`TowerBuilder`): towers built in lockstep, tower i in `tower_<i>/` on
    /cpu:<i>, variables on /cpu:0, with one of three batch norms:
      fused    FusedBatchNormV3 per tower (what tf_keras/tf.compat.v1.layers emit; graphsync input)
      moments  tf.nn.moments + tf.nn.batch_normalization per tower (unsynchronized, unfused)
      byhand   the seed's approach: concatenate all towers' activations on /cpu:0, tf.nn.moments there,
               tf.nn.batch_normalization per tower with the global statistics
  * as a tf_keras functional model (`KerasBuilder`) with BatchNormalization(synchronized=...), for the
    peer under MirroredStrategy.

resnet: 32×32×3 input, stem + 3 stages of one basic residual block (16/32/64 channels), 9 batch norms,
        global pooling, dense classifier (10 classes).
segnet: 32×32×3 input, U-Net-style encoder–decoder (16/32/64 channels, two convs per level, skip
        concatenations, nearest upsampling), 9 batch norms, per-pixel classifier (5 classes).
unet64: the segmentation-sized model: 64×64×3 input, U-Net with 32/64/128 channels, 10 batch norms,
        per-pixel classifier (5 classes); its decoder upsamples by nearest-neighbour resizing.
unet64t: unet64 whose decoder upsamples by a stride-2 3×3 transposed convolution instead (as
        tf.compat.v1.layers.conv2d_transpose builds it: a `Conv2DBackpropInput` op in the forward, its
        output shape stacked from the input's batch), same channels, same 10 batch norms.
deeplab: DeepLab-like: 64×64×3 input, ResNet backbone of basic blocks (32/64/128 channels, the last
        stage dilated: output stride 4), ASPP-like head, 12 batch norms, logits upsampled to 64×64.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
EPSILON = 1e-3
MOMENTUM = 0.9


def resnet(b, x):
    h = b.relu(b.bn(b.conv(x, 16, 3, 1, "stem"), "stem_bn"))
    for stage, (channels, stride) in enumerate([(16, 1), (32, 2), (64, 2)]):
        name = f"stage{stage}"
        y = b.relu(b.bn(b.conv(h, channels, 3, stride, name + "/conv1"), name + "/bn1"))
        y = b.bn(b.conv(y, channels, 3, 1, name + "/conv2"), name + "/bn2")
        if stride != 1:
            h = b.bn(b.conv(h, channels, 1, stride, name + "/proj"), name + "/proj_bn")
        h = b.relu(b.add(y, h))
    return b.head(h, 10)


def _double(b, h, channels, name):
    """Two 3×3 convolutions, each with its batch norm and ReLU: a U-Net's block."""
    h = b.relu(b.bn(b.conv(h, channels, 3, 1, name + "/conv1"), name + "/bn1"))
    return b.relu(b.bn(b.conv(h, channels, 3, 1, name + "/conv2"), name + "/bn2"))


def segnet(b, x):
    e1 = _double(b, x, 16, "enc1")                                               # 32×32
    e2 = _double(b, b.relu(b.bn(b.conv(e1, 32, 3, 2, "down1"), "down1_bn")), 32, "enc2")  # 16×16
    e3 = b.relu(b.bn(b.conv(e2, 64, 3, 2, "down2"), "down2_bn"))                 # 8×8
    d2 = _double(b, b.cat(b.up(e3), e2), 32, "dec2")                             # 16×16
    d1 = b.relu(b.bn(b.conv(b.cat(b.up(d2), e1), 16, 3, 1, "dec1"), "dec1_bn"))  # 32×32
    return b.conv(d1, 5, 1, 1, "classifier")


def _unet64(b, x, up):
    """The 64×64 U-Net, its decoder upsampling by `up(h, channels, name)`."""
    e1 = _double(b, x, 32, "enc1")                                               # 64×64
    e2 = _double(b, b.relu(b.bn(b.conv(e1, 64, 3, 2, "down1"), "down1_bn")), 64, "enc2")  # 32×32
    e3 = b.relu(b.bn(b.conv(e2, 128, 3, 2, "down2"), "down2_bn"))               # 16×16
    d2 = _double(b, b.cat(up(e3, 128, "up2"), e2), 64, "dec2")                   # 32×32
    d1 = _double(b, b.cat(up(d2, 64, "up1"), e1), 32, "dec1")                    # 64×64
    return b.conv(d1, 5, 1, 1, "classifier")


def unet64(b, x):
    """The U-Net upsampling by resizing."""
    return _unet64(b, x, lambda h, channels, name: b.up(h))


def unet64t(b, x):
    """unet64, its decoder upsampling by transposed convolution (the channels of the resized tensor)."""
    return _unet64(b, x, b.upconv)


def deeplab(b, x):
    """DeepLab-like: a ResNet backbone of basic blocks, its last stage dilated instead of strided
    (output stride 4 at this small input), an ASPP-like head (1×1 and dilated 3×3 branches),
    logits upsampled ×4."""
    h = b.relu(b.bn(b.conv(x, 32, 3, 2, "stem"), "stem_bn"))                    # 32×32
    for stage, (channels, stride, rate) in enumerate([(32, 1, 1), (64, 2, 1), (128, 1, 2)]):
        name = f"res{stage}"
        y = b.relu(b.bn(b.conv(h, channels, 3, stride, name + "/conv1", rate), name + "/bn1"))
        y = b.bn(b.conv(y, channels, 3, 1, name + "/conv2", rate), name + "/bn2")
        if stage:
            h = b.bn(b.conv(h, channels, 1, stride, name + "/proj"), name + "/proj_bn")
        h = b.relu(b.add(y, h))                                                  # 32, 16, 16
    a = b.relu(b.bn(b.conv(h, 64, 1, 1, "aspp/1x1"), "aspp/1x1_bn"))
    c = b.relu(b.bn(b.conv(h, 64, 3, 1, "aspp/3x3", 4), "aspp/3x3_bn"))
    h = b.relu(b.bn(b.conv(b.cat(a, c), 64, 1, 1, "aspp/project"), "aspp/project_bn"))
    return b.up(b.up(b.conv(h, 5, 1, 1, "classifier")))                      # 64×64


ARCHITECTURES = {"resnet": (resnet, 10, "classify"), "segnet": (segnet, 5, "segment"),
                 "unet64": (unet64, 5, "segment"), "unet64t": (unet64t, 5, "segment"),
                 "deeplab": (deeplab, 5, "segment")}
INPUT_SIZE = {"unet64": 64, "unet64t": 64, "deeplab": 64}   # image side; 32 for the others


def input_size(arch: str) -> int:
    return INPUT_SIZE.get(arch, 32)


def data(arch: str, towers: int, batch: int, seed: int = 0):
    """Per-tower (images, labels) as numpy arrays."""
    _, classes, kind = ARCHITECTURES[arch]
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(towers):
        side = input_size(arch)
        x = rng.randn(batch, side, side, 3).astype(np.float32)
        shape = (batch,) if kind == "classify" else (batch, side, side)
        out.append((x, rng.randint(0, classes, shape).astype(np.int32)))
    return out


class TowerBuilder:
    """Builds every layer for all towers at once (lists of per-tower tensors)."""

    def __init__(self, towers: int, bn: str):
        self.towers = towers
        self.bn_kind = bn
        self.variables = {}
        self.updates = []          # tower 0's moving-average updates (the CIFAR10 pattern)
        self.bn_layers = []

    # plumbing
    def _each(self, name, fn, *lists):
        outs = []
        for i in range(self.towers):
            with tf.device(f"/cpu:{i}"), tf.name_scope(f"tower_{i}/{name}/"):
                outs.append(fn(i, *[l[i] for l in lists]))
        return outs

    def _var(self, name, shape, init, trainable=True):
        if name not in self.variables:
            with tf.device("/cpu:0"), tf1.get_default_graph().name_scope(None):
                self.variables[name] = tf1.get_variable(name, shape, tf.float32, init, trainable=trainable)
        return self.variables[name]

    # layers
    def conv(self, xs, channels, k, stride, name, rate=1):
        cin = xs[0].shape[-1]
        w = self._var(name + "/kernel", [k, k, cin, channels],
                      tf1.glorot_uniform_initializer(seed=sum(map(ord, name))))
        return self._each(name, lambda i, x: tf.nn.conv2d(x, w, stride, "SAME", dilations=rate), xs)

    def relu(self, xs):
        return self._each("relu", lambda i, x: tf.nn.relu(x), xs)

    def add(self, xs, ys):
        return self._each("add", lambda i, x, y: x + y, xs, ys)

    def cat(self, xs, ys):
        return self._each("concat", lambda i, x, y: tf.concat([x, y], -1), xs, ys)

    def up(self, xs):
        return self._each("up", lambda i, x: tf1.image.resize_nearest_neighbor(
            x, [2 * x.shape[1], 2 * x.shape[2]]), xs)

    def upconv(self, xs, channels, name):
        """×2 upsampling by a 3×3 stride-2 transposed convolution, spelled as
        tf.compat.v1.layers.conv2d_transpose spells it (output shape from the input's batch)."""
        cin = xs[0].shape[-1]
        w = self._var(name + "/kernel", [3, 3, channels, cin],
                      tf1.glorot_uniform_initializer(seed=sum(map(ord, name))))

        def up(i, x):
            shape = tf.stack([tf.shape(x)[0], 2 * x.shape[1], 2 * x.shape[2], channels])
            return tf.nn.conv2d_transpose(x, w, shape, 2, "SAME")
        return self._each(name, up, xs)

    def head(self, xs, classes):
        w = self._var("head/kernel", [xs[0].shape[-1], classes],
                      tf1.glorot_uniform_initializer(seed=7))
        return self._each("head", lambda i, x: tf.matmul(tf.reduce_mean(x, [1, 2]), w), xs)

    def bn(self, xs, name):
        channels = xs[0].shape[-1]
        gamma = self._var(name + "/gamma", [channels], tf1.ones_initializer())
        beta = self._var(name + "/beta", [channels], tf1.zeros_initializer())
        mmean = self._var(name + "/moving_mean", [channels], tf1.zeros_initializer(), trainable=False)
        mvar = self._var(name + "/moving_variance", [channels], tf1.ones_initializer(), trainable=False)
        self.bn_layers.append((name, channels))
        if self.bn_kind == "fused":
            def fused(i, x):
                y, mean, var = tf1.nn.fused_batch_norm(x, gamma, beta, epsilon=EPSILON, is_training=True)[:3]
                return y, mean, var
            outs = self._each(name, fused, xs)
            ys, stats = [o[0] for o in outs], (outs[0][1], outs[0][2])
        elif self.bn_kind == "moments":
            def moments(i, x):
                mean, var = tf.nn.moments(x, [0, 1, 2])
                return tf.nn.batch_normalization(x, mean, var, beta, gamma, EPSILON), mean, var
            outs = self._each(name, moments, xs)
            ys, stats = [o[0] for o in outs], (outs[0][1], outs[0][2])
        elif self.bn_kind == "byhand":
            with tf.device("/cpu:0"), tf.name_scope(f"{name}_gather/"):
                mean, var = tf.nn.moments(tf.concat(xs, 0), [0, 1, 2])
            ys = self._each(name, lambda i, x: tf.nn.batch_normalization(x, mean, var, beta, gamma, EPSILON), xs)
            stats = (mean, var)
        else:
            raise ValueError(self.bn_kind)
        with tf.device("/cpu:0"), tf.name_scope(f"tower_0/{name}/update/"):
            self.updates += [tf1.assign_sub(mmean, (mmean - stats[0]) * (1 - MOMENTUM)),
                             tf1.assign_sub(mvar, (mvar - stats[1]) * (1 - MOMENTUM))]
        return ys


def build_towers(arch: str, towers: int, bn: str, batches, gradients: str = "per-tower",
                 rewrite=False, learning_rate: float = 0.01, dynamic_batch: bool = False):
    """A multi-tower training graph (CIFAR10 pattern), the data as per-tower constants, or with
    dynamic_batch fed to placeholders of unknown batch size (returned as 'feed'), as in most input
    pipelines: then the per-tower element counts are only known at run time.
    rewrite: False, True, or a dict of keyword arguments for graphsync.rewrite_towers.

    gradients: 'per-tower' (compute_gradients in each tower's scope, as the CIFAR10 example) or
               'summed' (one tf.gradients of the mean tower loss, colocated with the forward ops).
    Returns a dict with graph, train_op, losses, and counts.
    """
    fn, classes, kind = ARCHITECTURES[arch]
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        builder = TowerBuilder(towers, bn)
        xs, labels, feed = [], [], {}
        for i, (x, t) in enumerate(batches):
            with tf.device(f"/cpu:{i}"), tf.name_scope(f"tower_{i}/input/"):
                if dynamic_batch:
                    x_in = tf1.placeholder(tf.float32, (None,) + x.shape[1:], name="images")
                    t_in = tf1.placeholder(tf.int32, (None,) + t.shape[1:], name="labels")
                    feed.update({x_in: x, t_in: t})
                else:
                    x_in, t_in = tf.constant(x, name="images"), tf.constant(t, name="labels")
                xs.append(x_in)
                labels.append(t_in)
        logits = fn(builder, xs)
        losses = builder._each("loss", lambda i, z, t: tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=z)), logits, labels)
        variables = [v for v in builder.variables.values() if v in tf1.trainable_variables()]
        opt = tf1.train.GradientDescentOptimizer(learning_rate)
        if gradients == "per-tower":
            tower_grads = []
            for i, loss in enumerate(losses):
                with tf.device(f"/cpu:{i}"), tf.name_scope(f"tower_{i}/"):
                    tower_grads.append([g for g, _ in opt.compute_gradients(loss, variables)])
            with tf.device("/cpu:0"):
                grads = [tf.add_n(list(gs)) / towers for gs in zip(*tower_grads)]
        else:
            with tf.device("/cpu:0"):
                total = tf.add_n(losses) / towers
            grads = tf1.gradients(total, variables, colocate_gradients_with_ops=True)
        with tf.device("/cpu:0"), tf.control_dependencies(builder.updates):
            train_op = opt.apply_gradients(zip(grads, variables))
        init = tf1.global_variables_initializer()
        report = None
        if rewrite:
            import graphsync
            report = graphsync.rewrite_towers(graph, **(rewrite if isinstance(rewrite, dict) else {}))
    return dict(graph=graph, train_op=train_op, losses=losses, init=init, report=report, feed=feed,
                bn_layers=builder.bn_layers[:len(builder.bn_layers)], ops=len(graph.get_operations()))


def build_keras(arch: str, synchronized: bool):
    """The same architecture as a tf_keras functional model (call inside a strategy scope)."""
    import tf_keras
    fn, classes, _ = ARCHITECTURES[arch]
    inputs = tf_keras.Input((input_size(arch), input_size(arch), 3))
    model = tf_keras.Model(inputs, fn(KerasBuilder(synchronized), inputs))
    return model


class KerasBuilder:
    def __init__(self, synchronized: bool):
        import tf_keras
        self.layers = tf_keras.layers
        self.synchronized = synchronized

    def conv(self, x, channels, k, stride, name, rate=1):
        return self.layers.Conv2D(channels, k, strides=stride, padding="same", use_bias=False,
                                  dilation_rate=rate, name=name.replace("/", "_"))(x)

    def bn(self, x, name):
        return self.layers.BatchNormalization(epsilon=EPSILON, momentum=MOMENTUM,
                                              synchronized=self.synchronized,
                                              name=name.replace("/", "_"))(x)

    def relu(self, x):
        return self.layers.ReLU()(x)

    def add(self, x, y):
        return self.layers.Add()([x, y])

    def cat(self, x, y):
        return self.layers.Concatenate(-1)([x, y])

    def up(self, x):
        return self.layers.UpSampling2D(2, interpolation="nearest")(x)

    def upconv(self, x, channels, name):
        return self.layers.Conv2DTranspose(channels, 3, strides=2, padding="same", use_bias=False,
                                           name=name.replace("/", "_"))(x)

    def head(self, x, classes):
        return self.layers.Dense(classes, use_bias=False)(self.layers.GlobalAveragePooling2D()(x))
