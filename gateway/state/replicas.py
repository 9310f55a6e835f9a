"""The live gateway processes sharing one Redis, and this one's place among them (its ``Share``).

Why split: a worker's limit is split between the processes rather than counted in Redis per request.
Counting would add a Redis round trip to every admission and every release (and a leaked count for each
request a killed process held); the split costs nothing per request and never lets the processes together
hand a worker more than its limit, or than one request each when there are more processes than its limit
(``Share.of_limit``). What it costs: a process's unused part is not lent to another, so with
uneven load across replicas a worker may idle below its limit (the load balancer evens the load out; the
two-replica overload run in loadtest/RESULTS.md measures it).

Each process writes a heartbeat (a sorted set: member = process id, score = time) every ``beat_s`` and reads
the live list back; a process silent for ``3 * beat_s`` has left, and the others take its part. The heartbeat
carries, per worker, the limit this process learned and how many requests it holds there:

- every process splits the lowest learned limit (``agreed``), so a replica that saw the engine queue and
  lowered its limit lowers everyone's within a heartbeat, and replicas probing upwards at different moments
  do not add their probes together (measured: without it, the two-replica overload run put one request over
  the engine's limit in 5% of samples);
- a process holding more than its part (its part shrank when another joined, its long streams have not
  ended yet) is ``excess`` the others leave unused, so a join during a rolling update does not over-fill a
  worker while the old parts drain (a held count a heartbeat old is an overestimate: a process over its part
  sends nothing new).

Beside it, each process reports the tenants it saw in the last minute, per pool and class, with what each
holds there (a second hash, written by the same script call: no Redis call per request). The others' sum is
``elsewhere``: a tenant flooding one replica holds its part of every worker there, and what it may take beyond
that part (a premium request's spill) is judged against its share of the fleet, with the tenants only the
other replicas see counted in (gateway.scheduling.flows.ClassQueue.over_share, given PoolState.elsewhere).

A newcomer takes its part only after ``2 * beat_s``, when every other process has seen it and shrunk its own
part; until then it sends nothing new upstream (it queues). While Redis is down each process keeps its last
known place (the parts still add up to the limit unless a process joined meanwhile); never known: the host's
static split.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from gateway.fleet.worker import Worker

if TYPE_CHECKING:
    from gateway.state import SharedState

log = logging.getLogger("tollgate.state")


@dataclass(frozen=True, slots=True)
class Share:
    """This process's part of every worker's limit: the ``index``-th of ``of`` gateway processes (on this host
    under ``--workers N``, or every live process of every replica when they share Redis). ``ready`` is False
    while a newcomer waits for the others to see it and shrink their parts first."""

    index: int = 0
    of: int = 1
    ready: bool = True

    def of_limit(self, limit: int) -> int:
        """limit // of, the remainder to the lowest indexes, and at least one of a worker that runs anything:
        the parts add up to ``max(limit, of)`` when ``limit`` > 0, so they exceed the limit only when it is
        below the number of processes, by at most ``of - limit``. A process with no part of a worker would queue
        its requests there until their deadline while the worker idled (a replica of three in front of an
        engine that runs two); one request too many waits in the engine's own queue instead."""
        if not self.ready:
            return 0
        if self.of == 1 or limit <= 0:
            return max(limit, 0)
        return max(1, limit // self.of + (1 if self.index < limit % self.of else 0))


ALONE = Share()

# Announce with this process's learned limits, drop the silent, return the live and their limits: one step,
# timed by Redis's clock (hosts' clocks may disagree), or by the caller's when it brings one (ARGV[5]: tests).
_BEAT = """
local now = tonumber(ARGV[5])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
local silent = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
for _, id in ipairs(silent) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[6])
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
return {redis.call('ZRANGE', KEYS[1], 0, -1), redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3])}
"""
# What one process reports of its tenants: at most this many per pool and class (the largest holders first), and
# names no longer than a tenant's may be; a report past either is read as far as it goes.
TENANTS_KEPT = 256
NAME_MAX = 128

# {pool: {class: {tenant: requests it holds}}}
Tenants = dict[str, dict[str, dict[str, int]]]


def _read_view(raw: bytes) -> dict[str, tuple[int, int]] | None:
    """One process's heartbeat entry, {worker URL: (learned limit, held)}; None when it is not that shape (an
    entry from another version, or a corrupted one: that process still counts, it just reports nothing)."""
    try:
        view = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(view, dict):
        return None
    out = {}
    for url, pair in view.items():
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int and v >= 0 for v in pair)):
            return None
        out[url] = (pair[0], pair[1])
    return out


def _read_tenants(raw: bytes) -> Tenants:
    """One process's tenant report, as far as it is that shape (anything else in it is left out): a report is
    another process's word, bounded here whatever it says."""
    try:
        report = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    out: Tenants = {}
    if not isinstance(report, dict):
        return out
    for pool, classes in report.items():
        if not isinstance(classes, dict):
            continue
        for klass, tenants in classes.items():
            if not isinstance(tenants, dict):
                continue
            kept = {name: held for name, held in list(tenants.items())[:TENANTS_KEPT]
                    if len(name) <= NAME_MAX and type(held) is int and 0 <= held <= 1_000_000}
            if kept:
                out.setdefault(pool, {})[klass] = kept
    return out


