"""Between-graph replication with no edit: tests/scripts/between_graph_train.py, a TF1 worker script
that reads TF_CONFIG, starts its own tf.distribute.Server and trains one step on its shard, runs in
2 or 3 real worker processes on 127.0.0.1 under `graphsync run` (and under plain python); what the
workers computed together is compared with one device on the concatenated batch. Also: a missing
worker, workers with different layers, and `graphsync rewrite --process-group`."""
import concurrent.futures
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import cluster as cl
import tiers
import towerlib as tl

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
SCRIPT = os.path.join(SCRIPTS, "between_graph_train.py")
sys.path.insert(0, SCRIPTS)
import between_graph_train as script  # noqa: E402

GRAPHSYNC_RUN = [sys.executable, "-m", "graphsync", "run"]
TOLERANCE = 2e-5


def tf_config(spec: dict, index: int, job: str = "worker") -> str:
    return json.dumps({"cluster": spec, "task": {"type": job, "index": index}})


def run_workers(tmp_path, n, *, runner=GRAPHSYNC_RUN, args=(), per_worker=None, timeout=240):
    """Starts n workers of one cluster on free loopback ports; returns per worker (index, return
    code, stderr, seconds, outputs or None). Always stopped."""
    return run_workers_of(cl.cluster_spec({"worker": n}), range(n), runner, tmp_path, args, per_worker, timeout)


def run_workers_of(spec, indices, runner, tmp_path, args=(), per_worker=None, timeout=240):
    """run_workers for the workers `indices` of the cluster `spec`."""
    procs, results = {}, []
    env = cl.env_for_children()
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    try:
        for i in indices:
            out = tmp_path / f"worker{i}.npz"
            argv = runner + [SCRIPT, str(out)] + list(args) + list((per_worker or {}).get(i, ()))
            procs[i] = (subprocess.Popen(argv, env=dict(env, TF_CONFIG=tf_config(spec, i)), stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True), out, time.monotonic())
        for i, (proc, out, started) in procs.items():
            _, err = proc.communicate(timeout=timeout)
            results.append((i, proc.returncode, err, time.monotonic() - started,
                            dict(np.load(out)) if out.exists() else None))
    finally:
        for proc, _, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return results


def errors_against_one_device(results, sizes, **model):
    """Max relative errors of what the workers computed together vs one device on the whole batch."""
    for i, code, err, _, _ in results:
        assert code == 0, f"worker {i}:\n{err[-3000:]}"
    got = [r[4] for r in sorted(results, key=lambda r: r[0])]
    ref = script.reference(sizes, **model)
    return {"output": tl.max_rel_error(np.concatenate([g["output"] for g in got]), ref["output"]),
            "loss": tl.max_rel_error(np.concatenate([g["loss"] for g in got]), ref["loss"]),
            "grads": tl.max_rel_error(sum(g["grads"] for g in got), ref["grads"]),
            "moving": max(tl.max_rel_error(g["moving"], ref["moving"]) for g in got)}


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    sizes = [3, 5]
    synced_dir, plain_dir = tmp_path_factory.mktemp("synced"), tmp_path_factory.mktemp("plain")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:   # both groups at once: most of a run is waiting
        synced = pool.submit(run_workers, synced_dir, 2, args=["--sizes", "3,5"])
        plain = pool.submit(run_workers, plain_dir, 2, runner=[sys.executable], args=["--sizes", "3,5", "--alone"])
        return sizes, synced.result(), plain.result()


def test_two_workers_under_graphsync_run_equal_one_device(two_workers):
    sizes, synced, plain = two_workers
    errors = errors_against_one_device(synced, sizes)
    print("2 workers [3, 5], synchronized:", errors)
    assert max(errors.values()) < TOLERANCE, errors
    unsynced = errors_against_one_device(plain, sizes)
    print("2 workers [3, 5], plain python:", unsynced)
    assert unsynced["output"] > 1e-2 and unsynced["grads"] > 1e-2 and unsynced["moving"] > 1e-2, unsynced


def test_each_worker_says_which_process_it_is(two_workers):
    _, synced, plain = two_workers
    for i, _, err, _, _ in synced:
        lines = [l for l in err.splitlines() if l.startswith("graphsync: ")]
        assert lines == [
            f"graphsync: worker:{i} is process {i + 1} of 2 (cluster from its tf.distribute.Server); its towers "
            "synchronize with the other worker through collectives (group leader /job:worker/replica:0/task:0, "
            "peer timeout 300 s)",
            "graphsync: 2 layers × 1 tower synchronized by all-reduce on the towers' devices across 2 worker "
            "processes (fused; gradients rewritten)"], err
    assert not any("graphsync" in err for _, _, err, _, _ in plain)


