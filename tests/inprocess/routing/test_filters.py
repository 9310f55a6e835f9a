"""The filters: available now, with room (or all when the scheduler's view is empty), pinned to one URL."""

from __future__ import annotations

import time

from gateway.routing import filters
from tests.fakes import live_worker


def test_available_room_and_pinned() -> None:
    now = time.monotonic()
    workers = [live_worker(f"http://w{i}") for i in range(4)]
    workers[1].observed.healthy = False
    workers[2].observed.cooldown_until = now + 60
    up = filters.available(workers, now)
    assert up == [workers[0], workers[3]]
    assert filters.with_room(workers, {workers[3], workers[1]}) == [workers[1], workers[3]], "in pool order"
    assert filters.with_room(workers, set()) is workers, "no view: all of them"
    assert filters.startable(workers, up, {workers[3]}) == [workers[3]]
    assert filters.startable(workers, up, {workers[1]}) == up, "room only where it is not available: any available"
    assert filters.pinned(workers, "http://w3", now) is workers[3]
    assert filters.pinned(workers, "http://w2", now) is None, "cooling down"
