"""graphsync.io: formats recognized by content, faithful round trips, bad input, atomic writes, fuzz."""
from __future__ import annotations

import os
import random
import shutil

import pytest
import tensorflow as tf
from google.protobuf import text_format

import graphsync
from fixture_paths import FIXTURES, META2, META4, META1, FORWARD, SAVEDMODEL, CHECKPOINT
from graphsync import io as gio
from graphsync.io import atomic

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

tf1 = tf.compat.v1


def fixture_bytes(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    """Every input format, made from the binary fixtures: name → (path, tags)."""
    root = tmp_path_factory.mktemp("formats")
    meta = gio.load(META2)
    graph_def = gio.load(FORWARD)
    text_meta = root / "cifar10_2towers.meta.txt"
    text_meta.write_text(text_format.MessageToString(meta.message))
    text_graph = root / "forward_2towers.pbtxt"
    text_graph.write_text(text_format.MessageToString(graph_def.message))
    text_savedmodel = root / "savedmodel_text"
    shutil.copytree(SAVEDMODEL, text_savedmodel)
    saved = gio.load(SAVEDMODEL, "train").message
    os.remove(text_savedmodel / "saved_model.pb")
    (text_savedmodel / "saved_model.pbtxt").write_text(text_format.MessageToString(saved))
    return {"metagraph": (META2, None), "metagraph-text": (str(text_meta), None),
            "graphdef": (FORWARD, None), "graphdef-text": (str(text_graph), None),
            "savedmodel": (SAVEDMODEL, "train"), "savedmodel-text": (str(text_savedmodel), "train")}


# --------------------------------------------------------------------------------------------
# Recognizing formats


@pytest.mark.parametrize("name, kind, text", [
    ("metagraph", "MetaGraphDef", False), ("metagraph-text", "MetaGraphDef", True),
    ("graphdef", "GraphDef", False), ("graphdef-text", "GraphDef", True),
    ("savedmodel", "SavedModel", False), ("savedmodel-text", "SavedModel", True)])
def test_loads_every_format(formats, name, kind, text):
    path, tags = formats[name]
    loaded = gio.load(path, tags)
    assert (loaded.kind, loaded.text) == (kind, text)
    assert len(loaded.graph.get_operations()) == len(loaded.graph_def.node)


@pytest.mark.parametrize("source, misleading_name, kind", [
    (META2, "graph.pb", "MetaGraphDef"), (FORWARD, "train.meta", "GraphDef"),
    (META2, "no_extension", "MetaGraphDef"), (FORWARD, "model.pbtxt", "GraphDef")])
def test_format_comes_from_content_not_extension(tmp_path, source, misleading_name, kind):
    path = tmp_path / misleading_name
    shutil.copy(source, path)
    loaded = gio.load(str(path))
    assert loaded.kind == kind and not loaded.text


def test_text_format_comes_from_content(tmp_path, formats):
    path = tmp_path / "looks_binary.pb"
    shutil.copy(formats["metagraph-text"][0], path)
    assert gio.load(str(path)).format == "metagraph-text"


# --------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("name", ["metagraph", "metagraph-text", "graphdef", "graphdef-text",
                                  "savedmodel", "savedmodel-text"])
def test_identity_round_trip_is_exact(tmp_path, formats, name):
    """Saving an unchanged graph writes the message that was read, field for field."""
    path, tags = formats[name]
    loaded = gio.load(path, tags)
    out = tmp_path / ("out" + ("" if name.startswith("savedmodel") else os.path.splitext(path)[1]))
    assert gio.save(loaded, str(out)) == loaded.format
    again = gio.load(str(out), tags)
    assert (again.kind, again.text) == (loaded.kind, loaded.text)
    assert again.message == loaded.message


@pytest.mark.parametrize("name", ["metagraph", "metagraph-text", "graphdef", "graphdef-text",
                                  "savedmodel", "savedmodel-text"])