def _synchronized_and_plain(tmp_path, flag: str, **model) -> tuple:
    """Two unchanged worker scripts [3, 5] with `flag`, under graphsync run and under plain python:
    (graphsync's first worker's lines, errors against one device synchronized, plain)."""
    args = ["--sizes", "3,5", flag]
    (tmp_path / "synced").mkdir(), (tmp_path / "plain").mkdir()
    synced = run_workers(tmp_path / "synced", 2, args=args)
    errors = errors_against_one_device(synced, [3, 5], **model)
    plain = errors_against_one_device(run_workers(tmp_path / "plain", 2, runner=[sys.executable], args=args + ["--alone"]),
                                      [3, 5], **model)
    print(f"2 workers [3, 5], {flag}, synchronized:", errors, "plain python:", plain)
    assert plain["output"] > 1e-2 and plain["grads"] > 1e-2, plain
    return synced[0][2], errors


@tiers.full
def test_a_batch_norm_written_by_hand_under_graphsync_run(tmp_path):
    """The rule's reductions (a mean and tf.math.reduce_variance written by hand) summed across two
    unchanged worker scripts under `graphsync run`, beside a fused batch norm."""
    said, errors = _synchronized_and_plain(tmp_path, "--handwritten", handwritten=True)
    # the hand-written batch norm's three reductions count as one layer (graphsync/plan/normalizations.py)
    assert "graphsync: 2 layers × 1 tower synchronized by all-reduce on the towers' devices across 2 worker " \
           "processes (fused, reduction; gradients rewritten)" in said, said
    assert max(errors.values()) < TOLERANCE, errors


@tiers.full
def test_a_decoder_under_graphsync_run(tmp_path):
    """The second batch norm after a stride-2 transposed convolution (a Conv2DBackpropInput in the
    forward: issue 52), across two unchanged worker scripts."""
    said, errors = _synchronized_and_plain(tmp_path, "--decoder", decoder=True)
    assert "graphsync: 2 layers × 1 tower synchronized by all-reduce on the towers' devices across 2 worker " \
           "processes" in said, said
    assert max(errors.values()) < TOLERANCE, errors


@tiers.full
def test_a_plain_worker_trains_after_its_peer_has_gone(tmp_path):
    """The plain runs' premise: with --alone a worker's session waits for no other task, so a
    worker that finished and exited first cannot hang the other's session start (two rehearsals
    of .ci/run hung there 240 s). Worker 1 of 2, with worker 0 never started."""
    results = run_workers_of(cl.cluster_spec({"worker": 2}), [1], [sys.executable], tmp_path,
                             args=["--sizes", "3,5", "--alone"], timeout=120)
    (_, code, err, _, out), = results
    assert code == 0 and out is not None, err[-3000:]
    assert out["output"].shape == (5, script.OUTPUTS)


@tiers.full
def test_three_uneven_workers_of_two_towers_each_equal_one_device(tmp_path):
    """3 workers × 2 towers (in-graph inside, between-graph across): 6 towers, one batch."""
    sizes = [2, 1, 4, 3, 1, 5]
    results = run_workers(tmp_path, 3, args=["--sizes", ",".join(map(str, sizes)), "--towers", "2"])
    assert "graphsync: 2 layers × 2 towers synchronized by all-reduce on the towers' devices across 3 worker " \
           "processes" in results[0][2], results[0][2]
    errors = errors_against_one_device(results, sizes)
    print("3 workers × 2 towers [2, 1 | 4, 3 | 1, 5], synchronized:", errors)
    assert max(errors.values()) < TOLERANCE, errors


def test_a_missing_worker_is_one_line_within_the_wait():
    """Worker 0 of 3 alone: one error line naming the two missing workers, 2 s (the configured
    wait) after it said which process it is."""
    spec = cl.cluster_spec({"worker": 3})
    env = dict(cl.env_for_children(), TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", TF_CONFIG=tf_config(spec, 0))
    proc = subprocess.Popen(GRAPHSYNC_RUN + ["--peer-timeout", "2", SCRIPT, os.devnull], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip("\n")))
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    said = next(t for t, l in lines if l.startswith("graphsync: worker:0 is process 1 of 3"))
    failed, last = lines[-1]
    print(f"missing workers: {last!r}, {failed - said:.2f} s after the task line (wait 2 s)")
    assert proc.returncode == 1 and "Traceback" not in "".join(l for _, l in lines)
    assert last == (f"graphsync: error: worker:1 ({spec['worker'][1]}), worker:2 ({spec['worker'][2]}) did not start "
                    "within 2 s (worker:0 is process 1 of 3): start every worker of the cluster, or wait longer "
                    "with --peer-timeout")
    assert 2.0 <= failed - said < 12.0


