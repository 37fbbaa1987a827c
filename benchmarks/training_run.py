"""The small-batch problem in a training run: one segmentation network, one data stream and seed,
trained three ways, with the evaluation (moving statistics) on a held-out set at intervals.

  per-tower     4 towers × 2 examples, each batch norm normalizing with its own tower's 2 images (plain
                TF1 multi-tower code: towers on /cpu:0…3, variables shared, tower gradients averaged,
                tower 0's moving-average updates run with the train op, the CIFAR10 pattern)
  graphsync     the same graph after graphsync.rewrite_towers(): every batch norm uses the statistics of
                all 8 images, forward and backward, and so do tower 0's moving averages
  one device    the same network on one device on the concatenated batch of 8 (what graphsync must equal)

Network: a U-Net written with tf.compat.v1.layers (conv2d + batch_normalization + relu; `depth`
stride-2 downsamplings, so a `side`/2^depth bottleneck; nearest upsampling, skip concatenations, a 1×1
classifier), `width` channels at full resolution, doubling per level. Same initial values in every
variant of a seed (each initializer has its own op seed, the run's seed is the graph seed).

Data, generated here: images of 1–3 random shapes (disk, square, triangle: one class each, background the
fourth) of random colour on Gaussian noise, each image with its own brightness (per channel) and
contrast, as photographs differ; a class per pixel. The training stream and the initial values depend on
the seed; the held-out set is the same for every run.

Recorded: the training loss of every step (the mean of the tower losses, as the loop prints it), every
`eval_every` steps the evaluation-mode loss, pixel accuracy and mean IoU on the held-out set (batch norm
with the moving statistics), and at the end every variable, for the relative drift
‖v_variant − v_one-device‖ / ‖v_one-device‖ of each variable (trainable and moving statistics).

    python benchmarks/training_run.py --json benchmarks/results/training_run.json \
        --plot docs/training_run.png
    python benchmarks/training_run.py --replot benchmarks/results/training_run.json \
        --plot docs/training_run.png          # the figure again, from the recorded numbers
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import numpy as np  # noqa: E402

VARIANTS = ("per-tower", "graphsync", "one device")
# the rounding yardstick for the drift: one device again, every initial value one float32 ulp away
PERTURBED = "one device, 1 ulp"
CLASSES = ("background", "disk", "square", "triangle")
SHAPE_RADIUS = (0.12, 0.25)     # of the image side


@dataclasses.dataclass(frozen=True)
class Setting:
    """Everything a run depends on besides its seed; the same for every variant."""

    towers: int = 4
    per_tower: int = 2              # examples per tower; the one-device batch is towers × per_tower
    side: int = 32                  # image side (pixels)
    width: int = 16                 # channels at full resolution, doubled per level
    depth: int = 2                  # downsamplings: the bottleneck is side / 2**depth
    steps: int = 600
    eval_every: int = 25
    heldout: int = 128              # held-out images (evaluated in one batch)
    learning_rate: float = 1e-3     # Adam
    momentum: float = 0.9           # batch-norm moving averages

    @property
    def batch(self) -> int:
        return self.towers * self.per_tower

    @property
    def bottleneck(self) -> int:
        return self.side // 2 ** self.depth


# -- data ------------------------------------------------------------------------------------------

def shapes(count: int, side: int, rng: np.random.RandomState):
    """`count` images (side × side × 3, float32) and their per-pixel classes (int32)."""
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) + 0.5
    images = rng.randn(count, side, side, 3).astype(np.float32) * 0.5
    labels = np.zeros((count, side, side), np.int32)
    for n in range(count):
        for _ in range(rng.randint(1, 4)):
            kind = rng.randint(1, len(CLASSES))
            radius = rng.uniform(*SHAPE_RADIUS) * side
            cy, cx = rng.uniform(radius, side - radius, 2)
            if kind == 1:
                mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2
            elif kind == 2:
                half = radius * 0.85
                mask = (np.abs(yy - cy) <= half) & (np.abs(xx - cx) <= half)
            else:   # upright triangle: apex at the top, base at the bottom
                rel = (yy - (cy - radius)) / (2 * radius)
                mask = (rel >= 0) & (rel <= 1) & (np.abs(xx - cx) <= rel * radius)
            images[n][mask] += rng.uniform(-1.5, 1.5, 3).astype(np.float32)
            labels[n][mask] = kind
    contrast = rng.uniform(0.5, 2.0, (count, 1, 1, 1)).astype(np.float32)
    brightness = rng.randn(count, 1, 1, 3).astype(np.float32)
    return images * contrast + brightness, labels


def training_stream(setting: Setting, seed: int):
    """The images of every step, (steps × batch) in order; tower i of a step takes its i-th slice."""
    return shapes(setting.steps * setting.batch, setting.side, np.random.RandomState(1000 + seed))


def heldout_set(setting: Setting):
    return shapes(setting.heldout, setting.side, np.random.RandomState(7))


# -- network ---------------------------------------------------------------------------------------

def unet(images, setting: Setting, training: bool):
    """Per-pixel logits. Called in each tower under one variable scope (reuse after tower 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)     # tf.compat.v1.layers is deprecated
        return _unet(images, setting, training)


