"""ddp_runtime on a real Dask LocalCluster with worker processes, gloo backend, on the CPU."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time

import paths
import pytest
import s3fs
import torch
from ddp_helpers import (
    checkpointed_epochs,
    ddp_train,
    fail_on_rank_one,
    linear_regression,
    report_forever,
    scored_checkpoints,
    side_messages,
)

import ddp_runtime as train
from ddp_runtime import _gang as gang
from ddp_runtime.checkpoint import RunStorage
from ddp_runtime.cluster import local_cluster
from ddp_runtime.torch import TorchTrainer

ROOT = str(paths.ROOT)


@pytest.fixture(scope="module")
def gpu3():
    """Three workers advertising one (simulated) GPU each, as `dask worker --resources GPU=1` would."""
    with local_cluster(n_workers=3, resources={"GPU": 1}) as client:
        yield client


def _run_config(tmp_path, **kwargs):
    return train.RunConfig(storage_path=str(tmp_path / "results"), **kwargs)


def _train_one_epoch(client, tmp_path):
    """A 2-rank group that trains one epoch: shows the cluster is usable (no rank hanging, no worker held)."""
    return TorchTrainer(
        linear_regression,
        train_loop_config={"epochs": 1},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path),
        client=client,
    ).fit()


def test_two_rank_training_syncs_parameters_and_shards_data(cluster, tmp_path):
    n = 203  # odd on purpose: DistributedSampler pads to an even split
    result = TorchTrainer(
        ddp_train,
        train_loop_config={"n": n, "epochs": 8, "out": str(tmp_path)},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path),
        client=cluster,
    ).fit()
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert all(r["world"] == 2 for r in ranks)
    assert ranks[0]["params"] == ranks[1]["params"], "DDP must leave identical parameters on every rank"
    seen0, seen1 = set(ranks[0]["seen"]), set(ranks[1]["seen"])
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) == (n + 1) // 2
    assert len(seen0 & seen1) <= 1  # only the padding sample may repeat
    assert seen0 | seen1 == set(range(n))
    losses = [m["loss"] for m in result.metrics_history]
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0]
    assert result.metrics["epoch"] == 7 and result.error is None


def test_dataloader_worker_processes_run_inside_dask_workers(cluster, tmp_path):
    result = TorchTrainer(
        ddp_train,
        train_loop_config={"n": 64, "epochs": 1, "out": str(tmp_path), "num_workers": 2},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path),
        client=cluster,
    ).fit()
    assert result.metrics["epoch"] == 0


def test_gang_scheduling_three_trainers_on_three_gpus_never_overlap(gpu3, tmp_path):
    results, errors = {}, []

    def run(i):
        try:
            results[i] = TorchTrainer(
                report_forever,
                train_loop_config={"max_reports": 4, "interval": 0.1},
                scaling_config=train.ScalingConfig(num_workers=2, resources_per_worker={"GPU": 1}),
                run_config=_run_config(tmp_path, name=f"gang{i}"),
                client=gpu3,
            ).fit()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 3
    # Only one 2-GPU group fits on 3 GPUs at a time: their running intervals must not overlap.
    spans = sorted((r.metrics_history[0]["t"], r.metrics_history[-1]["t"]) for r in results.values())
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start > end
    assert gpu3.run_on_scheduler(gang.reservations) == {}


@pytest.mark.dask
def test_fractional_gpus_let_one_rank_groups_share_a_worker(tmp_path):
    with local_cluster(n_workers=1, threads_per_worker=2, resources={"GPU": 1}) as client:
        results = {}

        def run(i):
            results[i] = TorchTrainer(
                report_forever,
                train_loop_config={"max_reports": 6, "interval": 0.1},
                scaling_config=train.ScalingConfig(num_workers=1, resources_per_worker={"GPU": 0.5}),
                run_config=_run_config(tmp_path, name=f"frac{i}"),
                client=client,
            ).fit()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        a, b = (results[i].metrics_history for i in range(2))
        assert a[0]["t"] < b[-1]["t"] and b[0]["t"] < a[-1]["t"], (
            "the two half-GPU groups should run together"
        )
        with pytest.raises(train.InsufficientResourcesError):
            TorchTrainer(
                report_forever,
                scaling_config=train.ScalingConfig(num_workers=2, resources_per_worker={"GPU": 0.5}),
                run_config=_run_config(tmp_path),
                client=client,
            ).fit()


def test_more_ranks_than_the_cluster_can_ever_hold_fails_at_once(gpu3, tmp_path):
    start = time.monotonic()
    with pytest.raises(train.InsufficientResourcesError, match="4 distinct Dask workers"):
        TorchTrainer(
            report_forever,
            scaling_config=train.ScalingConfig(num_workers=4, resources_per_worker={"GPU": 1}),
            run_config=_run_config(tmp_path),
            client=gpu3,
        ).fit()
    assert time.monotonic() - start < 60  # at once: no wait for workers that can never come (seconds, not a timeout)


def test_report_callback_stops_a_group_and_releases_its_workers(gpu3, tmp_path):
    first_started = threading.Event()
    results = {}

    def stop_after_three(metrics):
        first_started.set()
        return metrics["training_iteration"] >= 3

    def run_first():
        results["a"] = TorchTrainer(
            report_forever,
            train_loop_config={"interval": 0.2},
            scaling_config=train.ScalingConfig(num_workers=2, resources_per_worker={"GPU": 1}),
            run_config=_run_config(tmp_path, name="stopper"),
            client=gpu3,
            on_report=stop_after_three,
        ).fit()

    thread = threading.Thread(target=run_first)
    thread.start()
    assert first_started.wait(60)
    waiting = TorchTrainer(  # needs 2 of the 3 GPUs: must wait for the first group to be stopped
        report_forever,
        train_loop_config={"max_reports": 2, "interval": 0.01},
        scaling_config=train.ScalingConfig(num_workers=2, resources_per_worker={"GPU": 1}),
        run_config=_run_config(tmp_path, name="waiter"),
        client=gpu3,
    ).fit()
    thread.join(30)
    a = results["a"]
    assert a.stopped_early and len(a.metrics_history) == 3
    assert waiting.metrics_history[0]["t"] > a.metrics_history[-1]["t"]
    assert not waiting.stopped_early and len(waiting.metrics_history) == 2
    # Nothing left behind on the scheduler: no reservation, no report queue.
    assert gpu3.run_on_scheduler(gang.reservations) == {}
    deadline = time.monotonic() + 10  # queue releases travel on the batched streams, a moment behind
    while gpu3.run_on_scheduler(_our_queues) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gpu3.run_on_scheduler(_our_queues) == []


def test_run_config_stop_ends_a_trainer_at_the_report_that_meets_it(cluster, tmp_path, caplog):
    # Ray's RunConfig(stop=...) (one class for TorchTrainer and Tuner): a dict of bounds, or a function.
    caplog.set_level(logging.INFO, logger="ddp_runtime.trainer")
    result = TorchTrainer(
        report_forever,
        train_loop_config={"interval": 0.01},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(name="stop-dict", storage_path=str(tmp_path), stop={"i": 2}),
        client=cluster,
    ).fit()
    assert result.stopped_early and [m["i"] for m in result.metrics_history] == [0, 1, 2]
    assert "stop-dict: 3 report(s)" in caplog.text  # verbose=1 (the default): one line at the end
    caplog.clear()
    result = TorchTrainer(
        report_forever,
        train_loop_config={"interval": 0.01},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(
            name="stop-fn", storage_path=str(tmp_path), stop=lambda trial_id, m: m["training_iteration"] == 4, verbose=0
        ),
        client=cluster,
    ).fit()
    assert result.stopped_early and len(result.metrics_history) == 4
    assert "stop-fn: " not in caplog.text  # verbose=0: nothing but warnings


def _our_queues(dask_scheduler=None):
    return [name for name in dask_scheduler.extensions["queues"].queues if name.startswith("sweepflow-")]


def test_exception_in_rank_one_fails_the_group_promptly_with_its_traceback(cluster, tmp_path):
    start = time.monotonic()
    with pytest.raises(train.TrainingFailedError) as info:
        TorchTrainer(
            fail_on_rank_one,
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=_run_config(tmp_path),
            client=cluster,
        ).fit()
    elapsed = time.monotonic() - start
    error = info.value.result.error
    assert isinstance(error, train.RankError) and error.rank == 1
    assert "boom on rank one" in str(error) and "fail_on_rank_one" in error.traceback_text
    assert elapsed < 120, f"teardown took {elapsed:.1f}s"  # not a collective timeout (30 min)
    # The cluster is usable afterwards: no rank left hanging, no reservation leaked.
    assert cluster.run_on_scheduler(gang.reservations) == {}
    ok = _train_one_epoch(cluster, tmp_path)
    assert ok.metrics["epoch"] == 0


def test_killed_worker_restarts_the_group_from_its_latest_checkpoint(gpu3, tmp_path):
    log = tmp_path / "epochs.log"
    result = TorchTrainer(
        checkpointed_epochs,
        train_loop_config={"epochs": 6, "kill_at": 3, "log": str(log)},
        scaling_config=train.ScalingConfig(num_workers=2, resources_per_worker={"GPU": 1}),
        run_config=_run_config(tmp_path, failure_config=train.FailureConfig(max_failures=1)),
        client=gpu3,
    ).fit()
    started = [int(line) for line in log.read_text().split()]
    # Epochs 0-2 were checkpointed before the kill in epoch 3: they must not be trained again.
    assert started == [0, 1, 2, 3, 3, 4, 5]
    assert result.num_failures == 1 and result.error is None
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2, 3, 4, 5]
    with result.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "state.pt"))["epoch"] == 5


def test_checkpoints_go_to_s3_and_load_back(cluster, s3_endpoint):
    fs = s3fs.S3FileSystem(**s3_endpoint["storage_options"])
    fs.mkdir("sweepflow-ckpt")
    result = TorchTrainer(
        linear_regression,
        train_loop_config={"epochs": 3},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="s3run",
            storage_path="s3://sweepflow-ckpt/runs",
            storage_options=s3_endpoint["storage_options"],
            checkpoint_config=train.CheckpointConfig(num_to_keep=2),
        ),
        client=cluster,
    ).fit()
    assert result.path == "s3://sweepflow-ckpt/runs/s3run"
    fs.invalidate_cache()
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("sweepflow-ckpt/runs/s3run"))
    assert listed == ["checkpoint_000001", "checkpoint_000002"]
    assert result.checkpoint.path.startswith("s3://")
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "model.pt"))
    assert set(state) == {"weight", "bias"}


def test_retention_keeps_the_best_and_the_latest(cluster, tmp_path):
    result = TorchTrainer(
        scored_checkpoints,
        train_loop_config={"scores": [0.1, 0.9, 0.5, 0.3]},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=_run_config(
            tmp_path,
            name="keep",
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="max"
            ),
        ),
        client=cluster,
    ).fit()
    kept = sorted(os.listdir(tmp_path / "results" / "keep"))
    assert kept == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    assert [m["score"] for _, m in result.best_checkpoints] == [0.9, 0.5, 0.3]
    assert result.checkpoint.path.endswith("checkpoint_000003")


def test_uncommitted_checkpoint_directories_are_invisible(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.txt").write_text("x")
    storage.persist(str(src), 0, {"a": 1})
    half = tmp_path / "run" / "checkpoint_000001"  # as a crash mid-upload would leave it: no marker
    half.mkdir()
    (half / "w.txt").write_text("partial")
    assert [s.index for s in storage.list_committed()] == [0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own working directory is Linux's")
def test_ranks_sharing_a_worker_process_each_work_in_their_own_directory(tmp_path):
    """Two one-rank trials on a worker with two task threads: each rank's thread gets a working directory of its
    own (the process's, which the worker's other threads use, does not move), and goes back afterwards."""
    from ddp_runtime._worker import _working_in

    here = os.getcwd()
    both_inside = threading.Barrier(2, timeout=30)
    seen: dict[str, str] = {}

    def rank(name: str) -> None:
        directory = tmp_path / name
        directory.mkdir()
        with _working_in(str(directory), own_process=False):
            with open("owner.txt", "w") as f:  # the same relative path in both
                f.write(name)
            both_inside.wait()  # both have written: in a shared directory one would read the other's name
            with open("owner.txt") as f:
                seen[name] = f.read()
            seen[f"{name}-cwd"] = os.getcwd()
        seen[f"{name}-after"] = os.getcwd()

    threads = [threading.Thread(target=rank, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {
        "a": "a", "b": "b",
        "a-cwd": str(tmp_path / "a"), "b-cwd": str(tmp_path / "b"),
        "a-after": here, "b-after": here,
    }
    assert os.getcwd() == here
    with _working_in(str(tmp_path / "a"), own_process=True, enabled=False):  # RAY_CHDIR_TO_TRIAL_DIR=0
        assert os.getcwd() == here
    with _working_in(str(tmp_path / "a"), own_process=True):  # a worker process that runs this rank alone
        assert os.getcwd() == str(tmp_path / "a")
    assert os.getcwd() == here


def test_a_rank_on_a_worker_whose_working_directory_was_deleted_still_runs_in_its_trial_directory(tmp_path):
    """A worker started in a directory deleted since (a script's temporary one): the rank runs in its trial's
    directory all the same, then the worker is left in that directory's parent, which exists."""
    from ddp_runtime._worker import _working_in

    here = os.getcwd()
    gone, trial = tmp_path / "gone", tmp_path / "experiment" / "trial_0000"
    gone.mkdir()
    trial.mkdir(parents=True)
    os.chdir(gone)
    try:
        gone.rmdir()
        with _working_in(str(trial), own_process=True):
            assert os.getcwd() == str(trial)
        assert os.getcwd() == str(trial.parent)
    finally:
        os.chdir(here)


def test_config_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        train.ScalingConfig(num_workers=0)
    with pytest.raises(ValueError, match="positive number"):
        train.ScalingConfig(num_workers=1, resources_per_worker={"GPU": -1})
    assert train.ScalingConfig(num_workers=2, use_gpu=True).worker_resources == {"GPU": 1}
    assert train.ScalingConfig(
        num_workers=1, use_gpu=True, resources_per_worker={"GPU": 0.5}
    ).worker_resources == {"GPU": 0.5}
    with pytest.raises(ValueError, match="'min' or 'max'"):
        train.CheckpointConfig(checkpoint_score_order="best")
    with pytest.raises(RuntimeError, match="inside a training function"):
        train.report({"x": 1})
    with pytest.raises(TypeError, match="RunConfig.stop must be a dict"):
        train.RunConfig(stop=3)
    with pytest.raises(ValueError, match="progress_reporter=...\\) draws a Tune experiment's trials table"):
        TorchTrainer(report_forever, run_config=train.RunConfig(progress_reporter=object()))


@pytest.mark.dask
@pytest.mark.subprocess
def test_ported_ray_getting_started_example_runs_and_its_checkpoint_loads(tmp_path):
    """Ray's tutorial with only its imports (and the offline data set) changed; fit() starts its own cluster."""
    env = dict(os.environ, SWEEPFLOW_EXAMPLE_EPOCHS="1", SWEEPFLOW_EXAMPLE_STORAGE=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "ray_train_getting_started.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "loaded checkpoint" in proc.stdout
    assert "'epoch': 0" in proc.stdout


def _sleep_then_return(seconds):
    time.sleep(seconds)
    return "done"


def _task_states(keys, dask_scheduler=None):
    return {key: dask_scheduler.tasks[key].state for key in keys}


def test_a_reservation_ends_on_the_scheduler_when_its_rank_tasks_finish_and_wakes_a_waiting_group(gpu3):
    """The next group is placed as soon as the last rank of the previous one returns, without any client
    releasing anything: a waiting reserve() wakes on the scheduler itself."""
    keys = [f"{gang.RANK_KEY_PREFIX}turnover-a-r{r}" for r in range(3)]
    status, addresses = gpu3.run_on_scheduler(gang.reserve, "turnover-a", 3, {"GPU": 1.0}, keys, 0.0)
    assert status == "reserved" and len(set(addresses)) == 3
    # All three GPUs are held: another group is busy right now...
    assert gpu3.run_on_scheduler(gang.reserve, "turnover-b", 2, {"GPU": 1.0}, [], 0.0) == ("busy", None)
    futures = [
        gpu3.submit(
            _sleep_then_return, 0.5, key=key, workers=[address], allow_other_workers=False, pure=False
        )
        for key, address in zip(keys, addresses, strict=True)
    ]
    # ...and, asked to wait, gets the workers once the first group's ranks have returned (no release call).
    status, placed = gpu3.run_on_scheduler(gang.reserve, "turnover-b", 2, {"GPU": 1.0}, [], 30.0)
    assert status == "reserved" and len(placed) == 2
    # The scheduler had them finished when it placed the group (the client hears of it a moment later).
    assert gpu3.run_on_scheduler(_task_states, keys) == {key: "memory" for key in keys}
    assert [f.result(timeout=30) for f in futures] == ["done"] * 3
    reservations = gpu3.run_on_scheduler(gang.reservations)
    assert "turnover-a" not in reservations and reservations["turnover-b"] == placed
    gpu3.run_on_scheduler(gang.release, "turnover-b")
    assert gpu3.run_on_scheduler(gang.reservations) == {}
    # A group that can never fit is told so at once; a wait that runs out says "busy", it does not hang.
    status, _ = gpu3.run_on_scheduler(gang.reserve, "turnover-c", 4, {"GPU": 1.0}, [], 30.0)
    assert status == "impossible"
    hold = [f"{gang.RANK_KEY_PREFIX}turnover-d-r{r}" for r in range(3)]
    assert gpu3.run_on_scheduler(gang.reserve, "turnover-d", 3, {"GPU": 1.0}, hold, 0.0)[0] == "reserved"
    start = time.monotonic()
    assert gpu3.run_on_scheduler(gang.reserve, "turnover-e", 1, {"GPU": 1.0}, [], 0.3) == ("busy", None)
    assert time.monotonic() - start >= 0.3
    gpu3.run_on_scheduler(gang.release, "turnover-d")
    assert gpu3.run_on_scheduler(gang.reservations) == {}


DRIVER_THAT_HANGS = """
import sys, time
sys.path.insert(0, {tests!r})
from distributed import Client
import ddp_runtime as train
from ddp_runtime.torch import TorchTrainer
from ddp_helpers import report_forever

def hang(metrics):
    open({marker!r}, "w").close()
    time.sleep(3600)  # the driver is killed while rank 0 waits for this verdict

with Client({address!r}) as client:
    TorchTrainer(
        report_forever,
        train_loop_config={{"interval": 0.01}},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path={storage!r}),
        client=client,
        on_report=hang,
    ).fit()
"""


@pytest.mark.subprocess
def test_a_killed_driver_does_not_hold_its_workers(cluster, tmp_path):
    """Ranks outlive a driver process that is killed (Dask cannot stop a task's thread): they must notice and
    end, and the group's reservation must end, so the next group starts within seconds, not after
    TorchConfig.timeout_s (300 s)."""
    marker = tmp_path / "waiting-for-verdict"
    script = DRIVER_THAT_HANGS.format(
        tests=str(paths.SUPPORT),  # ddp_helpers
        marker=str(marker),
        address=cluster.scheduler.address,
        storage=str(tmp_path / "results"),
    )
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert driver.poll() is None, "the driver exited before its first report"
            assert time.monotonic() < deadline, "no report reached the driver"
            time.sleep(0.1)
    finally:
        driver.kill()
        driver.wait()
    start = time.monotonic()
    result = _train_one_epoch(cluster, tmp_path)
    assert result.error is None
    assert time.monotonic() - start < 60
    assert cluster.run_on_scheduler(gang.reservations) == {}


def _span_count(dask_scheduler) -> int:
    return len(dask_scheduler.extensions["spans"].spans)


def _prune_with(name):
    def prune(dask_scheduler) -> int:
        return dask_scheduler.plugins[name].prune()

    return prune


def _probe_spans(dask_scheduler) -> int:
    spans = dask_scheduler.extensions["spans"].spans.values()
    return sum(any(group.name == "span-probe" for group in span.groups) for span in spans)


def _late_heartbeat(dask_scheduler):
    ws = next(iter(dask_scheduler.workers.values()))
    metrics = {("execute", "a-forgotten-span-id", "sum", "task", "seconds"): 0.1}
    return dask_scheduler.extensions["spans"].heartbeat(ws, metrics)


def _running_workers(dask_scheduler) -> int:
    return sum(ws.status.name == "running" for ws in dask_scheduler.workers.values())


def _live_keys(prefix):
    def live(dask_scheduler) -> list:
        return [k for k in dask_scheduler.tasks if str(k).startswith(prefix)]

    return live


def test_finished_spans_are_forgotten_beyond_the_newest_and_the_scheduler_keeps_working(cluster):
    """Dask keeps every span for good (dask/distributed#7977): a computation that finishes before the next starts
    leaves a span behind, as each trial's group did. The pruner forgets finished ones beyond the newest `keep`,
    only when they were finished at its pass before (the workers' heartbeats have reported their metrics)."""
    from ddp_runtime.span_pruner import FinishedSpanPruner

    name = "test-span-pruner"
    workers = cluster.run_on_scheduler(_running_workers)
    cluster.register_plugin(FinishedSpanPruner(keep=2, interval_s=3600), name=name)
    try:
        for i in range(6):  # one after another, each forgotten before the next: each in a new default span
            future = cluster.submit(sum, [i, 1], key=f"span-probe-{i}", pure=False)
            assert future.result() == i + 1
            future.release()
            deadline = time.monotonic() + 30
            while cluster.run_on_scheduler(_live_keys("span-probe")) and time.monotonic() < deadline:
                time.sleep(0.02)
        before = cluster.run_on_scheduler(_span_count)
        assert before >= 6, before
        assert cluster.run_on_scheduler(_prune_with(name)) == 0  # first pass: nothing was finished before
        forgotten = cluster.run_on_scheduler(_prune_with(name))
        # Of the six, the newest two stay; so does any span of the session's cluster still in use.
        assert forgotten >= 4 and cluster.run_on_scheduler(_probe_spans) <= 2, (before, forgotten)
        assert cluster.run_on_scheduler(_span_count) == before - forgotten
        # A heartbeat still carrying metrics of a forgotten span is taken (its metrics dropped): raising there
        # would make the worker close for good.
        assert cluster.run_on_scheduler(_late_heartbeat) is None
        # The scheduler goes on: new work gets a new span, heartbeats after the pruning raise nothing, no worker
        # is lost.
        assert cluster.submit(sum, [41, 1], key="span-probe-after", pure=False).result() == 42
        time.sleep(2)  # a few worker heartbeats
        assert not [line for _, line in cluster.get_scheduler_logs() if "KeyError" in line or "span" in line.lower()]
        assert cluster.run_on_scheduler(_running_workers) == workers
    finally:
        cluster.unregister_scheduler_plugin(name)


def test_side_messages_arrive_in_order_with_the_reports_or_the_result_and_alone_after_a_long_wait(cluster, tmp_path):
    """Rank 0's side channel (the sweep's system metrics use it): what was posted before a report reaches the
    driver before that report, with no round trip of its own; what was posted after the last report comes with
    the rank's result; messages whose oldest waited flush_after_s for a report go alone, at the next post. Rank 1
    has no channel."""
    seen, at = [], {}

    def on_side(payload):
        seen.append(("side", payload))
        at[payload] = time.monotonic()

    result = TorchTrainer(
        side_messages,
        train_loop_config={"flush_after_s": 0.3},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, name="side"),
        client=cluster,
        on_report=lambda metrics: seen.append(("report", metrics["n"])) and False,
        on_side=on_side,
    ).fit()
    assert result.error is None and len(result.metrics_history) == 2
    assert seen == [
        ("side", "a"), ("side", "b"), ("report", 1), ("side", "c"), ("report", 2),
        ("side", "d"), ("side", "e"), ("side", "f"),
    ], seen
    assert at["f"] - at["e"] > 0.8  # "d" and "e" went while the function ran, "f" with its result


@pytest.mark.subprocess
def test_fast_exit_runs_every_exit_handler_and_then_collects_no_more(tmp_path):
    """``ddp_runtime._exit.fast_exit`` (every Dask worker's, through the preload): the exit handlers registered
    after it and ``weakref.finalize`` callbacks (a temporary directory's clean-up) still run; what is left alive
    at exit is not finalized any more (the garbage collector's walks that made a worker's exit outlast the
    nanny's wait), where Python's default exit collects and finalizes it."""
    script = (
        "import atexit, os, sys, tempfile\n"
        "from ddp_runtime._exit import fast_exit\n"
        "if sys.argv[1] == 'fast':\n"
        "    fast_exit()\n"
        "class Noisy:\n"
        "    def __del__(self):\n"
        "        print('finalized at exit', flush=True)\n"
        "cycle = Noisy(); cycle.me = cycle; del cycle\n"
        "scratch = tempfile.TemporaryDirectory(dir=sys.argv[2])\n"
        "atexit.register(print, 'handler ran', flush=True)\n"
    )
    runs = {
        mode: subprocess.run(
            [sys.executable, "-c", script, mode, str(tmp_path)], capture_output=True, text=True, timeout=60
        )
        for mode in ("fast", "default")
    }
    for mode, run in runs.items():
        assert run.returncode == 0, (mode, run.stderr)
        assert "handler ran" in run.stdout, (mode, run.stdout)
    assert os.listdir(tmp_path) == []  # both temporary directories were removed at exit
    assert "finalized at exit" in runs["default"].stdout  # the control: Python's own exit collects the cycle
    assert "finalized at exit" not in runs["fast"].stdout


def test_a_training_group_costs_the_scheduler_few_round_trips_while_it_trains(cluster, tmp_path):
    """While a group trains, its driver waits on its reports and on its ranks' ends, and asks the scheduler
    whether its workers are alive only every ``_LIVENESS_EVERY_S`` (each ask is a `run_on_scheduler` round trip,
    which costs the flow process and the scheduler CPU for as long as trials train). Counted on the scheduler's
    own log of the functions run on it."""

    def run_functions(dask_scheduler=None) -> list[float]:
        return [t for t, event in dask_scheduler.get_events("all") if event.get("action") == "run-function"]

    before = set(cluster.run_on_scheduler(run_functions))
    started = time.time()
    result = TorchTrainer(
        report_forever,
        train_loop_config={"interval": 0.5, "max_reports": 8},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=_run_config(tmp_path, name="quiet"),
        client=cluster,
    ).fit()
    ended = time.time()
    assert result.error is None and len(result.metrics_history) == 8
    during = [t for t in cluster.run_on_scheduler(run_functions) if t not in before and started <= t <= ended]
    # Placing and releasing the group take a few; the liveness checks one per 2 s of the ~4 s.
    seconds = ended - started
    assert len(during) <= 6 + seconds / 2.0, f"{len(during)} functions run on the scheduler in {seconds:.1f} s"