def report_of(tenants: Tenants) -> Tenants:
    """This process's report, bounded as the others read it: the largest holders first."""
    return {pool: {klass: dict(sorted(held.items(), key=lambda kv: -kv[1])[:TENANTS_KEPT])
                   for klass, held in classes.items()} for pool, classes in tenants.items()}


class Replicas:
    def __init__(self, state: SharedState, fallback: Share, beat_s: float = 1.0,
                 clock: Callable[[], float] | None = None) -> None:
        """``clock``: one clock for every process's heartbeat (a test's); by default Redis's own, which every
        host reads alike, and this host's monotonic clock for its own joining."""
        assert state.redis is not None
        self.redis = state.redis
        self.key = state.prefix + "replicas"
        self.limits_key = state.prefix + "replica-limits"
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.beat_s = beat_s
        self.share = fallback
        self.live: list[str] = []
        self.agreed: dict[str, int] = {}  # worker URL -> the lowest limit a live process learned for it
        self.excess: dict[str, int] = {}  # worker URL -> what the other processes hold beyond their parts
        self.tenants_key = state.prefix + "replica-tenants"
        self.elsewhere: Tenants = {}  # what the other live processes' tenants hold, summed
        self._script = self.redis.register_script(_BEAT)
        self._clock = clock
        self._joined: float | None = None  # the time of this process's first heartbeat that Redis took
        self._warned = False

    async def beat(self, workers: dict[str, tuple[int, int]] | None = None, tenants: Tenants | None = None) -> Share:
        """Announce this process with, per worker URL, (the limit it learned, the requests it holds there), and
        its tenants (per pool and class, what each holds); drop the silent ones; return this process's share
        (the last one known when Redis does not answer, when ``elsewhere`` also stays as it was)."""
        now = self._clock() if self._clock is not None else time.monotonic()
        try:
            members, reported, tenant_reports = await self._script(
                keys=[self.key, self.limits_key, self.tenants_key],
                args=[self.id, 3 * self.beat_s, max(10, int(30 * self.beat_s)), orjson.dumps(workers or {}),
                      "" if self._clock is None else repr(now), orjson.dumps(report_of(tenants or {}))])
        except Exception as exc:
            if not self._warned:
                log.error("Redis unreachable (%s): keeping this process's part of each worker's limit at %s",
                          exc, self.share)
                self._warned = True
            return self.share
        self._warned = False
        if self._joined is None:
            self._joined = now
        self.live = sorted(m.decode() for m in members)
        views = {}
        for member, raw in zip(reported[::2], reported[1::2], strict=True):
            view = _read_view(raw)
            if member.decode() in self.live and view is not None:
                views[member.decode()] = view
        agreed: dict[str, int] = {}
        for view in views.values():
            for url, (limit, _) in view.items():
                if limit > 0:
                    agreed[url] = min(agreed.get(url, limit), limit)
        excess: dict[str, int] = {}
        for member, view in views.items():
            if member == self.id:
                continue
            part = Share(self.live.index(member), len(self.live))
            for url, (_, held) in view.items():
                if url in agreed and held > part.of_limit(agreed[url]):
                    excess[url] = excess.get(url, 0) + held - part.of_limit(agreed[url])
        self.agreed, self.excess = agreed, excess
        elsewhere: Tenants = {}
        for member, raw in zip(tenant_reports[::2], tenant_reports[1::2], strict=True):
            if member.decode() == self.id or member.decode() not in self.live:
                continue
            for pool, classes in _read_tenants(raw).items():
                for klass, by_tenant in classes.items():
                    into = elsewhere.setdefault(pool, {}).setdefault(klass, {})
                    for tenant, n in by_tenant.items():
                        into[tenant] = into.get(tenant, 0) + n
        self.elsewhere = elsewhere
        young = now - self._joined < 2 * self.beat_s and len(self.live) > 1
        self.share = Share(self.live.index(self.id), len(self.live), ready=not young)
        return self.share

    def agree(self, workers: Iterable[Worker]) -> None:
        """Write what the live processes agreed into each worker's ``agreed`` part (its one writer)."""
        for worker in workers:
            worker.agreed.limit = self.agreed.get(worker.url, 0)
            worker.agreed.excess = self.excess.get(worker.url, 0)

    async def leave(self) -> None:
        """On a clean stop: the others take this part at their next heartbeat instead of after 3 silent ones."""
        try:
            await self.redis.zrem(self.key, self.id)
            await self.redis.hdel(self.limits_key, self.id)
            await self.redis.hdel(self.tenants_key, self.id)
        except Exception:  # leaving is best effort: silence does the same a moment later
            pass