def _unet(images, setting: Setting, training: bool):
    tf, tf1 = _tf()
    seeds = iter(range(1, 1000))

    def conv_bn_relu(h, channels, stride, name):
        h = tf1.layers.conv2d(h, channels, 3, stride, "same", use_bias=False, name=name,
                              kernel_initializer=tf1.glorot_uniform_initializer(seed=next(seeds)))
        h = tf1.layers.batch_normalization(h, momentum=setting.momentum, epsilon=1e-3,
                                           training=training, name=name + "_bn")
        return tf.nn.relu(h)

    h = conv_bn_relu(conv_bn_relu(images, setting.width, 1, "enc0a"), setting.width, 1, "enc0b")
    skips = [h]
    for level in range(1, setting.depth + 1):
        channels = setting.width * 2 ** level
        h = conv_bn_relu(conv_bn_relu(h, channels, 2, f"down{level}"), channels, 1, f"enc{level}")
        skips.append(h)
    for level in range(setting.depth - 1, -1, -1):
        h = tf1.image.resize_nearest_neighbor(h, [2 * h.shape[1], 2 * h.shape[2]])
        h = conv_bn_relu(tf.concat([h, skips[level]], -1), setting.width * 2 ** level, 1, f"dec{level}")
    return tf1.layers.conv2d(h, len(CLASSES), 1, name="classifier",
                             kernel_initializer=tf1.glorot_uniform_initializer(seed=next(seeds)))


def pixel_loss(logits, labels):
    tf, _ = _tf()
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


@functools.lru_cache(None)
def _tf():
    tf = _common.import_tf()
    tf.compat.v1.disable_eager_execution()
    return tf, tf.compat.v1


# -- graphs ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Training:
    graph: object
    feeds: list           # (images, labels) placeholders, one pair per tower (one pair on one device)
    loss: object          # mean of the tower losses
    train_op: object
    variables: list       # model variables (trainable and moving statistics), by name
    init: object
    summary: str = ""     # graphsync's report, for the synchronized variant


def build_training(setting: Setting, variant: str, seed: int) -> Training:
    """The training graph of one variant: towers (per-tower / graphsync) or one device."""
    tf, tf1 = _tf()
    towers = 1 if variant in ("one device", PERTURBED) else setting.towers
    per_device = setting.batch // towers
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        optimizer = tf1.train.AdamOptimizer(setting.learning_rate)
        feeds, losses, tower_grads = [], [], []
        for i in range(towers):
            scope = f"tower_{i}" if towers > 1 else "device"
            with tf.device(f"/cpu:{i}"), tf1.name_scope(scope), tf1.variable_scope("model", reuse=i > 0):
                images = tf1.placeholder(tf.float32, [per_device, setting.side, setting.side, 3], "images")
                labels = tf1.placeholder(tf.int32, [per_device, setting.side, setting.side], "labels")
                loss = pixel_loss(unet(images, setting, training=True), labels)
                tower_grads.append(optimizer.compute_gradients(loss))
                feeds.append((images, labels))
                losses.append(loss)
        with tf.device("/cpu:0"):
            grads = [(tf.add_n([g for g, _ in gv]) / towers, gv[0][1]) for gv in zip(*tower_grads)]
            updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0" if towers > 1 else "device")
            with tf.control_dependencies(updates):
                train_op = optimizer.apply_gradients(grads)
            mean_loss = tf.add_n(losses) / towers
        optimizer_slots = set(optimizer.variables()) | {optimizer.get_slot(v, s) for _, v in grads
                                                        for s in optimizer.get_slot_names()}
        variables = sorted((v for v in tf1.global_variables(scope="model/") if v not in optimizer_slots),
                           key=lambda v: v.name)
        init = tf1.global_variables_initializer()
        summary = ""
        if variant == "graphsync":
            import graphsync
            summary = graphsync.rewrite_towers(graph).summary
    return Training(graph, feeds, mean_loss, train_op, variables, init, summary)


