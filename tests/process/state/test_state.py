"""Shared state: the live gateway processes in Redis (this machine's) and each one's part of a worker's limit."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
import redis

from gateway.policy.schema import StatePolicy
from gateway.state import SharedState
from gateway.state import replicas as members
from gateway.state.replicas import ALONE, Replicas, Share
from tests.conftest import REDIS_URL

BEAT_S = 0.2


class Clock:
    """The heartbeats' clock, moved by hand: no test waits on the wall clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own, so gateway processes of other tests on the same Redis do not count."""
    return f"test-{uuid.uuid4().hex[:8]}"


def test_parts_add_up_to_the_limit_as_processes_join_and_leave(namespace: str) -> None:
    async def main() -> None:
        clock = Clock()
        state = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=namespace))
        a, b, c = (Replicas(state, ALONE, beat_s=BEAT_S, clock=clock) for _ in range(3))
        first = await a.beat()
        assert first == Share(0, 1, ready=True), "alone: the whole limit at once"
        await b.beat()
        assert not b.share.ready, "a newcomer waits until the others have seen it"
        clock.now += 2 * BEAT_S
        for r in (a, b):
            await r.beat()
        assert a.share.ready and b.share.ready and {a.share.index, b.share.index} == {0, 1}
        assert a.share.of == b.share.of == 2
        for limit in (1, 5, 8, 9):
            assert a.share.of_limit(limit) + b.share.of_limit(limit) == max(limit, 2)
        await a.beat({"http://w1": (5, 0), "http://w2": (8, 0)})
        await b.beat({"http://w1": (4, 0), "http://w2": (0, 0)})  # 0: nothing learned yet
        await a.beat({"http://w1": (5, 0), "http://w2": (8, 0)})
        assert a.agreed == b.agreed == {"http://w1": 4, "http://w2": 8}, "everyone splits the lowest limit"
        # a holds 4 of w2's 8 (its part) and 3 of w1's 4 (one over its part of 2): b leaves that one unused
        await a.beat({"http://w1": (4, 3), "http://w2": (8, 4)})
        await b.beat({"http://w1": (4, 0), "http://w2": (8, 0)})
        assert b.excess == {"http://w1": 1} and a.excess == {}

        await c.beat()
        clock.now += 2 * BEAT_S
        for r in (a, b, c):
            await r.beat()
        assert sum(r.share.of_limit(7) for r in (a, b, c)) == 7 and all(r.share.of == 3 for r in (a, b, c))

        # c is killed (no leave): after three silent beats the others take its part
        for _ in range(4):
            clock.now += BEAT_S
            await a.beat()
            await b.beat()
        assert a.share.of == b.share.of == 2 and a.share.of_limit(7) + b.share.of_limit(7) == 7
        await b.leave()  # a clean stop: gone at the next beat
        assert (await a.beat({"http://w1": (5, 0)})) == Share(0, 1)
        assert a.agreed == {"http://w1": 5}, "a process that left no longer holds the limit down"
        await state.close()
    asyncio.run(main())


def test_an_unreadable_entry_counts_the_process_but_not_its_report(namespace: str) -> None:
    async def main() -> None:
        clock = Clock()
        state = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=namespace))
        a, b = (Replicas(state, ALONE, beat_s=BEAT_S, clock=clock) for _ in range(2))
        await a.beat()
        await b.beat()
        clock.now += 2 * BEAT_S
        await b.beat()
        for garbage in (b"not json", b'{"http://w1": "four"}', b"[1, 2]", b'{"http://w1": [-1, 0]}'):
            assert state.redis is not None
            await state.redis.hset(f"{namespace}:replica-limits", b.id, garbage)
            share = await a.beat({"http://w1": (5, 0)})
            assert share.of == 2 and share.ready, "b is still live: a keeps to its part"
            assert a.agreed == {"http://w1": 5} and a.excess == {}, "b's unreadable report is left out"
        await state.close()
    asyncio.run(main())


def test_each_process_sees_what_the_others_tenants_hold(namespace: str) -> None:
    """The tenants' report rides on the heartbeat: each process gets the others' sum, never its own, a silent
    process's report goes with it, and a report of another shape is read only as far as it is well formed."""
    async def main() -> None:
        clock = Clock()
        state = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=namespace))
        a, b, c = (Replicas(state, ALONE, beat_s=BEAT_S, clock=clock) for _ in range(3))
        await a.beat(tenants={"p": {"premium": {"flood": 4}}})
        await b.beat(tenants={"p": {"premium": {"quiet": 0, "flood": 1}}})
        await c.beat(tenants={"p": {"premium": {"flood": 2}, "batch": {"nightly": 3}}})
        await a.beat(tenants={"p": {"premium": {"flood": 4}}})
        assert a.elsewhere == {"p": {"premium": {"quiet": 0, "flood": 3}, "batch": {"nightly": 3}}}
        await b.beat(tenants={"p": {"premium": {"quiet": 0, "flood": 1}}})
        assert b.elsewhere == {"p": {"premium": {"flood": 6}, "batch": {"nightly": 3}}}

        assert state.redis is not None
        garbage = {"p": {"premium": {"flood": -1, "x" * 200: 5, "ok": 2, "float": 1.5}, "batch": [1]}, "q": 7}
        await state.redis.hset(f"{namespace}:replica-tenants", c.id, orjson.dumps(garbage))
        await a.beat(tenants={})
        assert a.elsewhere == {"p": {"premium": {"quiet": 0, "flood": 1, "ok": 2}}}, "only what is well formed"
        await state.redis.hset(f"{namespace}:replica-tenants", c.id, b"not json")
        await a.beat(tenants={})
        assert a.elsewhere == {"p": {"premium": {"quiet": 0, "flood": 1}}}

        for _ in range(4):  # b and c fall silent: their reports go with them
            clock.now += BEAT_S
            await a.beat(tenants={})
        assert a.live == [a.id] and a.elsewhere == {}
        await state.close()
    asyncio.run(main())


def test_redis_down_keeps_the_last_known_part(namespace: str) -> None:
    async def main() -> None:
        clock = Clock()
        up = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=namespace))
        a, b = (Replicas(up, ALONE, beat_s=BEAT_S, clock=clock) for _ in range(2))
        await a.beat()
        await b.beat()
        clock.now += 2 * BEAT_S
        known = await b.beat()
        assert known.of == 2 and known.ready
        dead = SharedState(StatePolicy(redis_url="redis://127.0.0.1:1/0", timeout_ms=100))
        assert dead.redis is not None
        b._script = dead.redis.register_script(members._BEAT)  # b's Redis goes away
        assert await b.beat() == known, "the last known part, not the whole limit"
        never = Replicas(dead, Share(1, 2))
        assert await never.beat() == Share(1, 2), "never reached Redis: the host's own split"
        await up.close()
        await dead.close()
    asyncio.run(main())
    assert redis.Redis().exists(f"{namespace}:replicas"), "the list lives under the namespace"
