"""Pickers: the worker a request goes to when no decider named one, from live load or in turn."""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Collection, Sequence

from gateway.fleet.worker import Worker

_rotation = itertools.count()
_load = operator.attrgetter("load")


def least_loaded(workers: Sequence[Worker]) -> Worker:
    """The first of ``workers`` (not empty, all available) with the lowest load."""
    return min(workers, key=_load)


def pick(workers: Sequence[Worker], exclude: Collection[Worker] = ()) -> Worker | None:
    """The available worker with the lowest load; ties rotate, so idle workers share the traffic."""
    now = time.monotonic()
    n = len(workers)
    start = next(_rotation) % n if n else 0
    best: Worker | None = None
    for i in range(n):
        worker = workers[(start + i) % n]
        if worker in exclude or not worker.available(now):
            continue
        if best is None or worker.load < best.load:
            best = worker
    return best


def in_turn(workers: Sequence[Worker]) -> Worker | None:
    """The next available worker in turn, whatever its load (round robin, to compare routings against)."""
    now = time.monotonic()
    n = len(workers)
    start = next(_rotation)
    for i in range(n):
        worker = workers[(start + i) % n]
        if worker.available(now):
            return worker
    return None
