"""Which workers were there, and when: the hours a GPU is paid for, busy or not.

The ledger sees a worker only while it answers; a GPU bills by the hour, idle and down included. So every gateway
process keeps spans of what it sees of each worker of its pools (up: admitted for routing; down: configured but
failing) and writes them to the ledger's store every ``BEAT_S`` from a task of its own, never from a request:
one upsert per worker per beat. Each process writes its own spans (ids carry the process), so replicas never
contend, and the GPU report takes the union of every process's spans: the same hours whichever replicas ran. A
process that dies loses at most its last beat of presence. A report read from a live process adds that
process's own open spans as they stand (``live``), so a report of the last minutes is not a beat behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gateway.ledger.stores import LedgerStore
from gateway.ledger.times import at

log = logging.getLogger("tollgate.ledger")
BEAT_S = 5.0


@dataclass(frozen=True, slots=True)
class Seen:
    """One worker as a beat sees it."""

    worker: str
    pool: str
    up: bool


class Presence:
    def __init__(self, store: LedgerStore, beat_s: float = BEAT_S) -> None:
        self.store = store
        self.beat_s = beat_s
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._open: dict[str, dict[str, Any]] = {}  # worker -> its open span
        self._closed: list[dict[str, Any]] = []  # ended spans not yet written (the store was down)
        self._count = 0

    def observe(self, now: float, seen: Iterable[Seen]) -> list[dict[str, Any]]:
        """The spans to write after a beat at ``now``: every open one, moved to now, and those that ended (a
        worker that changed state, or left the policy, ends its span here and starts another)."""
        stamp = at(now)
        current = set()
        for w in seen:
            current.add(w.worker)
            span = self._open.get(w.worker)
            if span is not None and (span["up"] != w.up or span["pool"] != w.pool):
                self._closed.append(self._open.pop(w.worker) | {"until": stamp})
                span = None
            if span is None:
                self._count += 1
                span = {"id": f"{self.replica}:{self._count}", "replica": self.replica, "worker": w.worker,
                        "pool": w.pool, "up": w.up, "since": stamp}
                self._open[w.worker] = span
            span["until"] = stamp
        for worker in [w for w in self._open if w not in current]:
            self._closed.append(self._open.pop(worker))
        return [*self._closed, *(dict(s) for s in self._open.values())]

    def live(self, now: float) -> list[dict[str, Any]]:
        """This process's open spans, ended at ``now`` (read by a report; nothing is written)."""
        return [s | {"until": at(now)} for s in self._open.values()]

    async def beat(self, seen: Iterable[Seen]) -> None:
        spans = self.observe(time.time(), seen)
        if not spans:
            return
        try:
            await asyncio.to_thread(self.store.extend_presence, spans)
        except Exception as exc:  # kept: the next beat writes them again, with their ends moved on
            log.warning("worker presence not written (%s); retrying at the next beat", exc)
            return
        self._closed.clear()

    async def run(self, fleet: Callable[[], Iterable[Seen]]) -> None:
        """Beat until cancelled; the lifespan beats once more at stop, so a stopped gateway's last span ends
        when it stopped."""
        while True:
            await self.beat(fleet())
            await asyncio.sleep(self.beat_s)
