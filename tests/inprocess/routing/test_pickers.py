"""pickers.pick: the least-loaded available worker, ties shared."""

from __future__ import annotations

import time
from collections import Counter

from gateway.fleet.worker import Worker
from gateway.routing.pickers import pick
from tests.fakes import live_worker


def workers(n: int) -> list[Worker]:
    return [live_worker(f"http://w{i}") for i in range(n)]


def test_least_loaded_wins() -> None:
    ws = workers(3)
    ws[0].inflight, ws[1].inflight, ws[2].inflight = 3, 1, 2
    assert pick(ws) is ws[1]
    ws[1].observed.waiting = 5  # vLLM's own queue counts too
    assert pick(ws) is ws[2]


def test_unavailable_and_excluded_workers_are_skipped() -> None:
    ws = workers(3)
    ws[0].observed.healthy = False
    ws[1].observed.cooldown_until = time.monotonic() + 60
    assert pick(ws) is ws[2]
    assert pick(ws, exclude={ws[2]}) is None
    assert pick([]) is None


def test_ties_rotate_so_idle_workers_share_the_traffic() -> None:
    ws = workers(4)
    counts = Counter(pick(ws).url for _ in range(400))  # type: ignore[union-attr]
    assert set(counts) == {w.url for w in ws}
    assert min(counts.values()) >= 80
