"""Routing profiles: a pool's plug-ins, built once from ``pools.<pool>.routing`` when the pool is built, so no
request re-decides its strategy by comparing strings.

- ``prefix``: filters (available now, with room) -> deciders (prefix match, session rendezvous, first-block
  hash; see ``deciders``) -> the least loaded of those with room -> as the request is sent, the index learns
  its blocks (and forgets them when that try fails);
- ``load``: the least loaded of those with room (ties rotate);
- ``round_robin``: in turn, whatever the load (blind, to compare routings against).

A retry before the first byte goes to the least loaded of the others in every profile; a request pinned to one
worker (it continues state held there) goes there or nowhere. Routing runs once per request, and the plug-ins
are built here, so a request allocates only its candidate lists and its route (its cost per request:
docs/decisions/007-prefix-routing.md).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from gateway.fleet.worker import Worker
from gateway.routing import filters
from gateway.routing.affinity import Affinity, of_request
from gateway.routing.candidates import Candidates
from gateway.routing.deciders import Decider, FirstBlockHash, PrefixMatch, Route, SessionRendezvous
from gateway.routing.pickers import in_turn, least_loaded, pick
from gateway.routing.prefixes import PrefixIndex


class AfterDispatch(Protocol):
    """What learns where requests go: told as each try is sent, and when that try fails."""

    def taken(self, affinity: Affinity, worker: Worker) -> None: ...

    def refused(self, affinity: Affinity, worker: Worker) -> None: ...


class Router(abc.ABC):
    """A pool's routing: where a request's first try goes (``first``), a retry (``retry``), and what the
    profile learns as each try is sent (``taken``) or fails (``refused``). ``index``: the pool's prefix index,
    kept by every profile (it outlives a change of profile, and the admin view reads it)."""

    __slots__ = ("after", "index", "workers")

    def __init__(self, workers: list[Worker], index: PrefixIndex) -> None:
        self.workers = workers  # the pool's own list
        self.index = index
        self.after: tuple[AfterDispatch, ...] = ()

    def affinity(self, body: dict[str, Any], session: str | None) -> Affinity | None:
        """What this profile reads of a request's body to route it (None: nothing)."""
        return None

    @abc.abstractmethod
    def first(self, affinity: Affinity | None, room: Collection[Worker]) -> tuple[Worker | None, str | None]:
        """The worker for a request's first try and why (``ctx.route``); ``room``: the scheduler's view."""

    def retry(self, exclude: Collection[Worker]) -> tuple[Worker | None, str | None]:
        """The least loaded worker not tried yet, and why."""
        return pick(self.workers, exclude), "load" if len(self.workers) > 1 else None

    def can_retry(self, exclude: Collection[Worker]) -> bool:
        return pick(self.workers, exclude) is not None

    def pinned(self, url: str) -> Worker | None:
        """The worker at ``url`` when it is available now."""
        return filters.pinned(self.workers, url, time.monotonic())

    def taken(self, affinity: Affinity | None, worker: Worker) -> None:
        """The after-dispatch hooks: ``worker`` is sent the request routed with ``affinity``."""
        if affinity is not None:
            for hook in self.after:
                hook.taken(affinity, worker)

    def refused(self, affinity: Affinity | None, worker: Worker) -> None:
        """The after-dispatch hooks: the try on ``worker`` failed before it took the request."""
        if affinity is not None:
            for hook in self.after:
                hook.refused(affinity, worker)


class LoadRouter(Router):
    """``routing: load``: the least loaded available worker with room (ties rotate, so idle workers share)."""

    __slots__ = ()

    def first(self, affinity: Affinity | None, room: Collection[Worker]) -> tuple[Worker | None, str | None]:
        return pick(filters.with_room(self.workers, room)), "load" if len(self.workers) > 1 else None


class PrefixRouter(LoadRouter):
    """``routing: prefix``: the deciders within the load bound, then the least loaded with room; the index learns
    where a request was taken. A request with nothing to go by, or a pool of one, is routed by load."""

    __slots__ = ("deciders",)

    def __init__(self, workers: list[Worker], index: PrefixIndex) -> None:
        super().__init__(workers, index)
        self.deciders = prefix_deciders(index)
        self.after = (index,)

    def affinity(self, body: dict[str, Any], session: str | None) -> Affinity | None:
        return of_request(body, session) if len(self.workers) > 1 else None

    def first(self, affinity: Affinity | None, room: Collection[Worker]) -> tuple[Worker | None, str | None]:
        if affinity is None or len(self.workers) < 2:
            return super().first(affinity, room)
        available = filters.available(self.workers, time.monotonic())
        if not available:
            return None, None
        route = decide(self.deciders, Candidates(self.workers, available, room), affinity)
        return route.worker, route.describe()


class RoundRobinRouter(Router):
    """``routing: round_robin``: in turn, whatever the load or the room."""

    __slots__ = ()

    def first(self, affinity: Affinity | None, room: Collection[Worker]) -> tuple[Worker | None, str | None]:
        return in_turn(self.workers), "round_robin"


PROFILES: dict[str, type[Router]] = {"prefix": PrefixRouter, "load": LoadRouter, "round_robin": RoundRobinRouter}


def router_for(routing: str, workers: list[Worker], index: PrefixIndex | None = None) -> Router:
    """The router of a pool whose policy says ``routing`` (validated by the schema), over its ``workers``, keeping
    ``index`` when the pool replaces one (a worker kept keeps what it holds)."""
    return PROFILES[routing](workers, PrefixIndex() if index is None else index)


def prefix_deciders(index: PrefixIndex) -> tuple[Decider, ...]:
    return PrefixMatch(index), SessionRendezvous(), FirstBlockHash(index)


def decide(deciders: Sequence[Decider], candidates: Candidates, affinity: Affinity) -> Route:
    """The first decider's route, or the least loaded worker that can start the request now."""
    for decider in deciders:
        route = decider.decide(candidates, affinity)
        if route is not None:
            return route
    return Route(least_loaded(candidates.startable), "load", 0, len(affinity.blocks))

