"""One pool's waiting and admitted requests: a ClassQueue (gateway.scheduling.flows) per class, the slots granted,
and the read-only view the rest of the gateway reads."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from gateway.fleet.worker import Worker
from gateway.policy.schema import TIERS, Pool
from gateway.scheduling.flows import ClassQueue, Flow


@dataclass(eq=False, slots=True)
class Grant:
    """An admitted request's place in its pool: its flow, and what its grant charged the flow's counter (tokens
    over the flow's weight; corrected at release)."""

    flow: Flow
    charged: float
    at: float  # when it was granted


@dataclass
class PoolState:
    """One pool's queues and counts: created and kept by the controller under the pool's name, and re-pointed
    to a replacing pool's workers on a policy reload, so queued and admitted requests stay counted; only the
    controller changes it (others read a QueueView)."""

    name: str
    workers: list[Worker]
    spec: Pool
    granted: int = 0  # admitted and not yet released
    held_in: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))  # of those, by class
    queues: dict[str, ClassQueue] = field(default_factory=lambda: {t: ClassQueue() for t in TIERS})
    grants: dict[int, Grant] = field(default_factory=dict)  # by id() of the request's context (a client chooses its
    # X-Request-Id, and may repeat one)
    starting: dict[int, float] = field(default_factory=dict)  # granted streams before their first token: when
    queued_bytes: int = 0
    completions: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=256))
    turns: int = 0  # grants made in this pool so far (a flow's turn is the count at its last grant)
    elsewhere: dict[str, dict[str, int]] = field(default_factory=dict)  # class -> tenant -> what the other gateway
    # processes report it holds in this pool (their heartbeats: Controller.fleet_changed)

    def first_waiting(self, among: tuple[str, ...]) -> str | None:
        """The first class of ``among`` (in the controller's order of priority) with a request queued; None when
        none has one. A loop, not a generator: it runs at every admission and release."""
        for klass in among:
            if self.queues[klass].count:
                return klass
        return None

    def take(self, flow: Flow, key: int, cost: float, *, now: float, stream: bool = False) -> None:
        """A slot granted to the request ``key`` of ``flow``, charged ``cost`` tokens until its release; ``stream``:
        it is starting (before its first token) from ``now``."""
        self.granted += 1
        self.turns += 1
        self.held_in[flow.klass] += 1
        flow.turn = self.turns
        charged = cost / flow.weight
        flow.account(now, 1, charged, now)
        flow.pending += charged
        self.grants[key] = Grant(flow, charged, now)
        if stream:
            self.starting[key] = now

    def give(self, key: int, served: float | None = None, *, now: float) -> Flow | None:
        """The request ``key`` gave its slot back at ``now``; ``served``: the tokens the engine worked for it (None:
        its grant's estimate stands)."""
        self.starting.pop(key, None)
        grant = self.grants.pop(key, None)
        if grant is None:
            return None
        self.granted -= 1
        self.held_in[grant.flow.klass] -= 1
        grant.flow.pending -= grant.charged
        grant.flow.account(now, -1, 0.0 if served is None else served / grant.flow.weight - grant.charged, grant.at)
        return grant.flow

    @property
    def premium(self) -> int:
        """Premium requests admitted and not yet released."""
        return self.held_in["premium"]

    def collect(self, now: float) -> None:
        for queue in self.queues.values():
            queue.collect(now)

    def active(self, now: float) -> dict[str, dict[str, int]]:
        """The active flows by class, with what each holds here: what this process tells the others (its
        heartbeat)."""
        return {klass: {f.tenant: f.held for f in flows} for klass, queue in self.queues.items()
                if (flows := queue.active(now))}

    def held(self) -> dict[str, int]:
        """Slots held, by tenant (all classes)."""
        out: dict[str, int] = {}
        for queue in self.queues.values():
            for flow in queue.flows.values():
                if flow.held:
                    out[flow.tenant] = out.get(flow.tenant, 0) + flow.held
        return out

    def prefilling(self, now: float, stuck_s: float) -> int:
        """Granted streams before their first token, not counting those waiting longer than ``stuck_s`` (a worker
        that hangs is not prefilling)."""
        return sum(now - at < stuck_s for at in self.starting.values())

    def drain_rate(self, now: float, window: float = 10.0) -> float:
        """Requests finished per second over the recent window (0 when unknown)."""
        recent = [t for t in self.completions if now - t <= window]
        if len(recent) < 2:
            return 0.0
        return len(recent) / max(now - recent[0], 1e-3)


class QueueView:
    """A pool's queues as the rest of the gateway reads them (the pools' gauges, the scaling signal): read-only,
    so only the controller changes a pool's state."""

    __slots__ = ("_state",)

    def __init__(self, state: PoolState) -> None:
        self._state = state

    def depths(self) -> dict[str, int]:
        """Requests queued, by class."""
        return {klass: queue.count for klass, queue in self._state.queues.items()}

    @property
    def queued(self) -> int:
        """Requests queued, all classes."""
        return sum(queue.count for queue in self._state.queues.values())


def kept_free(total: int, fraction: float) -> int:
    """Slots kept free of ``total`` (for a higher class, or for the other tenants): ``fraction`` of them rounded
    up, never all of them."""
    return min(math.ceil(total * fraction), max(0, total - 1))
