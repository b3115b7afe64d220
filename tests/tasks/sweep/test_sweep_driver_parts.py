"""The sweep driver's pure parts: the Sampler interface, trial templates, results, resource accounting."""

from __future__ import annotations

import os
import random
import shutil
import threading

import pytest

from ddp_runtime.checkpoint import MARKER, RunStorage
from sweepflow.tasks.sweep.results import ResourceUsage, SweepResult, TrialResult, TrialStatus, best_of
from sweepflow.tasks.sweep.samplers import (
    GridSampler,
    RandomSampler,
    Sampler,
    SamplerExhausted,
    TPESampler,
    make_sampler,
)
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.sweep.trial_exploits import copy_latest

SPACE = {
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "bs": {"type": "choice", "values": [16, 32]},
    "opt": {"type": "grid", "values": ["adam", "sgd"]},
}


def _ask_all(sampler: Sampler) -> list[tuple[int, dict]]:
    out = []
    while True:
        try:
            out.append(sampler.ask())
        except SamplerExhausted:
            return out


def test_list_samplers_ask_what_generate_plans_then_are_exhausted():
    random = make_sampler("random", SPACE, num_samples=3, seed=7, mode="max")
    assert isinstance(random, RandomSampler) and random.total == 6  # 3 samples x 2 grid values
    asked = _ask_all(random)
    assert [n for n, _ in asked] == list(range(6))
    assert [c for _, c in asked] == RandomSampler(SPACE, seed=7).generate(3)  # same seed, same sequence
    grid = make_sampler(
        "grid", {"bs": {"type": "choice", "values": [16, 32]}, "k": 3}, num_samples=2, seed=0, mode="max"
    )
    assert isinstance(grid, GridSampler) and grid.total == 4
    assert [c for _, c in _ask_all(grid)] == [{"bs": 16, "k": 3}, {"bs": 32, "k": 3}] * 2
    grid.tell(0, 1.0)  # results are accepted and ignored by list samplers


def test_tpe_sampler_asks_num_samples_trials_and_learns_from_tell():
    space = {"x": {"type": "uniform", "low": 0.0, "high": 10.0}}
    sampler = make_sampler("tpe", space, num_samples=12, seed=0, mode="min")
    assert isinstance(sampler, TPESampler) and sampler.total == 12
    seen = []
    for _ in range(12):
        number, config = sampler.ask()
        sampler.tell(number, (config["x"] - 3.0) ** 2)
        seen.append(config["x"])
    with pytest.raises(SamplerExhausted):
        sampler.ask()
    assert min(abs(x - 3.0) for x in seen[4:]) < min(abs(x - 3.0) for x in seen[:4]) + 1.0
    with pytest.raises(ValueError, match="unknown sampler"):
        make_sampler("bayes", space, num_samples=1, seed=0, mode="min")


def test_trial_template_fills_each_trial_from_the_shared_part():
    template = TrialTemplate(
        train_fn="pkg.mod:fn",
        train_loop_config={"epochs": 4, "lr": 0.5, "data_path": "/d"},
        num_ranks=2,
        resources_per_rank={"GPU": 1.0},
        use_gpu=True,
        selection_metric="val_accuracy",
        selection_mode="max",
        max_reports=4,
        seed=10,
        varying_names=("lr",),
    )
    spec = template.trial(3, {"lr": 0.01, "bs": 32})
    assert spec.trial_id == "trial_0003" and spec.name == "trial_0003-lr=0.01"
    assert spec.train_loop_config == {"epochs": 4, "lr": 0.01, "bs": 32, "data_path": "/d", "seed": 13}
    assert spec.template is template and template.gpus_per_rank == 1.0


def _trial(i: int, status: TrialStatus, best: float | None, **usage) -> TrialResult:
    return TrialResult(
        trial_id=f"trial_{i:04d}",
        index=i,
        name=f"trial_{i:04d}",
        config={"lr": 0.1 * (i + 1)},
        status=status,
        run_id=f"run{i}",
        epochs=2,
        best=best,
        best_epoch=2 if best is not None else None,
        usage=ResourceUsage(**usage),
    )