def test_rewrite_round_trip_keeps_everything_else(tmp_path, formats, name):
    path, tags = formats[name]
    loaded = gio.load(path, tags)
    before = {node.name: node for node in loaded.graph_def.node}
    report = graphsync.rewrite_towers(loaded.graph)
    assert len(report.layers) == 2
    out = tmp_path / ("out" + ("" if name.startswith("savedmodel") else os.path.splitext(path)[1]))
    gio.save(loaded, str(out))
    again = gio.load(str(out), tags)
    assert again.format == loaded.format
    after = {node.name: node for node in again.graph_def.node}
    assert set(before) < set(after)
    assert again.graph_def.versions == loaded.graph_def.versions
    functions = {f.signature.name: f for f in again.graph_def.library.function}
    for function in loaded.graph_def.library.function:   # the graph's own functions, unchanged
        assert functions.pop(function.signature.name) == function
    added = [node for node in again.graph_def.node if node.name.startswith("graphsync/")]
    called = {node.op for node in added} | {node.attr["f"].func.name for node in added if "f" in node.attr}
    assert functions and set(functions) <= called   # only graphsync's merges, each called by a new node
    for node_name, node in before.items():  # only inputs may change, devices never
        edited = after[node_name]
        assert (edited.op, edited.device, dict(edited.attr)) == (node.op, node.device, dict(node.attr))
    new_nodes = set(after) - set(before)
    assert any(n.startswith("graphsync/") for n in new_nodes)
    if loaded.meta_graph is not None:
        original, written = loaded.meta_graph, again.meta_graph
        for field in ("collection_def", "saver_def", "signature_def", "asset_file_def", "object_graph_def"):
            assert getattr(written, field) == getattr(original, field), field
        assert written.meta_info_def.tags == original.meta_info_def.tags
        listed = {op.name for op in written.meta_info_def.stripped_op_list.op}
        assert {after[n].op for n in new_nodes} <= listed
    if loaded.kind == "SavedModel":
        assert [m.meta_info_def.tags for m in again.message.meta_graphs] == \
            [m.meta_info_def.tags for m in loaded.message.meta_graphs]
        assert again.message.meta_graphs[1] == loaded.message.meta_graphs[1]  # {serve} untouched
        assert sorted(os.listdir(out / "variables")) == sorted(os.listdir(os.path.join(path, "variables")))
    # A second rewrite finds nothing left to do.
    assert not graphsync.rewrite_towers(again.graph).layers


@pytest.mark.parametrize("source, tags, output, fmt", [
    (META2, None, "converted.pb", "metagraph"),          # .pb says binary, not which message
    (META2, None, "converted.pbtxt", "metagraph-text"),
    (FORWARD, None, "converted.pbtxt", "graphdef-text"),
    (FORWARD, None, "converted.meta", "metagraph"),
    (FORWARD, None, "converted.meta.txt", "metagraph-text"),
    (SAVEDMODEL, "train", "converted.meta", "metagraph"),
    (SAVEDMODEL, "train", "converted.pb", "metagraph"),
])
def test_output_name_chooses_format(tmp_path, source, tags, output, fmt):
    loaded = gio.load(source, tags)
    assert gio.save(loaded, str(tmp_path / output)) == fmt
    again = gio.load(str(tmp_path / output))
    assert again.format == fmt
    assert {n.name for n in again.graph_def.node} == {n.name for n in loaded.graph_def.node}
    if loaded.meta_graph is not None:
        assert again.meta_graph.collection_def == loaded.meta_graph.collection_def


def test_format_override_and_impossible_conversion(tmp_path):
    loaded = gio.load(META2)
    assert gio.save(loaded, str(tmp_path / "graph.bin"), "graphdef-text") == "graphdef-text"
    assert gio.load(str(tmp_path / "graph.bin")).format == "graphdef-text"
    assert gio.save(loaded, str(tmp_path / "graph.pb"), "graphdef") == "graphdef"
    assert gio.load(str(tmp_path / "graph.pb")).message == loaded.graph_def
    with pytest.raises(gio.PathError, match="cannot write a SavedModel from a MetaGraphDef"):
        gio.save(loaded, str(tmp_path / "sm"), "savedmodel")
    with pytest.raises(gio.PathError, match="unknown format"):
        gio.save(loaded, str(tmp_path / "x.meta"), "onnx")


def test_savedmodel_tags(tmp_path):
    with pytest.raises(gio.PathError, match=r"holds 2 meta graphs \(\{train\}, \{serve\}\): choose one"):
        gio.load(SAVEDMODEL)
    with pytest.raises(gio.PathError, match=r"no meta graph tagged \{gpu\}; it has \{train\}, \{serve\}"):
        gio.load(SAVEDMODEL, "gpu")
    serve = gio.load(SAVEDMODEL, ["serve"])
    assert serve.tags == ("serve",) and "serving_default" in serve.meta_graph.signature_def
    with pytest.raises(gio.PathError, match="tags apply only to SavedModel"):
        gio.load(META2, "train")


def test_savedmodel_output_replaces_existing_directory(tmp_path):
    loaded = gio.load(SAVEDMODEL, "train")
    out = tmp_path / "sm"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    gio.save(loaded, str(out))
    assert sorted(os.listdir(out)) == ["saved_model.pb", "variables"]
    assert sorted(os.listdir(tmp_path)) == ["sm"]


