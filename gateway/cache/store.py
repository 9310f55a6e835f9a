"""Where cache entries live: in process (the embedded default) or in Redis (shared by every replica).

Both keep, per entry: the question, its embedding, the answer, the scope and the expiry, plus an exact
key and a per-tenant LRU. The in-process store bounds what it holds in bytes, per tenant and in total
(gateway.cache.bounds). The Redis store also writes every insert and delete to a stream, from which
each replica keeps its own faiss index in step (and rebuilds it at start from the entries themselves).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from gateway.cache.bounds import Footprint
from gateway.policy.schema import CachePolicy

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

    from gateway.state import SharedState

# An Entry with its ids, keys and numbers, and its places in the exact map and the LRUs (tracemalloc: 0.86 KB).
ENTRY_OVERHEAD = 1024


@dataclass
class Entry:
    tenant: str
    model: str
    endpoint: str
    scope: str
    exact: str
    question: str
    answer: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int
    expires: float
    vector: np.ndarray | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)

    def alive(self, now: float | None = None) -> bool:
        return (now or time.time()) < self.expires

    def held_bytes(self) -> int:
        """What keeping this entry in memory costs: its texts, its vector and the index's copies of it."""
        vector = 0 if self.vector is None else 3 * self.vector.nbytes
        return ENTRY_OVERHEAD + sys.getsizeof(self.answer) + sys.getsizeof(self.question) + vector

    def to_redis(self) -> dict[FieldT, EncodableT]:
        out: dict[FieldT, EncodableT] = {k: str(v) for k, v in self.__dict__.items() if k != "vector"}
        if self.vector is not None:
            out["vector"] = self.vector.astype(np.float32).tobytes()
        return out

    @classmethod
    def from_redis(cls, data: dict[bytes, bytes]) -> Entry:
        d = {k.decode(): v for k, v in data.items()}
        vector = np.frombuffer(d["vector"], dtype=np.float32).copy() if "vector" in d else None
        text = {k: v.decode() for k, v in d.items() if k != "vector"}
        return cls(tenant=text["tenant"], model=text["model"], endpoint=text["endpoint"], scope=text["scope"],
                   exact=text["exact"], question=text["question"], answer=text["answer"],
                   finish_reason=text["finish_reason"], prompt_tokens=int(text["prompt_tokens"]),
                   completion_tokens=int(text["completion_tokens"]), max_tokens=int(text["max_tokens"]),
                   expires=float(text["expires"]), vector=vector, id=text["id"], created=float(text["created"]))


class StoreUnavailable(Exception):
    """The store could not be reached; the cache is bypassed, requests are still served."""


class CacheStore(Protocol):
    shared: bool

    @property
    def held(self) -> int:
        """Bytes of entries kept in this process."""


    async def get(self, entry_id: str) -> Entry | None: ...
    async def get_exact(self, exact: str) -> Entry | None: ...
    async def put(self, entry: Entry, spec: CachePolicy) -> list[str]: ...
    async def touch(self, entry: Entry) -> None: ...
    async def delete(self, ids: list[str]) -> int: ...
    async def select(self, tenant: str | None, model: str | None) -> list[str]: ...
    def scan(self) -> AsyncIterator[Entry]: ...
    async def events(self, cursor: str, block_ms: int) -> tuple[list[tuple[str, str]], str]: ...
    async def close(self) -> None: ...


