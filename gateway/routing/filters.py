"""Filters: the workers of a pool a request may go to (available now, with room now, the one it is pinned to)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gateway.fleet.worker import Worker


def available(workers: Sequence[Worker], now: float) -> list[Worker]:
    """Healthy by the scraper and not cooling down, in pool order."""
    return [w for w in workers if w.available(now)]


def with_room(workers: Sequence[Worker], room: Collection[Worker]) -> Sequence[Worker]:
    """Those of ``workers`` in ``room`` (the scheduler's view: they can start one more request now), or all of them
    when the view is empty (none can, or the pool has one worker): a stale load figure must not send a request to
    an engine at its limit while another has a slot free."""
    return [w for w in workers if w in room] if room else workers


def startable(workers: Sequence[Worker], available: Collection[Worker], room: Collection[Worker]) -> list[Worker]:
    """The ``available`` ones with room, in pool order, or every available one when none has room."""
    return [w for w in workers if w in available and w in room] or [w for w in workers if w in available]


def pinned(workers: Sequence[Worker], url: str, now: float) -> Worker | None:
    """The worker at ``url`` when it is available (it holds the state the request continues), else None."""
    return next((w for w in workers if w.url == url and w.available(now)), None)
