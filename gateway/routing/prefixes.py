"""The prefix index: which worker of a pool recently took which prompt blocks, routing's one piece of state.

It learns when a worker is sent a request (``taken``), not when its answer comes back: a non-streamed answer's head
comes only when the whole answer is done, and the next requests with the same system prompt, sent meanwhile, must
find it there (or each goes by hash to whichever engine has room, and prefills it again). A try that fails (the
worker refused the connection, or answered a 5xx that is retried elsewhere) withdraws what it taught
(``refused``): that worker never prefilled the prompt, and the worker the retry reaches is the one that holds it.
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
        """``worker`` is sent the request: it prefills, and then caches, the prompt's blocks."""
        if affinity.blocks:
            self.remember(affinity.blocks, worker.url)

    def refused(self, affinity: Affinity, worker: Worker) -> None:
        """The try on ``worker`` failed before it took the request: the blocks it was credited with are no longer
        placed anywhere (whoever held them before is not known to hold them still)."""
        where, footprint = self._where, self.footprint
        for block in affinity.blocks:
            if where.get(block) == worker.url:
                del where[block]
                footprint[worker.url] -= 1

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
