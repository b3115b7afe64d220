"""A group's rendezvous: rank 0 publishes its store's address, the other ranks read it, whichever reaches the
scheduler first (``ddp_runtime._worker``).

Ranks start together, so rank 0's publish and a peer's read often reach the scheduler in the same loop turn:
on Python 3.10, Dask's ``Variable.get`` lost its wake-up then and the group failed after the rendezvous timeout
(the 3.10 CI lane, 2026-12-02). Each pair here is sent in the same instant, from two threads, many times.

Not marked ``dask``: an in-process scheduler with no workers starts in a fraction of a second, and the fast lane
must run this on every Python of the matrix (the race was 3.10's)."""

from __future__ import annotations

import threading

import pytest
from distributed import Client, LocalCluster

from ddp_runtime._worker import _publish_rendezvous, _read_rendezvous


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster, set_as_default=True) as client,
    ):
        yield client


def _race(channel: str, timeout_s: float) -> str | Exception:
    """Rank 0 publishes and a peer reads in the same instant; the peer's answer, or what it raised."""
    start = threading.Barrier(2)
    got: list[str | Exception] = []

    def peer() -> None:
        start.wait()
        try:
            got.append(_read_rendezvous(channel, timeout_s))
        except (TimeoutError, OSError, RuntimeError) as error:  # reported by the test
            got.append(error)

    reader = threading.Thread(target=peer)
    reader.start()
    start.wait()
    _publish_rendezvous(channel, f"127.0.0.1:{len(channel)}")
    reader.join()
    return got[0]


def test_a_peer_reads_rank_0s_address_when_both_reach_the_scheduler_together(client):
    answers = [_race(f"race-{i}", timeout_s=2.0) for i in range(60)]
    failed = [a for a in answers if not isinstance(a, str)]
    assert not failed, f"{len(failed)} of {len(answers)} reads failed: {failed[0]!r}"
    assert answers == [f"127.0.0.1:{len(f'race-{i}')}" for i in range(60)]


def test_a_peer_waits_for_a_late_rank_0(client):
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(_read_rendezvous("late", 10.0)))
    reader.start()
    threading.Event().wait(0.3)  # the peer is waiting on the scheduler by now
    _publish_rendezvous("late", "127.0.0.1:1")
    reader.join()
    assert got == ["127.0.0.1:1"]


def test_a_peer_that_rank_0_never_reaches_says_which_setting_bounds_the_wait(client):
    with pytest.raises(TimeoutError, match=r"rank 0 published no rendezvous address in 0.2 s \(TorchConfig"):
        _read_rendezvous("never", 0.2)
