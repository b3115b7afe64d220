"""Tests for sweepflow.tasks.sweep.schedulers: ASHA decisions are checked against cutoffs computed by hand.

Cutoff rule (Ray's _Bracket.cutoff): the (1 - 1/rf) * 100 percentile, linear interpolation, of the
values already recorded at the rung, in "higher is better" sign (min-mode values are negated). A
trial is stopped iff its value is strictly below the cutoff. For a sorted list v[0..n-1] the
percentile p sits at index (n - 1) * p / 100, interpolated between its two neighbours.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sweepflow.tasks.sweep.schedulers import (
    CONTINUE,
    STOP,
    ASHAScheduler,
    FIFOScheduler,
    TrialScheduler,
    make_scheduler,
)


def _r(value: float, it: int, metric: str = "acc") -> dict[str, float]:
    return {metric: value, "training_iteration": it}


def _asha(**kwargs: object) -> ASHAScheduler:
    params: dict[str, object] = {
        "metric": "acc",
        "mode": "max",
        "max_t": 4,
        "grace_period": 1,
        "reduction_factor": 2,
    }
    params.update(kwargs)
    sched = ASHAScheduler(**params)  # type: ignore[arg-type]
    return sched


def test_rung_milestones_match_ray() -> None:
    # Ray: num_rungs = int(log(max_t / grace) / log(rf) + 1).
    # grace 1, rf 2, max_t 4: log2(4) + 1 = 3 rungs -> 1, 2, 4 (the rung at 4 = max_t never decides).
    assert _asha().milestones == [1, 2, 4]
    # grace 1, rf 3, max_t 10: log3(10) = 2.096 -> int(3.096) = 3 rungs -> 1, 3, 9.
    assert _asha(reduction_factor=3, max_t=10).milestones == [1, 3, 9]
    # grace 2, rf 4, max_t 100: log4(50) = 2.82 -> 3 rungs -> 2, 8, 32.
    assert _asha(grace_period=2, reduction_factor=4, max_t=100).milestones == [2, 8, 32]
    # grace == max_t: log(1) = 0 -> 1 rung at max_t, i.e. nothing is ever stopped early.
    assert _asha(grace_period=4, max_t=4).milestones == [4]


def test_asha_mode_max_interleaved() -> None:
    # rf 2 -> cutoff is the 50th percentile (the median); deciding rungs at t=1 and t=2, max_t 4.
    s = _asha()
    for t in "ABCD":
        s.on_trial_add(t)

    # Rung 1 empty -> no cutoff -> CONTINUE. rung1 = {A: .5}
    assert s.on_trial_result("A", _r(0.5, 1)) == CONTINUE
    # Rung 1 cutoff = median(.5) = .5; .7 >= .5 -> CONTINUE. rung1 = {.5, .7}
    assert s.on_trial_result("B", _r(0.7, 1)) == CONTINUE
    # Cutoff = median(.5, .7) = .6; .55 < .6 -> STOP. C is still recorded: rung1 = {.5, .55, .7}
    assert s.on_trial_result("C", _r(0.55, 1)) == STOP
    # A at t=2: rung 2 empty -> CONTINUE. rung2 = {A: .6}
    assert s.on_trial_result("A", _r(0.6, 2)) == CONTINUE
    # D at t=1: cutoff = median(.5, .55, .7) = .55; .6 >= .55 -> CONTINUE. rung1 = {.5, .55, .6, .7}
    assert s.on_trial_result("D", _r(0.6, 1)) == CONTINUE
    # B at t=2: rung2 cutoff = median(.6) = .6; .65 >= .6 -> CONTINUE. rung2 = {.6, .65}
    assert s.on_trial_result("B", _r(0.65, 2)) == CONTINUE
    # D at t=2: rung2 cutoff = median(.6, .65) = .625; .62 < .625 -> STOP.
    assert s.on_trial_result("D", _r(0.62, 2)) == STOP
    # A at t=3: no milestone at 3; rung 2 and rung 1 already hold A -> CONTINUE whatever the value.
    assert s.on_trial_result("A", _r(0.01, 3)) == CONTINUE
    # A at t=4 >= max_t -> STOP (completed), regardless of the value.
    assert s.on_trial_result("A", _r(0.99, 4)) == STOP
    # B: t=3 continues (already recorded everywhere below), t=4 is max_t.
    assert s.on_trial_result("B", _r(0.1, 3)) == CONTINUE
    assert s.on_trial_result("B", _r(0.1, 4)) == STOP

    # Rung 1: median(.5, .55, .6, .7) = (.55 + .6) / 2 = .575; rung 2: median(.6, .62, .65) = .62.
    cutoffs = s.rung_cutoffs()
    assert cutoffs[1] == pytest.approx(0.575)
    assert cutoffs[2] == pytest.approx(0.62)
    assert cutoffs[4] is None  # nothing completed yet


def test_asha_mode_min_rf3() -> None:
    # rf 3 -> percentile 66.67 of negated losses; grace 1, max_t 9 -> rungs 1, 3, (9).
    s = ASHAScheduler(metric="val_loss", mode="min", max_t=9, grace_period=1, reduction_factor=3)
    assert s.milestones == [1, 3, 9]
    for t in ("t1", "t2", "t3", "t4"):
        s.on_trial_add(t)

    def r(loss: float, it: int) -> dict[str, float]:
        return {"val_loss": loss, "training_iteration": it}

    # t1 loss 1.0 -> -1.0; rung 1 empty -> CONTINUE. rung1 = [-1.0]
    assert s.on_trial_result("t1", r(1.0, 1)) == CONTINUE
    # t2 -2.0; cutoff = pct([-1.0]) = -1.0; -2 < -1 -> STOP. rung1 = [-2, -1]
    assert s.on_trial_result("t2", r(2.0, 1)) == STOP
    # t3 -0.5; cutoff on [-2, -1] at index 1 * 2/3 = .667 -> -2 + .667 * 1 = -1.333; -0.5 >= -> CONTINUE
    assert s.on_trial_result("t3", r(0.5, 1)) == CONTINUE
    # t4 -1.5; sorted [-2, -1, -0.5], index 2 * 2/3 = 1.333 -> -1 + .333 * .5 = -0.833; -1.5 < -> STOP
    assert s.on_trial_result("t4", r(1.5, 1)) == STOP
    # t1 at t=2 < 3: only rung 1 reached and t1 is recorded there -> CONTINUE even with a bad loss.
    assert s.on_trial_result("t1", r(5.0, 2)) == CONTINUE
    # t1 at t=3: rung 3 empty -> CONTINUE. rung3 = [-0.9]
    assert s.on_trial_result("t1", r(0.9, 3)) == CONTINUE
    # t3 at t=3: cutoff = -0.9; -0.4 >= -0.9 -> CONTINUE. rung3 = [-0.9, -0.4]
    assert s.on_trial_result("t3", r(0.4, 3)) == CONTINUE

    cutoffs = s.rung_cutoffs()  # reported in loss units (sign restored)
    # Rung 1 holds t1..t4 (t4 was recorded although stopped): sorted [-2, -1.5, -1, -0.5], index
    # 3 * 2/3 = 2 -> exactly -1 -> loss 1.0.
    assert cutoffs[1] == pytest.approx(1.0)
    assert cutoffs[3] == pytest.approx(0.9 - (2 / 3) * 0.5)  # -(-0.9 + (2/3) * 0.5) = 0.5667
    # A later trial at rung 3 with loss 0.6 > 0.5667 is stopped; 0.5 is not.
    s.on_trial_add("t5")
    s.on_trial_add("t6")
    assert s.on_trial_result("t5", r(0.1, 1)) == CONTINUE  # -0.1 >= rung-1 cutoff -1
    assert s.on_trial_result("t5", r(0.6, 3)) == STOP
    # rung3 now [-0.9, -0.6, -0.4]: index 1.333 -> -0.6 + .333 * .2 = -0.5333; loss .5 -> -.5 >= -> CONTINUE
    assert s.on_trial_result("t6", r(0.5, 3)) == CONTINUE


def test_asha_tie_continues() -> None:
    # Ray stops only when strictly worse than the cutoff. Rung 1 = [1, 3] -> median 2; a value of 2 continues.
    s = _asha()
    for t in "ABC":
        s.on_trial_add(t)
    assert s.on_trial_result("A", _r(1, 1)) == CONTINUE
    assert s.on_trial_result("B", _r(3, 1)) == CONTINUE
    assert s.on_trial_result("C", _r(2, 1)) == CONTINUE


def test_asha_skipped_rungs_record_only_the_highest() -> None:
    # grace 1, rf 2, max_t 8 -> rungs 1, 2, 4, 8. A trial whose first report is at t=3 is compared and
    # recorded at rung 2 only (Ray breaks after the highest reached rung), not at rung 1.
    s = _asha(max_t=8)
    s.on_trial_add("A")
    s.on_trial_add("B")
    assert s.on_trial_result("A", _r(0.5, 3)) == CONTINUE
    assert s.rung_cutoffs() == {1: None, 2: 0.5, 4: None, 8: None}
    # B at t=1: rung 1 is still empty -> CONTINUE even though 0.1 is far worse than A.
    assert s.on_trial_result("B", _r(0.1, 1)) == CONTINUE
    # B at t=2: rung 2 cutoff = 0.5; 0.2 < 0.5 -> STOP
    assert s.on_trial_result("B", _r(0.2, 2)) == STOP


def test_asha_max_t_stop_and_complete_records_at_max_t_rung() -> None:
    s = _asha()
    s.on_trial_add("A")
    # First report already at max_t: STOP without consulting (or writing) any rung.
    assert s.on_trial_result("A", _r(0.9, 4)) == STOP
    assert s.rung_cutoffs() == {1: None, 2: None, 4: None}
    # on_trial_complete records the final value, as Ray does, at the highest rung reached (4 = max_t).
    s.on_trial_complete("A", _r(0.9, 4))
    assert s.rung_cutoffs() == {1: None, 2: None, 4: 0.9}
    # A trial past max_t by a custom time attr is stopped too.
    e = ASHAScheduler(metric="acc", mode="max", max_t=10, time_attr="epoch")
    e.on_trial_add("x")
    assert e.on_trial_result("x", {"acc": 0.1, "epoch": 12}) == STOP


def test_asha_complete_records_unrecorded_rung() -> None:
    # A trial that completed at t=2 without its t=2 result having been reported is recorded at rung 2
    # by on_trial_complete, so it is part of the cutoff for later trials.
    s = _asha()
    for t in "AB":
        s.on_trial_add(t)
    assert s.on_trial_result("A", _r(0.8, 1)) == CONTINUE
    s.on_trial_complete("A", _r(0.8, 2))
    assert s.rung_cutoffs()[2] == 0.8
    assert s.on_trial_result("B", _r(0.9, 1)) == CONTINUE  # 0.9 >= cutoff 0.8
    assert s.on_trial_result("B", _r(0.7, 2)) == STOP  # 0.7 < cutoff 0.8
    s.on_trial_complete("B", None)  # nothing to record; fine
    with pytest.raises(ValueError, match="unknown trial 'B'"):
        s.on_trial_result("B", _r(0.7, 3))


def test_asha_missing_metric_names_metric_and_keys() -> None:
    s = ASHAScheduler(metric="val_loss", mode="min", max_t=4)
    s.on_trial_add("A")
    with pytest.raises(ValueError, match=r"no 'val_loss'; reported keys: \['loss', 'training_iteration'\]"):
        s.on_trial_result("A", {"loss": 1.0, "training_iteration": 1})
    with pytest.raises(ValueError, match="no 'training_iteration'"):
        s.on_trial_result("A", {"val_loss": 1.0})
    with pytest.raises(ValueError, match="non-numeric 'val_loss'"):
        s.on_trial_result("A", {"val_loss": "abc", "training_iteration": 1})


def test_asha_accepts_numpy_and_nan() -> None:
    s = _asha()
    for t in "ABC":
        s.on_trial_add(t)
    assert s.on_trial_result("A", {"acc": np.float32(0.5), "training_iteration": np.int64(1)}) == CONTINUE
    # NaN: neither better nor worse than the cutoff -> CONTINUE (Ray semantics); ignored by nanpercentile.
    assert s.on_trial_result("B", _r(float("nan"), 1)) == CONTINUE
    # Cutoff = nanmedian(.5, nan) = .5; .4 < .5 -> STOP
    assert s.on_trial_result("C", _r(0.4, 1)) == STOP


def test_asha_unknown_and_duplicate_trials() -> None:
    s = _asha()
    with pytest.raises(ValueError, match="call on_trial_add first"):
        s.on_trial_result("nope", _r(1, 1))
    s.on_trial_add("A")
    with pytest.raises(ValueError, match="added twice"):
        s.on_trial_add("A")
    s.on_trial_error("A")
    with pytest.raises(ValueError, match="unknown trial"):
        s.on_trial_result("A", _r(1, 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grace_period": 0}, "grace_period must be >= 1"),
        ({"max_t": 2, "grace_period": 3}, "max_t must be >= grace_period"),
        ({"reduction_factor": 1}, "reduction_factor must be > 1"),
        ({"mode": "maximize"}, "mode must be 'min'"),
        ({"metric": ""}, "metric must be the non-empty name"),
        ({"max_t": float("inf")}, "max_t must be a finite number"),
        ({"grace_period": True}, "grace_period must be a finite number"),
    ],
)
def test_asha_invalid_params(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _asha(**kwargs)


def test_fifo_never_stops() -> None:
    s = FIFOScheduler()
    s.on_trial_add("A")
    for it in range(1, 100):
        assert s.on_trial_result("A", {"anything": it, "training_iteration": it}) == CONTINUE
    s.on_trial_complete("A", None)
    s.on_trial_error("A")


def test_make_scheduler() -> None:
    assert isinstance(make_scheduler(None), FIFOScheduler)
    assert isinstance(make_scheduler({"type": "fifo"}), FIFOScheduler)
    s = make_scheduler(
        {
            "type": "asha",
            "metric": "val_loss",
            "mode": "min",
            "max_t": 10,
            "grace_period": 1,
            "reduction_factor": 2,
        }
    )
    assert isinstance(s, ASHAScheduler) and isinstance(s, TrialScheduler)
    assert (s.metric, s.mode, s.max_t, s.grace_period, s.reduction_factor) == ("val_loss", "min", 10, 1, 2)
    assert s.milestones == [1, 2, 4, 8]  # log2(10) = 3.32 -> 4 rungs
    with pytest.raises(ValueError, match=r"unknown keys \['grace'\]"):
        make_scheduler({"type": "asha", "metric": "m", "mode": "min", "max_t": 4, "grace": 2})
    with pytest.raises(ValueError, match=r"needs \['mode', 'max_t'\]"):
        make_scheduler({"type": "asha", "metric": "m"})
    with pytest.raises(ValueError, match="unknown scheduler type 'hyperband'"):
        make_scheduler({"type": "hyperband"})
    with pytest.raises(ValueError, match="takes no parameters"):
        make_scheduler({"type": "fifo", "metric": "m"})


def test_asha_thread_safety() -> None:
    # 8 threads x 50 trials each report concurrently; every trial must get exactly one decision per
    # report and the rung bookkeeping must hold one value per trial (no lost updates).
    s = ASHAScheduler(metric="acc", mode="max", max_t=100, grace_period=1, reduction_factor=2)
    rng = np.random.default_rng(0)
    values = rng.random((8, 50))
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(50):
                tid = f"{w}-{i}"
                s.on_trial_add(tid)
                assert s.on_trial_result(tid, _r(float(values[w, i]), 1)) in (CONTINUE, STOP)
                s.on_trial_complete(tid, None)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert s.rung_cutoffs()[1] == pytest.approx(float(np.median(values)))


def test_median_stopping_rule_stops_a_trial_below_the_median_of_the_others_running_means():
    from sweepflow.tasks.sweep.schedulers import MedianStoppingRule

    rule = MedianStoppingRule(metric="acc", mode="max", grace_period=2, min_samples_required=2)
    for trial, values in {"a": [0.5, 0.7, 0.9], "b": [0.4, 0.6, 0.8]}.items():  # running means at t=2: 0.6, 0.5
        rule.on_trial_add(trial)
        for t, v in enumerate(values, start=1):
            assert rule.on_trial_result(trial, {"acc": v, "training_iteration": t}) is CONTINUE  # < 2 others
        rule.on_trial_complete(trial, None)
    rule.on_trial_add("good")
    assert rule.on_trial_result("good", {"acc": 0.3, "training_iteration": 1}) is CONTINUE  # in its grace period
    assert rule.on_trial_result("good", {"acc": 0.56, "training_iteration": 2}) is CONTINUE  # best 0.56 > 0.55
    rule.on_trial_add("bad")
    assert rule.on_trial_result("bad", {"acc": 0.2, "training_iteration": 1}) is CONTINUE
    # Others that reached t=2: a (mean 0.6), b (0.5), good (0.43): median 0.5 > its best 0.45.
    assert rule.on_trial_result("bad", {"acc": 0.45, "training_iteration": 2}) is STOP

    low = MedianStoppingRule(metric="loss", mode="min", grace_period=1, min_samples_required=1)
    low.on_trial_add("x")
    low.on_trial_result("x", {"loss": 1.0, "training_iteration": 1})
    low.on_trial_add("y")
    assert low.on_trial_result("y", {"loss": 2.0, "training_iteration": 1}) is STOP  # min mode: higher is worse
    assert low.stop_reason == "median stopping rule"
    with pytest.raises(ValueError, match="hard_stop"):
        MedianStoppingRule(hard_stop=False)
    with pytest.raises(ValueError, match="no numeric 'loss'"):
        low.on_trial_result("y", {"training_iteration": 2})


def test_asha_brackets_have_rays_rungs_and_compare_a_trial_only_within_its_bracket() -> None:
    """brackets=3 (Ray's asynchronous HyperBand): bracket s's rungs start at grace * rf**s, Ray's count of them;
    trials are dealt by softmax over the rung counts from NumPy's global state (seeded: the same deal)."""
    s = _asha(max_t=27, reduction_factor=3, brackets=3)
    assert [[m for m, _ in reversed(b)] for b in s._brackets] == [[1, 3, 9, 27], [3, 9, 27], [9, 27]]
    np.random.seed(0)
    for i in range(300):
        s.on_trial_add(f"t{i}")
    dealt = [s.bracket_of(f"t{i}") for i in range(300)]
    counts = [dealt.count(b) for b in range(3)]
    # softmax of (4, 3, 2) rungs: 0.665, 0.245, 0.090 of the trials
    assert counts[0] > counts[1] > counts[2] > 0 and abs(counts[0] / 300 - 0.665) < 0.08
    np.random.seed(0)
    again = _asha(max_t=27, reduction_factor=3, brackets=3)
    for i in range(300):
        again.on_trial_add(f"t{i}")
    assert [again.bracket_of(f"t{i}") for i in range(300)] == dealt
    # A trial of bracket 1 is not stopped at t=1 or judged against bracket 0's values at t=3.
    zero = [t for t, b in enumerate(dealt) if b == 0][:2]
    one = next(t for t, b in enumerate(dealt) if b == 1)
    assert s.on_trial_result(f"t{zero[0]}", {"acc": 0.9, "training_iteration": 3}) == CONTINUE
    assert s.on_trial_result(f"t{zero[1]}", {"acc": 0.1, "training_iteration": 3}) == STOP  # below bracket 0's
    assert s.on_trial_result(f"t{one}", {"acc": 0.1, "training_iteration": 1}) == CONTINUE  # no rung at 1
    assert s.on_trial_result(f"t{one}", {"acc": 0.1, "training_iteration": 3}) == CONTINUE  # first at its rung
    assert "bracket 1: t=3: n=1" in s.debug_string() and "brackets=3" in repr(s)
