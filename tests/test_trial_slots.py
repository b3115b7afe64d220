"""TrialSlots: how many trials train at once, and the hand-over from a finishing trial to the queued one."""

from __future__ import annotations

import threading
import time

from tasks.trial import TrialSlots


def test_slots_limit_concurrency_and_hand_over_to_a_waiting_trial():
    taken = []
    slots = TrialSlots(2)
    slots.on_acquire = lambda: taken.append(time.monotonic())
    first, second = slots.acquire(), slots.acquire()
    assert slots.acquire(block=False) is None  # both held: a third trial waits
    got = {}

    def queued_trial():
        got["slot"] = slots.acquire()

    waiter = threading.Thread(target=queued_trial)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and slots.acquired == 2
    first.release()  # e.g. the first trial's final report was answered
    first.release()  # idempotent: the task's own finally releases again
    waiter.join(5)
    assert not waiter.is_alive() and slots.acquired == 3 and len(taken) == 3
    assert slots.acquire(block=False) is None  # one release let exactly one trial in
    second.release()
    assert slots.acquire(block=False) is not None
