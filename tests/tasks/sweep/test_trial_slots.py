"""TrialSlots: how many trials train at once, and the hand-over from a finishing trial to the queued one."""

from __future__ import annotations

import threading
import time

from sweepflow.tasks.sweep.slots import TrialSlots


def test_slots_limit_concurrency_and_hand_over_to_a_waiting_trial():
    freed = []
    slots = TrialSlots(2)
    slots.on_release = lambda: freed.append(time.monotonic())
    first, second = slots.acquire(0), slots.acquire(1)
    assert slots.acquire(2, timeout=0) is None  # both held: a third trial waits
    got = {}

    def queued_trial():
        got["slot"] = slots.acquire(2)

    waiter = threading.Thread(target=queued_trial)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and slots.acquired == 2
    first.release()  # e.g. the first trial's final report was answered
    first.release()  # idempotent: the task's own finally releases again
    assert len(freed) == 1  # the sweep is woken once per slot given back
    waiter.join(5)
    assert not waiter.is_alive() and slots.acquired == 3
    assert slots.acquire(3, timeout=0) is None  # one release let exactly one trial in
    second.release()
    assert slots.acquire(3, timeout=0) is not None


def test_trials_start_in_their_order_and_a_forfeited_turn_does_not_block_the_rest():
    slots = TrialSlots(1)
    order = []

    def trial(turn):
        slot = slots.acquire(turn)
        order.append(turn)
        slot.release()

    threads = [threading.Thread(target=trial, args=(turn,)) for turn in (3, 2, 0)]  # arrive out of order
    for t in threads:
        t.start()
        time.sleep(0.05)
    slots.forfeit(1)  # trial 1 failed before it got a slot
    for t in threads:
        t.join(5)
    assert order == [0, 2, 3]


def test_the_progress_line_counts_as_running_only_the_trials_holding_a_slot():
    """One trial at a time: the first gives its slot back at its final report and the second starts while the
    first's group tears down; the line says 1 running (and 1 idle), never 2. A paused trial (HyperBand) is idle
    until it gets a slot again."""
    from sweepflow.tasks.sweep.progress import SweepProgress
    from sweepflow.tasks.sweep.results import TrialStatus

    lines: list[str] = []
    progress = SweepProgress("loss", "min", 2, log=lines.append)
    slots = TrialSlots(1)
    first = slots.acquire(0)
    progress.holds_slot("t0", first)
    progress.update("t0")
    assert "1 running, 0 stopped" in lines[-1] and "1 pending" in lines[-1]
    first.release()  # its final report was answered
    second = slots.acquire(1, timeout=0)
    progress.holds_slot("t1", second)
    progress.update("t1")
    assert "trials: 1 running, 1 idle, 0 stopped early" in lines[-1] and "0 pending" in lines[-1], lines[-1]
    progress.update("t0", metrics={"loss": 0.5}, status=TrialStatus.COMPLETED)
    assert "trials: 1 running, 0 stopped early, 1 completed" in lines[-1], lines[-1]

    second.release()  # t1 pauses at a milestone
    again = slots.reacquire()
    progress.holds_slot("t1", again)  # ... and goes on: running again
    assert "trials: 1 running, 0 stopped early, 1 completed" in lines[-1], lines[-1]
    again.release()
    progress.update("t1", status=TrialStatus.STOPPED)
    assert "trials: 0 running, 1 stopped early, 1 completed, 0 failed, 0 pending" in lines[-1], lines[-1]


def test_the_progress_line_is_logged_at_most_once_an_interval_and_its_last_counts_are_never_lost():
    """Sub-second trials change the counts several times a second: one line per interval, a change inside it
    logged when it ends (the line then shows the counts as they are), the last trial's end at once."""
    from sweepflow.tasks.sweep.progress import SweepProgress
    from sweepflow.tasks.sweep.results import TrialStatus

    lines: list[str] = []
    progress = SweepProgress("loss", "min", 3, log=lines.append, min_interval_s=0.3)
    progress.update("a")
    progress.update("b")
    progress.update("a", metrics={"loss": 1.0}, status=TrialStatus.COMPLETED)
    assert len(lines) == 1 and "1 running" in lines[0], lines
    deadline = time.monotonic() + 5
    while len(lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines) == 2 and "trials: 1 running, 0 stopped early, 1 completed" in lines[1], lines
    progress.update("c")
    progress.update("b", status=TrialStatus.COMPLETED)
    progress.update("c", status=TrialStatus.COMPLETED)  # the last one: logged now, the held-back line dropped
    assert "trials: 0 running, 0 stopped early, 3 completed, 0 failed, 0 pending" in lines[-1], lines
    logged = len(lines)
    time.sleep(0.5)
    progress.close()
    assert len(lines) == logged, lines