@tiers.full
def test_a_worker_whose_server_runs_but_never_joins_is_one_line_after_the_wait(tmp_path):
    """Worker 1's server is up (a bare tf.distribute.Server), but nothing there runs a step."""
    spec = cl.cluster_spec({"worker": 2})
    server = subprocess.Popen([sys.executable, "-c", cl.SERVER, json.dumps([spec, "worker", 1, None])],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "ready" in server.stdout.readline()
        [(_, code, err, seconds, out)] = run_workers_of(spec, [0], GRAPHSYNC_RUN + ["--peer-timeout", "3"], tmp_path)
    finally:
        server.kill()
        server.wait(timeout=30)
    last = err.strip().splitlines()[-1]
    print(f"worker that never joins: {last!r} ({seconds:.1f} s, whole process)")
    assert code == 1 and out is None and "Traceback" not in err
    assert last == ("graphsync: error: not every worker joined within 3 s (worker:0 is process 1 of 2, waiting for "
                    "worker:1): their servers are up, but some did not reach their first synchronized step: run "
                    "every worker under graphsync (the same script and options), or wait longer with --peer-timeout")
    assert seconds < 60


@tiers.full
def test_workers_with_different_layers_stop_at_the_first_meeting(tmp_path):
    results = run_workers(tmp_path, 2, runner=GRAPHSYNC_RUN + ["--peer-timeout", "60"],
                          per_worker={1: ["--channels", "6"]})
    for i, code, err, seconds, out in results:
        last = err.strip().splitlines()[-1]
        assert code == 1 and out is None, err
        assert last.startswith(f"graphsync: error: the workers built different batch-norm layers (worker:{i}: 2, "
                               f"worker:{1 - i}: 2); the first that differs is layer 1, here (worker:{i}) "
                               f"model/bn1/FusedBatchNormV3 FusedBatchNormV3 float32 (6, 6, {4 + 2 * i})"), last
        assert seconds < 60   # found at the meeting, not after the timeout


@tiers.full
def test_rewrite_process_group_prepares_a_saved_worker_graph_per_task(tmp_path):
    """A worker graph saved once (one unscoped tower, no devices), rewritten per task by
    `graphsync rewrite --process-group 2:INDEX`, imported and run by 2 worker processes."""
    import models
    import tensorflow as tf
    from click.testing import CliRunner

    from cli.main import main
    sizes = [3, 5]
    built = tl.build(models.resnetish(depth=2), [1], scope="", devices=[""])
    meta = str(tmp_path / "worker.meta")
    tf.compat.v1.train.export_meta_graph(meta, graph=built.graph)
    names = {f: [t.name for t in getattr(built, f)] for f in ("inputs", "targets", "outputs", "losses", "grads")}
    names.update(train_op=built.train_op.name, moving=[v.name for v in built.moving])
    saved = {}
    for index in (0, 1):
        saved[index] = str(tmp_path / f"worker{index}_synced.meta")
        result = CliRunner().invoke(main, ["rewrite", meta, "--process-group", f"2:{index}", "--peer-timeout", "120",
                                           "-o", saved[index]], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("2 layers × 1 tower synchronized by all-reduce on the towers' devices "
                                        "across 2 worker processes"), result.stdout
    x, t = tl.data(sizes, (6, 6, 3), (5,))
    ref = tl.reference_step(models.resnetish(depth=2), sizes, x, t)
    got = cl.between_graph_step(cl.cluster_spec({"worker": 2}), sizes, tmp_path, saved=[
        {"metas": {"rewritten": saved[i], "original": meta}, "names": names} for i in (0, 1)])
    errors = {variant: {
        "output": tl.max_rel_error(np.concatenate([g[f"{variant}/output"] for g in got]), ref["output"]),
        "loss": tl.max_rel_error(np.concatenate([g[f"{variant}/loss"] for g in got]), ref["loss"]),
        "grads": tl.max_rel_error(got[0][f"{variant}/grads"] + got[1][f"{variant}/grads"],
                                  np.concatenate([g.ravel() for g in ref["grads"]])),
        "moving": max(tl.max_rel_error(g[f"{variant}/moving"], np.concatenate([m.ravel() for m in ref["moving"]]))
                      for g in got)} for variant in ("rewritten", "original")}
    print("graphsync rewrite --process-group, 2 workers [3, 5]:", errors)
    assert max(errors["rewritten"].values()) < TOLERANCE, errors
    assert errors["original"]["output"] > 1e-3 and errors["original"]["grads"] > 1e-3, errors


def test_rewrite_process_group_sets_the_collectives_timeout_and_refuses_bad_values(tmp_path):
    import tensorflow as tf
    from click.testing import CliRunner

    from cli.main import main
    from fixture_paths import META2
    out = str(tmp_path / "synced.meta")
    result = CliRunner().invoke(main, ["rewrite", META2, "--process-group", "3:2",
                                       "--peer-timeout", "7", "-o", out], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(out)
    collectives = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert collectives and {op.get_attr("timeout_seconds") for op in collectives} == {7.0}
    assert {int(tf.get_static_value(op.inputs[1])) for op in collectives} == {6}   # 2 towers × 3 workers
    for bad, message in ((["--process-group", "2:2"], "is not TASKS:INDEX"),
                         (["--process-group", "2:0", "--strategy", "gather"], "needs --strategy allreduce"),
                         (["--process-group", "TF_CONFIG"], "TF_CONFIG names no training task")):
        result = CliRunner(env={"TF_CONFIG": ""}).invoke(main, ["rewrite", META2, "-o",
                                                                str(tmp_path / "x.meta")] + bad)
        assert result.exit_code == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
        assert not os.path.exists(tmp_path / "x.meta")


@tiers.full
def test_saved_worker_graphs_with_different_layers_time_out_instead_of_averaging(tmp_path):
    """Without graphsync run's meeting, workers whose layers differ but whose statistics have the
    same shapes (here: exponential_avg_factor) would average silently; their collectives' group keys
    come from the layers' fingerprints, so they never pair, and fail after the timeout."""
    import models
    import tensorflow as tf
    from click.testing import CliRunner

    from cli.main import main
    saved, names = [], None
    for index, avg_factor in enumerate((None, 0.1)):
        built = tl.build(models.resnetish(depth=2, avg_factor=avg_factor), [1], scope="", devices=[""])
        meta = str(tmp_path / f"worker{index}.meta")
        tf.compat.v1.train.export_meta_graph(meta, graph=built.graph)
        names = {f: [t.name for t in getattr(built, f)] for f in ("inputs", "targets", "outputs", "losses", "grads")}
        names.update(train_op=built.train_op.name, moving=[v.name for v in built.moving])
        result = CliRunner().invoke(main, ["rewrite", meta, "--process-group", f"2:{index}", "--peer-timeout", "3",
                                           "-o", meta + ".synced"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        saved.append({"metas": {"rewritten": meta + ".synced"}, "names": names})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="Collective has timed out"):
        cl.between_graph_step(cl.cluster_spec({"worker": 2}), [3, 5], tmp_path, saved=saved, timeout=120)
    assert time.monotonic() - started < 60


@tiers.full
@pytest.mark.parametrize("mode", ["layers", "segments"])
def test_two_workers_with_recompute_train_bit_for_bit_like_without(two_workers, tmp_path, mode):
    """`graphsync run --recompute layers|segments` on the same unchanged workers: every worker's
    outputs, losses, gradients and moving statistics exactly those of `graphsync run`, and its
    report counts the tensors its backward reads recomputed."""
    _, synced, _ = two_workers
    reports = {i: tmp_path / f"report{i}.json" for i in range(2)}
    spec = cl.cluster_spec({"worker": 2})
    results = []
    env = cl.env_for_children()   # each worker its own report file: run_workers shares one runner

    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    procs = []
    try:
        for i in range(2):
            argv = GRAPHSYNC_RUN + ["--recompute", mode, "--report", str(reports[i]), SCRIPT, str(tmp_path / f"worker{i}.npz"),
                                    "--sizes", "3,5"]
            procs.append(subprocess.Popen(argv, env=dict(env, TF_CONFIG=tf_config(spec, i)), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        for i, proc in enumerate(procs):
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"worker {i}:\n{err[-3000:]}"
            results.append(dict(np.load(tmp_path / f"worker{i}.npz")))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    for i in range(2):
        graphs = json.loads(reports[i].read_text())["graphs"]
        assert graphs and all(g["recompute"] == mode and g["recomputed"] > 0 for g in graphs), graphs
    for (_, _, _, _, want), got in zip(sorted(synced, key=lambda r: r[0]), results):
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(want[key], got[key], err_msg=key)