@dataclasses.dataclass
class Evaluation:
    graph: object
    images: object
    labels: object
    loss: object
    predictions: object
    variables: list


def build_evaluation(setting: Setting) -> Evaluation:
    """The network in evaluation mode (batch norm with the moving statistics) on one device."""
    tf, tf1 = _tf()
    graph = tf.Graph()
    with graph.as_default(), tf.device("/cpu:0"), tf1.variable_scope("model"):
        images = tf1.placeholder(tf.float32, [None, setting.side, setting.side, 3], "images")
        labels = tf1.placeholder(tf.int32, [None, setting.side, setting.side], "labels")
        logits = unet(images, setting, training=False)
        variables = sorted(tf1.global_variables(scope="model/"), key=lambda v: v.name)
        return Evaluation(graph, images, labels, pixel_loss(logits, labels), tf.argmax(logits, -1, tf.int32),
                          variables)


def session_config():
    _, tf1 = _tf()
    return tf1.ConfigProto(device_count={"CPU": 4}, inter_op_parallelism_threads=2,
                           intra_op_parallelism_threads=1)


# -- one run ---------------------------------------------------------------------------------------

def segmentation_metrics(predictions, labels) -> dict:
    """Pixel accuracy and mean IoU over the classes, counted over the whole held-out set."""
    ious = []
    for k in range(len(CLASSES)):
        union = np.sum((predictions == k) | (labels == k))
        if union:
            ious.append(np.sum((predictions == k) & (labels == k)) / union)
    return {"accuracy": float(np.mean(predictions == labels)), "miou": float(np.mean(ious))}


def train(setting: Setting, variant: str, seed: int, stream, heldout, evaluation: Evaluation) -> dict:
    """One training run: per-step losses, evaluations at intervals, final variables by name."""
    _, tf1 = _tf()
    run = build_training(setting, variant, seed)
    images, labels = stream
    record = {"variant": variant, "seed": seed, "loss": [], "eval": [], "graphsync": run.summary}
    start = time.process_time(), _common.now()
    with tf1.Session(graph=run.graph, config=session_config()) as sess, \
            tf1.Session(graph=evaluation.graph, config=session_config()) as eval_sess:

        def evaluate(step):
            """Copies the variables into the evaluation graph (by name), evaluates, returns them."""
            values = dict(zip((v.name for v in run.variables), sess.run(run.variables)))
            for variable in evaluation.variables:
                variable.load(values[variable.name], eval_sess)
            feed = {evaluation.images: heldout[0], evaluation.labels: heldout[1]}
            loss, predictions = eval_sess.run([evaluation.loss, evaluation.predictions], feed)
            record["eval"].append({"step": step, "loss": float(loss),
                                   **segmentation_metrics(predictions, heldout[1])})
            return values

        sess.run(run.init)
        if variant == PERTURBED:
            nudge_by_one_ulp(sess, run, seed)
        values = evaluate(0)
        per_device = setting.batch // len(run.feeds)
        for step in range(setting.steps):
            offset = step * setting.batch
            feed = {}
            for i, (x, t) in enumerate(run.feeds):
                part = slice(offset + i * per_device, offset + (i + 1) * per_device)
                feed[x], feed[t] = images[part], labels[part]
            loss, _ = sess.run([run.loss, run.train_op], feed)
            record["loss"].append(float(loss))
            if (step + 1) % setting.eval_every == 0 or step + 1 == setting.steps:
                values = evaluate(step + 1)
    record["variables"] = values
    record["cpu_s"], record["wall_s"] = time.process_time() - start[0], _common.now() - start[1]
    return record


def nudge_by_one_ulp(sess, run: Training, seed: int) -> None:
    """Moves every initial trainable value to its float32 neighbour, up or down at random."""
    rng = np.random.RandomState(seed)
    for variable in run.variables:
        if variable in run.graph.get_collection("trainable_variables"):
            value = sess.run(variable)
            direction = np.where(rng.rand(*value.shape) < 0.5, -np.inf, np.inf).astype(np.float32)
            variable.load(np.nextafter(value, direction), sess)