def test_rewrite_file_reports_and_writes(tmp_path):
    report, details = gio.rewrite_file(META4, str(tmp_path / "out.meta"), logdir=str(tmp_path / "tb"))
    assert report.towers == ["tower_0", "tower_1", "tower_2", "tower_3"] and len(report.layers) == 2
    assert details["output_format"] == "metagraph" and details["ops_after"] > details["ops_before"]
    assert os.path.exists(tmp_path / "out.meta")
    event_names = set()
    for event in tf1.train.summary_iterator(details["event_file"]):
        if event.graph_def:
            event_names = {n.name for n in tf1.GraphDef.FromString(event.graph_def).node}
    assert "tower_3/bn2/FusedBatchNormV3" in event_names
    assert any(n.startswith("graphsync/") for n in event_names)


def test_dry_run_writes_nothing(tmp_path):
    report, details = gio.rewrite_file(META2, str(tmp_path / "out.meta"), dry_run=True,
                                       logdir=str(tmp_path / "tb"))
    assert report.layers and details["dry_run"]
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------
# Bad input


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


BAD_INPUTS = [
    ("missing", lambda d: str(d / "nope.meta"), gio.PathError, "no such file or directory"),
    ("empty", lambda d: _write(d, "empty.meta", b""), gio.GraphFileError, "is empty"),
    ("truncated", lambda d: _write(d, "cut.meta", fixture_bytes(META2)[:30000]), gio.GraphFileError,
     "truncated"),
    ("truncated graphdef", lambda d: _write(d, "cut.pb", fixture_bytes(FORWARD)[:-7]), gio.GraphFileError,
     "truncated"),
    ("random bytes", lambda d: _write(d, "random.pb", random.Random(0).randbytes(4096)), gio.GraphFileError,
     "not a"),
    ("random text", lambda d: _write(d, "notes.pbtxt", b"hello world\n"), gio.GraphFileError,
     "not a text GraphDef"),
    ("json", lambda d: _write(d, "model.json", b'{"class_name": "Sequential"}'), gio.GraphFileError, "JSON"),
    ("bad text proto", lambda d: _write(d, "bad.pbtxt", b'node { name: "a" op: "Const" \n'), gio.GraphFileError,
     "invalid text GraphDef"),
    ("checkpoint index", lambda d: CHECKPOINT + ".index", gio.GraphFileError, "checkpoint index"),
    ("checkpoint data", lambda d: CHECKPOINT + ".data-00000-of-00001", gio.GraphFileError, "checkpoint data"),
    ("checkpoint prefix", lambda d: CHECKPOINT, gio.PathError, "checkpoint prefix"),
    ("checkpoint state", lambda d: _write(d, "checkpoint", b'model_checkpoint_path: "model.ckpt-10"\n'),
     gio.GraphFileError, "checkpoint state file"),
    ("png", lambda d: _write(d, "cat.png", b"\x89PNG\r\n\x1a\n" + bytes(100)), gio.GraphFileError, "PNG image"),
    ("jpeg", lambda d: _write(d, "cat.jpg", b"\xff\xd8\xff\xe0" + bytes(100)), gio.GraphFileError, "JPEG image"),
    ("plain directory", lambda d: str(d), gio.GraphFileError, "not a SavedModel"),
    ("checkpoint directory", lambda d: FIXTURES, gio.GraphFileError, "checkpoint directory"),
    ("saved_model.pb itself", lambda d: os.path.join(SAVEDMODEL, "saved_model.pb"), gio.PathError,
     "pass its directory"),
    ("unknown op", lambda d: _write(d, "custom.pbtxt", b'node { name: "a" op: "MyCustomOp" }\n'),
     gio.GraphFileError, "Op type not registered"),
    ("dangling input", lambda d: _write(d, "dangling.pbtxt",
                                        b'node { name: "a" op: "Identity" input: "b" attr { key: "T" '
                                        b'value { type: DT_FLOAT } } }\n'), gio.GraphFileError, "does not import"),
    ("no nodes", lambda d: _write(d, "versions_only.pbtxt", b"versions { producer: 1 }\n"), gio.GraphFileError,
     "no nodes"),
]


@pytest.mark.parametrize("make, error, message", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_clean_error(tmp_path, make, error, message):
    path = make(tmp_path)
    with pytest.raises(error, match=message) as caught:
        gio.load(path)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, graphsync.GraphsyncError)


