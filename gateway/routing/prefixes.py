"""The prefix index: which worker of a pool recently took which prompt blocks, routing's one piece of state.

It learns after dispatch (``taken``), once the worker's answer head came back and is not retried: a worker that
refused the connection, or answered a 5xx that went elsewhere, never received the prompt and holds none of it.
Bounded, least recently used first out; a worker whose engine restarted, as its metrics show, is forgotten.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from gateway.fleet.worker import Worker
from gateway.routing.affinity import Affinity

INDEX_BLOCKS = 200_000  # remembered per pool (a few MB)


class PrefixIndex:
    """Which worker recently received which block, for one pool (least recently used first out), and how many
    of the remembered blocks each worker holds (its footprint)."""

    def __init__(self, size: int = INDEX_BLOCKS) -> None:
        self.size = size
        self._where: collections.OrderedDict[int, str] = collections.OrderedDict()
        self.footprint: collections.Counter[str] = collections.Counter()

    def longest(self, blocks: Sequence[int]) -> tuple[str | None, int]:
        """The worker URL holding the longest known prefix of ``blocks``, and how many blocks that is."""
        where, matched = None, 0
        for i, block in enumerate(blocks):
            url = self._where.get(block)
            if url is None:
                break
            where, matched = url, i + 1
        return where, matched

    def holds(self, block: int) -> bool:
        """Is some worker known to hold this block (for a first block: any of the prompt's prefix)?"""
        return block in self._where

    def taken(self, affinity: Affinity, worker: Worker) -> None:
        """The after-dispatch hook: ``worker`` took the request and now caches its blocks."""
        if affinity.blocks:
            self.remember(affinity.blocks, worker.url)

    def remember(self, blocks: Sequence[int], url: str) -> None:
        where, footprint = self._where, self.footprint
        for block in blocks:
            held = where.get(block)
            if held != url:
                if held is not None:
                    footprint[held] -= 1
                footprint[url] += 1
                where[block] = url
            where.move_to_end(block)
        while len(where) > self.size:
            footprint[where.popitem(last=False)[1]] -= 1

    def forget(self, url: str) -> None:
        """A worker that left (or restarted) holds nothing any more."""
        for block in [b for b, u in self._where.items() if u == url]:
            del self._where[block]
        self.footprint.pop(url, None)

    def __len__(self) -> int:
        return len(self._where)
