"""Where each Responses API answer lives: vLLM keeps a response's state in the memory of the server that made it,
so a follow-up naming it (``previous_response_id``) and a retrieve by id must reach that same worker.

Remembered in this process, bounded (the oldest forgotten first), each with its tenant: a response is found only
by the tenant that made it. Replicas behind a load balancer need a follow-up to reach the replica that made its
predecessor (the session affinity of deploy/), or it is refused as unknown, clearly, never sent elsewhere.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass

REMEMBERED = 100_000  # about 20 MB
_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]{1,128})"')


@dataclass(frozen=True, slots=True)
class Home:
    tenant: str
    pool: str
    worker: str  # its URL
    # the conversation's tokens so far, which the worker puts before a follow-up's prompt: what the follow-up's
    # reservation must add to its own (pipeline.conversation)
    tokens: int = 0


class ResponseHomes:
    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._homes: collections.OrderedDict[str, Home] = collections.OrderedDict()

    def remember(self, answer_start: bytes, home: Home) -> str | None:
        """Remember the response named at the start of an answer (a body, or a stream's first event)."""
        found = _ID.search(answer_start)
        if found is None:
            return None
        rid = found[1].decode()
        self._homes[rid] = home
        self._homes.move_to_end(rid)
        while len(self._homes) > self.size:
            self._homes.popitem(last=False)
        return rid

    def find(self, rid: str, tenant: str) -> Home | None:
        """Where the response ``rid`` of ``tenant`` lives; None if this process did not make it for them."""
        home = self._homes.get(rid)
        return home if home is not None and home.tenant == tenant else None