class MemoryStore:
    """The embedded default: one process, nothing shared, nothing kept across restarts."""

    shared = False

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the wall clock entries expire by (``Entry.expires`` is epoch seconds)."""
        self.clock = clock
        self.entries: dict[str, Entry] = {}
        self.exact: dict[str, str] = {}
        self.footprint = Footprint()

    @property
    def held(self) -> int:
        return self.footprint.total

    async def get(self, entry_id: str) -> Entry | None:
        entry = self.entries.get(entry_id)
        if entry is not None and not entry.alive(self.clock()):
            await self.delete([entry_id])
            return None
        return entry

    async def get_exact(self, exact: str) -> Entry | None:
        entry_id = self.exact.get(exact)
        return await self.get(entry_id) if entry_id else None

    async def put(self, entry: Entry, spec: CachePolicy) -> list[str]:
        self.entries[entry.id] = entry
        old = self.exact.get(entry.exact)
        self.exact[entry.exact] = entry.id
        evicted = [old] if old and old != entry.id else []
        evicted += self.footprint.add(entry.id, entry.tenant, entry.held_bytes(), spec.max_tenant_bytes,
                                      spec.max_bytes, spec.max_entries_per_tenant)
        if evicted:
            await self.delete(evicted)
        return evicted

    async def touch(self, entry: Entry) -> None:
        self.footprint.touch(entry.id)

    async def delete(self, ids: list[str]) -> int:
        """Remove entries; returns how many existed."""
        removed = 0
        for entry_id in ids:
            entry = self.entries.pop(entry_id, None)
            if entry is None:
                continue
            removed += 1
            if self.exact.get(entry.exact) == entry_id:
                del self.exact[entry.exact]
            self.footprint.remove(entry_id)
        return removed

    async def select(self, tenant: str | None, model: str | None) -> list[str]:
        return [e.id for e in self.entries.values()
                if (tenant is None or e.tenant == tenant) and (model is None or e.model == model)]

    async def scan(self) -> AsyncIterator[Entry]:
        for entry in list(self.entries.values()):
            yield entry

    async def events(self, cursor: str, block_ms: int) -> tuple[list[tuple[str, str]], str]:
        return [], cursor  # nothing to follow: this process is the only writer

    async def close(self) -> None:
        return None


# The replies of the process's Redis client (gateway.state: no decode_responses, RESP2) as they come: bytes, and a
# stream read as [(stream, [(id, fields)])]. redis-py types each command for every mode a client can be in, so what
# this client reads is cast to what it gets.
_Hash = dict[bytes, bytes]
_StreamRead = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]


class RedisStore:
    """Entries as hashes, an exact-key index, a per-tenant LRU (sorted set) and a replication stream."""

    shared = True
    held = 0  # entries live in Redis; what a replica keeps of them is its index (SemanticCache)

    def __init__(self, state: SharedState, clock: Callable[[], float] = time.time) -> None:
        """On the process's one Redis client, under its namespace. ``clock``: the wall clock entries expire by
        and the LRU orders them by (Redis drops an entry itself at its TTL, set from this clock at ``put``)."""
        assert state.redis is not None
        self.clock = clock
        self.redis = state.redis
        self._errors = state.errors
        self.prefix = state.prefix + "cache:"
        self.stream = self.prefix + "events"
        # a blocking read of the stream must return before the socket times out
        self._block_ms = max(10, int(state.timeout_s * 600))

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except self._errors as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from None

    def _key(self, entry_id: str) -> str:
        return f"{self.prefix}e:{entry_id}"

    async def get(self, entry_id: str) -> Entry | None:
        data = await self._call(self.redis.hgetall(self._key(entry_id)))
        if not data:
            return None
        entry = Entry.from_redis(data)
        return entry if entry.alive(self.clock()) else None

    async def get_exact(self, exact: str) -> Entry | None:
        entry_id = await self._call(self.redis.get(f"{self.prefix}x:{exact}"))
        return await self.get(entry_id.decode()) if entry_id else None

    async def put(self, entry: Entry, spec: CachePolicy) -> list[str]:
        now = self.clock()
        ttl = max(1, int(entry.expires - now))  # whole seconds, at least one: what EXPIRE takes
        lru = f"{self.prefix}lru:{entry.tenant}"
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self._key(entry.id), mapping=entry.to_redis())
        pipe.expire(self._key(entry.id), ttl)
        pipe.set(f"{self.prefix}x:{entry.exact}", entry.id, ex=ttl, get=True)
        pipe.zadd(lru, {entry.id: now})
        pipe.xadd(self.stream, {"op": "put", "id": entry.id}, maxlen=100_000, approximate=True)
        pipe.zcard(lru)
        results = await self._call(pipe.execute())
        replaced = results[2].decode() if results[2] else None
        evicted = [replaced] if replaced and replaced != entry.id else []  # one entry per exact request
        overflow = int(results[-1]) - spec.max_entries_per_tenant
        if overflow > 0:
            popped = await self._call(self.redis.zpopmin(lru, overflow))
            evicted += [member.decode() for member, _ in popped]
        if evicted:
            await self.delete(evicted)
        return evicted

    async def touch(self, entry: Entry) -> None:
        await self._call(self.redis.zadd(f"{self.prefix}lru:{entry.tenant}", {entry.id: self.clock()}, xx=True))

    async def delete(self, ids: list[str]) -> int:
        """Remove entries; returns how many existed."""
        if not ids:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for entry_id in ids:
            pipe.hmget(self._key(entry_id), ["tenant", "exact"])
        found = await self._call(pipe.execute())
        pipe = self.redis.pipeline(transaction=True)
        deletes = []  # where each entry's DEL answer lands in the pipeline's results
        for entry_id, (tenant, exact) in zip(ids, found, strict=True):
            deletes.append(len(pipe))
            pipe.delete(self._key(entry_id))
            if exact:
                # only if the exact key still points here
                pipe.eval("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
                          "return 0", 1, f"{self.prefix}x:{exact.decode()}", entry_id)
            if tenant:
                pipe.zrem(f"{self.prefix}lru:{tenant.decode()}", entry_id)
            pipe.xadd(self.stream, {"op": "del", "id": entry_id}, maxlen=100_000, approximate=True)
        results = await self._call(pipe.execute())
        return sum(int(results[i]) for i in deletes)

    async def select(self, tenant: str | None, model: str | None) -> list[str]:
        ids = []
        async for entry in self.scan():
            if (tenant is None or entry.tenant == tenant) and (model is None or entry.model == model):
                ids.append(entry.id)
        return ids

    async def scan(self) -> AsyncIterator[Entry]:
        try:
            async for key in self.redis.scan_iter(match=f"{self.prefix}e:*", count=500):
                data = cast(_Hash, await self.redis.hgetall(key))
                if data:
                    entry = Entry.from_redis(data)
                    if entry.alive(self.clock()):
                        yield entry
        except self._errors as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from None

    async def last_event_id(self) -> str:
        info = await self._call(self.redis.xrevrange(self.stream, count=1))
        return info[0][0].decode() if info else "0-0"

    async def events(self, cursor: str, block_ms: int) -> tuple[list[tuple[str, str]], str]:
        try:
            reply = cast("_StreamRead | None",
                         await self.redis.xread({self.stream: cursor}, block=min(block_ms, self._block_ms), count=500))
        except self._errors as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from None
        out = []
        for _, messages in reply or []:
            for message_id, fields in messages:
                cursor = message_id.decode()
                out.append((fields[b"op"].decode(), fields[b"id"].decode()))
        return out, cursor

    async def close(self) -> None:
        return None  # the client is the process's (gateway.state), closed with it