def test_bad_outputs(tmp_path):
    loaded = gio.load(META2)
    with pytest.raises(gio.PathError, match="does not exist"):
        gio.save(loaded, str(tmp_path / "missing" / "out.meta"))
    with pytest.raises(gio.PathError, match="is the input"):
        gio.save(loaded, META2)
    os.symlink(META2, tmp_path / "alias.meta")
    with pytest.raises(gio.PathError, match="is the input"):
        gio.save(loaded, str(tmp_path / "alias.meta"))
    with pytest.raises(gio.PathError, match="is a directory"):
        gio.save(loaded, str(tmp_path))
    sm = gio.load(SAVEDMODEL, "train")
    with pytest.raises(gio.PathError, match="is the input"):
        gio.save(sm, SAVEDMODEL)
    (tmp_path / "file").write_text("x")
    with pytest.raises(gio.PathError, match="not a directory"):
        gio.save(sm, str(tmp_path / "file"), "savedmodel")


def _graph_file(tmp_path, name, build):
    graph = tf.Graph()
    with graph.as_default():
        build()
    path = tmp_path / name
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return str(path)


def _batch_norm_at_root():
    x = tf1.placeholder(tf.float32, [None, 4, 4, 3], name="x")
    tf1.nn.fused_batch_norm(x, tf.ones([3]), tf.zeros([3]), is_training=True, name="bn")


@pytest.mark.parametrize("make, message", [
    (lambda d: META1, r"single tower \(tower_0\): nothing to synchronize across"),
    (lambda d: _graph_file(d, "no_bn.pb", lambda: tf.constant(1.0, name="c")), "has no batch norm"),
    (lambda d: _graph_file(d, "root_bn.pb", _batch_norm_at_root), "no towers"),
], ids=["one tower", "no batch norm", "no towers"])
def test_one_tower_or_no_towers_is_an_error(tmp_path, make, message):
    path = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(graphsync.GraphsyncError, match=message) as caught:
        gio.rewrite_file(path, str(tmp_path / "out.meta"))
    assert "\n" not in str(caught.value)
    assert sorted(os.listdir(tmp_path)) == before


def test_require_towers_messages():
    report = graphsync.RewriteReport([], "")
    with pytest.raises(graphsync.GraphsyncError, match="has no batch norm"):
        gio.require_towers(report, "g.pb")
    report.skipped.append(graphsync.SkippedReport("bn/FusedBatchNormV3", "outside every tower"))
    with pytest.raises(graphsync.GraphsyncError, match="found no towers in g.pb"):
        gio.require_towers(report, "g.pb")


# --------------------------------------------------------------------------------------------
# Atomic writes


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "out.meta"
    out.write_bytes(b"previous")
    loaded = gio.load(META2)

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(gio.GraphFileError, match="No space left on device"):
        gio.save(loaded, str(out))
    assert out.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["out.meta"]


def test_failed_savedmodel_write_keeps_the_old_directory(tmp_path, monkeypatch):
    out = tmp_path / "sm"
    out.mkdir()
    (out / "marker").write_text("old")
    loaded = gio.load(SAVEDMODEL, "train")

    def broken_copytree(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(shutil, "copytree", broken_copytree)
    with pytest.raises(gio.GraphFileError, match="Input/output error"):
        gio.save(loaded, str(out))
    assert os.listdir(out) == ["marker"]
    assert os.listdir(tmp_path) == ["sm"]


def test_written_file_has_default_permissions(tmp_path):
    atomic.write_file(str(tmp_path / "x"), b"data")
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "x").st_mode & 0o777 == 0o666 & ~umask


# --------------------------------------------------------------------------------------------
# Fuzz


def _mutate(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(6)
    i = rng.randrange(len(data))
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 1:
        del data[i:]
    elif kind == 2:
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 3:
        del data[i:i + rng.randint(1, 64)]
    elif kind == 4:
        data[i] ^= 1 << rng.randrange(8)
    else:
        j = rng.randrange(i, len(data))
        data[i:j] = data[i:j][::-1]
    return bytes(data)


@pytest.mark.parametrize("source, seed, count", [(FORWARD, 1, 120), (META2, 2, 80)])
def test_fuzzed_fixtures_give_only_clean_errors(tmp_path, source, seed, count):
    rng = random.Random(seed)
    original = fixture_bytes(source)
    path = tmp_path / os.path.basename(source)
    outcomes = {"loaded": 0, "rejected": 0}
    for _ in range(count):
        path.write_bytes(_mutate(original, rng))
        try:
            gio.load(str(path))
            outcomes["loaded"] += 1
        except gio.GraphFileError as exc:
            assert "\n" not in str(exc)
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > count // 2, outcomes