def drift(record: dict, reference: dict) -> dict:
    """Per variable ‖v − v_ref‖ / ‖v_ref‖ at the end of the run: the largest, the median, and which."""
    rel = {name: float(np.linalg.norm(value - reference["variables"][name]) /
                       max(np.linalg.norm(reference["variables"][name]), 1e-30))
           for name, value in record["variables"].items()}
    worst = max(rel, key=rel.get)
    return {"max": rel[worst], "median": float(np.median(list(rel.values()))), "worst": worst,
            "variables": len(rel)}


def run_all(setting: Setting, seeds, variants=VARIANTS, log=None) -> list[dict]:
    """Every variant for every seed, in order; drifts against the seed's one-device run."""
    evaluation = build_evaluation(setting)
    heldout = heldout_set(setting)
    records = []
    for seed in seeds:
        stream = training_stream(setting, seed)
        by_variant = {}
        for variant in variants:
            by_variant[variant] = record = train(setting, variant, seed, stream, heldout, evaluation)
            records.append(record)
            if log:
                last = record["eval"][-1]
                log(f"seed {seed} {variant:10s}: final eval mIoU {last['miou']:.3f}, accuracy "
                    f"{last['accuracy']:.3f}, loss {last['loss']:.3f}; {record['wall_s']:.0f} s")
        reference = by_variant.get("one device")
        for variant, record in by_variant.items():
            if reference and record is not reference:
                record["drift"] = drift(record, reference)
                record["loss_gap"] = [abs(a - b) / b for a, b in zip(record["loss"], reference["loss"])]
    return records


# -- report ----------------------------------------------------------------------------------------

LOSS_ALIKE = 1e-4   # relative training-loss gap below which two runs are still on one trajectory


def steps_alike(loss_gap) -> int:
    """How many steps a run's training loss stays within LOSS_ALIKE of the one-device run's."""
    return next((step for step, gap in enumerate(loss_gap) if gap > LOSS_ALIKE), len(loss_gap))


def spread_steps(values) -> str:
    values = sorted(values)
    return str(values[0]) if len(values) == 1 else f"{int(np.median(values))} ({values[0]}–{values[-1]})"


def spread(values) -> str:
    values = sorted(values)
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.median(values):.3f} ({values[0]:.3f}–{values[-1]:.3f})"


