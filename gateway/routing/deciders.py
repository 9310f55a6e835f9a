"""Deciders: each names the worker a request would run best on, or nothing, and only a worker within the load
bound (``candidates.Candidates.fits``: bounded-load affinity, so a hot prefix cannot pile every request onto one
engine). The prefix profile asks them in order; the first that names a worker wins.

- ``PrefixMatch``: the worker holding the request's longest known prefix (by the index), even one at its limit:
  the prefill it saves is worth a short wait there;
- ``SessionRendezvous``: the worker a named conversation hashes to (rendezvous over the whole pool, the same in
  every process and replica);
- ``FirstBlockHash``: for a prefix no worker is known to hold, a worker whose cache footprint (the blocks the
  index places on it) is near the least, among those with room, and among those where its first block hashes
  to (rendezvous, so replicas agree where a new system prompt lives without talking while the pool is
  balanced), since hashing alone often puts several tenants' system prompts on one engine, where they evict
  each other.

Why each, measured with ``bench_prefix``: docs/decisions/007-prefix-routing.md.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.fleet.worker import Worker
from gateway.routing.affinity import Affinity
from gateway.routing.candidates import Candidates
from gateway.routing.prefixes import PrefixIndex

# A new prefix may go to any worker whose footprint is within this share of the mean (or within the new
# prompt's own size) of the least: the hash picks among them, so replicas mostly agree.
FOOTPRINT_SLACK = 0.05


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request went and why: ``how`` is prefix | session | hash | load; ``matched`` blocks of
    ``blocks`` were known to be on the worker."""

    worker: Worker
    how: str
    matched: int = 0
    blocks: int = 0

    def describe(self) -> str:
        return f"{self.how} {self.matched}/{self.blocks}" if self.how == "prefix" else self.how


class Decider(Protocol):
    def decide(self, candidates: Candidates, affinity: Affinity) -> Route | None: ...


class PrefixMatch:
    """To the worker holding the longest known prefix of the prompt."""

    __slots__ = ("index",)

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    def decide(self, candidates: Candidates, affinity: Affinity) -> Route | None:
        url, matched = self.index.longest(affinity.blocks)
        if not matched:
            return None
        held = next((w for w in candidates.available if w.url == url), None)
        return Route(held, "prefix", matched, len(affinity.blocks)) \
            if held is not None and candidates.fits(held) else None


class SessionRendezvous:
    """To the worker a named conversation hashes to."""

    __slots__ = ()

    def decide(self, candidates: Candidates, affinity: Affinity) -> Route | None:
        if affinity.session is None:
            return None
        home = rendezvous(affinity.session.encode(), candidates.workers)
        return Route(home, "session", 0, len(affinity.blocks)) \
            if home is not None and candidates.fits(home) else None


class FirstBlockHash:
    """A new prefix to where its first block hashes, among the roomiest workers that can start it."""

    __slots__ = ("index",)

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    def decide(self, candidates: Candidates, affinity: Affinity) -> Route | None:
        blocks = affinity.blocks
        if not blocks or self.index.holds(blocks[0]):  # some prefix of it is known: not a new prompt
            return None
        home = rendezvous(blocks[0].to_bytes(4, "little"), roomiest(candidates.startable, self.index, len(blocks)))
        return Route(home, "hash", 0, len(blocks)) if home is not None and candidates.fits(home) else None


def roomiest(workers: Sequence[Worker], index: PrefixIndex, blocks: int) -> list[Worker]:
    """The workers whose footprint is within ``blocks`` (the new prompt's size) or FOOTPRINT_SLACK of the mean
    of the least: where a new prefix is least likely to evict another."""
    footprint = index.footprint
    sizes = [footprint.get(w.url, 0) for w in workers]
    if not sizes:
        return []
    least = min(sizes)
    within = least + max(blocks, FOOTPRINT_SLACK * sum(sizes) / len(sizes))
    return [w for w, size in zip(workers, sizes, strict=True) if size < within]


def rendezvous(key: bytes, workers: Sequence[Worker]) -> Worker | None:
    """The worker this key belongs to, the same in every process: the highest CRC of key and worker URL."""
    return max(workers, key=lambda w: zlib.crc32(w.url.encode(), zlib.crc32(key)), default=None)
