"""The workers one request may go to, as the filters left them, and the load bound the deciders hold to."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from gateway.fleet.worker import Worker
from gateway.routing import filters

LOAD_BOUND = 1.25
LOAD_NOISE_Z = 2.5  # standard deviations of a worker's in-flight count above the mean (load_bound)


class Candidates:
    """``workers``: the pool, in order; ``available``: those routing may use now (a subset, in order);
    ``startable``: those of them with room, or all of them; ``bound``: the most load a decider's worker may carry."""

    __slots__ = ("available", "bound", "startable", "workers")

    def __init__(self, workers: Sequence[Worker], available: Collection[Worker], room: Collection[Worker]) -> None:
        self.workers = workers
        self.available = available
        self.startable = filters.startable(workers, available, room)
        self.bound = load_bound(sum(w.load for w in available) / len(available))

    def fits(self, worker: Worker) -> bool:
        """May a decider send the request to ``worker``: available, and loaded within the bound."""
        return worker in self.available and worker.load <= self.bound


def load_bound(mean: float) -> float:
    """The most load a worker may carry and still take a request for the prefix it holds: LOAD_BOUND times the
    pool's mean, or the mean plus LOAD_NOISE_Z of its Poisson swing when that is more, plus one.

    Why the swing: a worker's in-flight count varies by about its square root, so at a few in flight 1.25x the
    mean is one request, and a burst of one would move a prefix's requests off the worker caching it; at large
    in-flight counts (the mean above 100) 1.25x rules again. The bounds tried, with their hit rates:
    docs/decisions/007-prefix-routing.md."""
    return mean + max((LOAD_BOUND - 1.0) * mean, LOAD_NOISE_Z * math.sqrt(mean)) + 1.0