def markdown(setting: Setting, records: list[dict], seeds) -> str:
    rows, tail = [], max(1, setting.steps // 10)
    for variant in VARIANTS + (PERTURBED,):
        runs = [r for r in records if r["variant"] == variant]
        if not runs:
            continue
        finals = [r["eval"][-1] for r in runs]
        row = {"variant": variant,
               "miou": spread([f["miou"] for f in finals]),
               "accuracy": spread([f["accuracy"] for f in finals]),
               "eval_loss": spread([f["loss"] for f in finals]),
               "train_loss": spread([np.mean(r["loss"][-tail:]) for r in runs]),
               "step": f"{np.median([r['wall_s'] / setting.steps for r in runs]) * 1e3:.0f} ms"}
        drifts = [r["drift"] for r in runs if "drift" in r]
        if drifts:
            medians = np.median([d["median"] for d in drifts])
            row["drift"] = f"{max(d['max'] for d in drifts):.1e} / {medians:.1e}"
            row["same"] = spread_steps([steps_alike(r["loss_gap"]) for r in runs])
        rows.append(row)
    columns = [("variant", "variant"), ("miou", "eval mIoU"), ("accuracy", "eval pixel accuracy"),
               ("eval_loss", "eval loss"), ("train_loss", f"training loss, last {tail} steps"),
               ("drift", "end-of-run drift from one device: max / median over variables"),
               ("same", f"steps before the loss differs from one device's by > {LOSS_ALIKE:g}"),
               ("step", "wall per step, with evaluations")]
    text = (f"{setting.towers} towers × {setting.per_tower} examples (one device: {setting.batch}), "
            f"{setting.side}×{setting.side} images, U-Net width {setting.width}, depth {setting.depth} "
            f"(bottleneck {setting.bottleneck}×{setting.bottleneck}), {setting.steps} steps, Adam "
            f"{setting.learning_rate:g}, seeds {', '.join(map(str, seeds))}; median (min–max) over seeds, "
            f"evaluation at the last step on {setting.heldout} held-out images.\n\n")
    return text + _common.table(rows, columns)


def write_records(path: str, setting: Setting, seeds, records: list[dict]) -> None:
    """The raw results, one line per run: losses to 6 digits; no variables (the drift stands for them),
    no loss gaps (the one-device losses give them), but the steps the loss stayed alike."""
    import json
    lines = []
    for record in records:
        kept = {k: v for k, v in record.items() if k not in ("variables", "loss_gap")}
        kept["loss"] = [float(f"{x:.6g}") for x in record["loss"]]
        if "loss_gap" in record:
            kept["steps_alike"] = steps_alike(record["loss_gap"])
        lines.append(json.dumps(kept))
    head = json.dumps({"setting": dataclasses.asdict(setting), "seeds": list(seeds)})[:-1]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(head + ', "records": [\n' + ",\n".join(lines) + "\n]}\n")


def plot(setting: Setting, records: list[dict], path: str, title: str = "") -> None:
    """Training loss (a moving average of 10 steps, fewer in short runs) and evaluation mIoU against step: the median over
    seeds as a line, the range over seeds as a band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"per-tower": "tab:red", "graphsync": "tab:blue", "one device": "black"}
    styles = {"per-tower": ("-", 1.4), "graphsync": ("-", 3.0), "one device": ("--", 1.2)}
    fig, (ax_loss, ax_eval) = plt.subplots(1, 2, figsize=(10, 3.8))
    window = min(10, setting.steps)
    for variant in VARIANTS:
        runs = [r for r in records if r["variant"] == variant]
        if not runs:
            continue
        label = {"per-tower": f"{setting.towers} towers × {setting.per_tower}, per-tower statistics",
                 "graphsync": "the same towers, graphsync",
                 "one device": f"one device, batch {setting.batch}"}[variant]
        losses = np.array([np.convolve(r["loss"], np.ones(window) / window, "valid") for r in runs])
        steps = np.arange(window, setting.steps + 1)
        _band(ax_loss, steps, losses, colors[variant], styles[variant], label)
        eval_steps = [e["step"] for e in runs[0]["eval"]]
        mious = np.array([[e["miou"] for e in r["eval"]] for r in runs])
        _band(ax_eval, eval_steps, mious, colors[variant], styles[variant], label)
    ax_loss.set(xlabel="step", ylabel=f"training loss (moving average of {window} steps)", yscale="log")
    ax_eval.set(xlabel="step", ylabel="held-out mean IoU (moving statistics)")
    ax_eval.legend(loc="lower right", fontsize=8)
    for ax in (ax_loss, ax_eval):
        ax.grid(alpha=0.3)
    seeds = sorted({r["seed"] for r in records})
    fig.suptitle(title or f"U-Net, {setting.side}×{setting.side} segmentation, bottleneck "
                 f"{setting.bottleneck}×{setting.bottleneck}, Adam {setting.learning_rate:g}: median over "
                 f"{len(seeds)} seeds (line), range (band)", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _band(ax, x, values, color, style, label):
    line, width = style
    ax.plot(x, np.median(values, 0), line, color=color, label=label, lw=width,
            alpha=0.8 if width > 2 else 1.0)
    if len(values) > 1:
        ax.fill_between(x, values.min(0), values.max(0), color=color, alpha=0.15, lw=0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Setting()
    for field in dataclasses.fields(Setting):
        parser.add_argument("--" + field.name.replace("_", "-"), default=getattr(defaults, field.name),
                            type=float if field.type == "float" else int)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS) + [PERTURBED],
                        choices=VARIANTS + (PERTURBED,))
    parser.add_argument("--json", help="raw results (per-step losses, evaluations, drifts)")
    parser.add_argument("--plot", help="PNG of the curves (needs matplotlib: pip install '.[benchmarks]')")
    parser.add_argument("--replot", metavar="JSON",
                        help="draw --plot from the results of an earlier --json, without training")
    args = parser.parse_args(argv)
    if args.replot:
        import json
        with open(args.replot) as f:
            saved = json.load(f)
        plot(Setting(**saved["setting"]), saved["records"], args.plot)
        return
    setting = Setting(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Setting)})
    print(_common.header("Training run: per-tower statistics, graphsync, one device", argv))
    started = _common.now()
    records = run_all(setting, args.seeds, args.variants, log=lambda line: print(line, file=sys.stderr))
    print(markdown(setting, records, args.seeds))
    load = os.getloadavg()
    summary = next((r["graphsync"] for r in records if r["graphsync"]), "not run")
    print(f"\n{_common.now() - started:.0f} s wall in all; load average {load[0]:.2f} / {load[1]:.2f} / "
          f"{load[2]:.2f} (1 / 5 / 15 min) at the end. graphsync: {summary}")
    if args.json:
        write_records(args.json, setting, args.seeds, records)
    if args.plot:
        plot(setting, records, args.plot)


if __name__ == "__main__":
    main()