def test_sweep_result_picks_the_best_reached_value_and_totals_the_resources():
    trials = (
        _trial(0, TrialStatus.COMPLETED, 0.80, ranks=2, gpus_per_rank=1, group_seconds=10.0),
        # stopped early, but it reached the best value: it is selectable (Ray: scope="all")
        _trial(
            1,
            TrialStatus.STOPPED,
            0.90,
            ranks=2,
            gpus_per_rank=1,
            group_seconds=4.0,
            saved_epochs=2,
            epoch_seconds=1.5,
        ),
        _trial(2, TrialStatus.FAILED, 0.99, ranks=2, gpus_per_rank=1, group_seconds=1.0),
    )
    sweep = SweepResult(trials, metric="val_accuracy", mode="max")
    assert sweep.best().trial_id == "trial_0001"
    assert [t.trial_id for t in sweep.failed] == ["trial_0002"]
    assert SweepResult(trials, metric="val_loss", mode="min").best().trial_id == "trial_0000"
    totals = sweep.usage()
    assert totals["worker_seconds"] == pytest.approx(2 * (10 + 4 + 1))
    assert totals["startup_seconds"] == 0
    # A cold cluster's start-up: before the first trial (the sweep's) and inside a group (a restarted worker's),
    # stated apart and in no trial's worker-seconds.
    cold = SweepResult(
        (*trials, _trial(3, TrialStatus.COMPLETED, 0.5, ranks=2, group_seconds=2.0, startup_seconds=6.5)),
        metric="val_accuracy",
        mode="max",
        startup_s=12.25,
    )
    assert cold.usage()["startup_seconds"] == pytest.approx(18.75)
    assert cold.usage()["worker_seconds"] == pytest.approx(2 * (10 + 4 + 1 + 2))
    assert totals["gpu_seconds"] == pytest.approx(2 * 1 * (10 + 4 + 1))
    assert totals["saved_worker_seconds"] == pytest.approx(2 * 2 * 1.5)
    assert totals["saved_gpu_seconds"] == pytest.approx(2 * 2 * 1.5)
    board = sweep.leaderboard()
    assert list(board["trial"]) == ["trial_0002", "trial_0001", "trial_0000"]  # best first by best value
    assert list(board["worker_s"]) == [2.0, 8.0, 20.0]
    assert SweepResult((), metric="m", mode="max").best() is None


def test_best_of_skips_non_finite_values_and_names_the_epoch():
    history = [
        {"epoch": 1, "loss": 0.5},
        {"epoch": 2, "loss": float("nan")},
        {"epoch": 3, "loss": 0.2},
        {"epoch": 4},
    ]
    assert best_of(history, "loss", "min") == (0.2, 3)
    assert best_of(history, "loss", "max") == (0.5, 1)
    assert best_of([], "loss", "min") == (None, None)


def test_trial_status_maps_to_mlflow_and_to_selection():
    assert TrialStatus.STOPPED.mlflow_status == "FINISHED" and TrialStatus.COMPLETED.mlflow_status == "FINISHED"
    assert TrialStatus.FAILED.mlflow_status == "FAILED"
    assert TrialStatus.STOPPED.selectable and not TrialStatus.FAILED.selectable
    assert TrialStatus("STOPPED") is TrialStatus.STOPPED and TrialStatus.STOPPED == "STOPPED"
    assert _trial(0, TrialStatus.STOPPED, 0.5).to_dict()["status"] == "STOPPED"


def test_an_exploit_copies_a_whole_checkpoint_while_the_donor_deletes_its_old_ones(tmp_path):
    """PBT copies the donor's latest checkpoint while the donor trains on and its retention deletes each
    checkpoint once a newer one is committed (num_to_keep=1): every copy holds all the files of one checkpoint (never
    a part, never an error); one deleted while being read is given up for the newer one."""
    files = 100
    donor, recipient = RunStorage(str(tmp_path), "donor"), RunStorage(str(tmp_path), "recipient")

    def save(i: int) -> None:
        local = tmp_path / f"local-{i}"
        local.mkdir()
        for k in range(files):
            (local / f"part-{k:03d}").write_text(str(i))
        donor.persist(str(local), i, {"step": i})
        shutil.rmtree(local)

    save(0)
    stop, errors = threading.Event(), []

    def train_on() -> None:
        i, rng = 1, random.Random(0)
        try:
            while not stop.is_set():
                save(i)
                donor.delete(donor.list_committed()[0])
                stop.wait(rng.uniform(0, 0.03))
                i += 1
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=train_on)
    thread.start()
    try:
        for _ in range(15):
            copied, taken = copy_latest(donor, recipient, donor.list_committed()[-1])
            with copied.as_directory() as directory:
                names = set(os.listdir(directory)) - {MARKER}
                contents = {open(os.path.join(directory, name)).read() for name in names}
            assert len(names) == files and contents == {str(taken.index)}, (len(names), contents)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert not [n for n in os.listdir(recipient.root) if n.startswith(".tmp")]  # no half copy left behind
