"""A ``TorchTrainer``'s own callbacks (Ray Train v2's ``UserCallback`` in ``RunConfig(callbacks=...)``), and a
trainer fitted inside another group's rank (Ray Train v2's Tune pattern, whose trial function drives a group):
the rank lends its reservation, so a cluster of two workers runs a 1-rank driver and its 2-rank group."""

from __future__ import annotations

import os
import tempfile

import pytest

import ddp_runtime as train
from ddp_runtime import _gang as gang
from ddp_runtime.torch import TorchTrainer


class Recorder(train.UserCallback):
    """Keeps every call: ("report", metrics, checkpoint path) and ("exception", {rank: message})."""

    def __init__(self, stop_at: int | None = None, fail_at: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.stop_at, self.fail_at = stop_at, fail_at

    def after_report(self, run_context, metrics, checkpoint):
        assert isinstance(run_context, train.TrainRunContext) and run_context.get_run_config().name
        self.calls.append(("report", metrics, checkpoint.path if checkpoint is not None else None))
        if self.stop_at is not None and metrics[0]["step"] == self.stop_at:
            raise train.StopTraining()
        if self.fail_at is not None and metrics[0]["step"] == self.fail_at:
            raise ValueError("the callback's own bug")

    def after_exception(self, run_context, worker_exceptions):
        self.calls.append(("exception", {rank: str(e).splitlines()[0] for rank, e in worker_exceptions.items()}))


def steps(config):
    """Reports step 0..n-1; rank 0 attaches a checkpoint to the odd steps; fails once at config["fail_at"]."""
    ctx = train.get_context()
    for step in range(config["n"]):
        checkpoint = None
        with tempfile.TemporaryDirectory() as d:
            if step % 2 and ctx.get_world_rank() == 0:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
                checkpoint = train.Checkpoint.from_directory(d)
            train.report({"step": step, "rank_seen": ctx.get_world_rank()}, checkpoint=checkpoint)
        marker = config.get("fail_marker")
        if marker and step == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("the first attempt fails after step 1")


def _trainer(tmp_path, callbacks, *, ranks=1, **config):
    return TorchTrainer(
        steps,
        train_loop_config={"n": 4, **config},
        scaling_config=train.ScalingConfig(num_workers=ranks),
        run_config=train.RunConfig(
            name=f"cb-{ranks}", storage_path=str(tmp_path), callbacks=callbacks,
            failure_config=train.FailureConfig(max_failures=1),
        ),
    )


@pytest.mark.parametrize("ranks", [1, 2])
def test_after_report_gets_rank_0s_metrics_and_each_reports_committed_checkpoint(cluster, tmp_path, ranks):
    recorder = Recorder()
    result = _trainer(tmp_path, [recorder], ranks=ranks).fit()
    reports = [c for c in recorder.calls if c[0] == "report"]
    assert [(m[0]["step"], m[0]["rank_seen"], len(m)) for _, m, _ in reports] == [(s, 0, 1) for s in range(4)]
    paths = [path for _, _, path in reports]
    assert paths[0] is None and paths[2] is None  # even steps: no checkpoint
    for path, step in ((paths[1], 1), (paths[3], 3)):  # committed before the callback saw it
        with open(os.path.join(path, "step")) as f:
            assert f.read() == str(step)
    assert result.checkpoint.path == paths[3]


def test_after_exception_hears_of_a_failed_attempt_and_the_retry_reports_on(cluster, tmp_path):
    recorder = Recorder()
    _trainer(tmp_path, [recorder], fail_marker=str(tmp_path / "failed")).fit()
    kinds = [c[0] for c in recorder.calls]
    assert kinds.count("exception") == 1 and kinds.index("exception") == 2  # after steps 0 and 1
    ((rank, message),) = recorder.calls[2][1].items()
    assert rank == 0 and "the first attempt fails after step 1" in message


def test_stop_training_from_a_callback_stops_the_group_there_and_fit_raises_it(cluster, tmp_path):
    recorder, later = Recorder(stop_at=1), Recorder()
    with pytest.raises(train.StopTraining):
        _trainer(tmp_path, [recorder, later], ranks=2).fit()
    assert [m[0]["step"] for kind, m, _ in recorder.calls if kind == "report"] == [0, 1]
    assert len(later.calls) == 1  # the hooks after the one that raised are not called for that report
    assert whole(cluster, 2)


def test_a_callbacks_error_stops_the_group_and_fit_raises_it(cluster, tmp_path):
    recorder = Recorder(fail_at=0)
    with pytest.raises(ValueError, match="the callback's own bug"):
        _trainer(tmp_path, [recorder]).fit()
    assert len(recorder.calls) == 1


def test_a_tune_callback_or_anything_else_is_refused_with_where_it_goes(tmp_path):
    class TuneStyle:
        def on_trial_result(self, *args, **kwargs):
            pass

    with pytest.raises(ValueError, match=r"takes ddp_runtime.UserCallback objects.*go in Tuner\(run_config=...\)"):
        _trainer(tmp_path, [TuneStyle()])


# ------------------------------------------------------------------------------ a trainer inside another's rank


def driver(config):
    """A 1-rank group's function that fits a 2-rank group of its own and reports what it got."""
    inner = TorchTrainer(
        steps,
        train_loop_config={"n": 2},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="inner", storage_path=config["storage"]),
    )
    result = inner.fit()
    train.report({"inner_reports": len(result.metrics_history), "inner_last": result.metrics["step"]})


def test_a_rank_that_fits_a_trainer_lends_its_worker_so_two_workers_hold_both_groups(cluster, tmp_path):
    outer = TorchTrainer(
        driver,
        train_loop_config={"storage": str(tmp_path / "inner")},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(name="outer", storage_path=str(tmp_path / "outer")),
        client=cluster,
    )
    result = outer.fit()  # without the lend the inner group waits for the outer's worker for good
    assert result.metrics["inner_reports"] == 2 and result.metrics["inner_last"] == 1
    assert not cluster.run_on_scheduler(gang.reservations)


def whole(client, n):
    from conftest import whole as wait_whole

    return wait_whole(client, n)
