"""The prefix index learns as each try is sent, and forgets what a failed try taught: the worker a request ends on
is the one named as holding its blocks, from the moment it has the request."""

from __future__ import annotations

import asyncio
import socket

import orjson
from aiohttp import web

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.routing.affinity import Affinity
from gateway.routing.prefixes import PrefixIndex
from gateway.upstream.dispatch import Dispatch
from gateway.upstream.pools import UpstreamPool
from tests.fakes import FakeWorker, chat, completion_json, json_of, live_worker, running_gateway

PROMPT = Affinity(blocks=(11, 12, 13, 14))
PATH = "/v1/chat/completions"


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def send(pool: UpstreamPool, gw_snapshot: object, affinity: Affinity | None = PROMPT,
               pinned: str | None = None) -> RequestContext:
    """One dispatch of a chat body through ``pool``, its answer read to the end."""
    ctx = RequestContext("test-request", gw_snapshot, CHAT)  # type: ignore[arg-type]
    async with Dispatch(ctx, pool, PATH, orjson.dumps(chat()), affinity, pinned) as (_, response):
        assert response.status == 200
        await response.read()
    return ctx


def test_a_connect_failure_retried_on_a_second_worker_leaves_the_index_naming_the_second_only() -> None:
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as good, \
                running_gateway([good.url], scrape_interval_s=10) as gw:
            pool = gw.upstreams.pools["main"]
            dead = live_worker(closed_port_url(), "main")
            pool.workers.insert(0, dead)
            index = pool.router.index
            index.remember(PROMPT.blocks, dead.url)  # it held the prompt before it went down: tried first
            ctx = await send(pool, gw.store.current)
            assert (ctx.attempts, ctx.worker) == (2, good.url) and not dead.observed.healthy
            assert index.longest(PROMPT.blocks) == (good.url, len(PROMPT.blocks))
            assert index.footprint[dead.url] == 0 and index.footprint[good.url] == len(index) == len(PROMPT.blocks)
    asyncio.run(main())


def test_a_retried_5xx_records_nothing_for_the_worker_that_answered_it() -> None:
    async def main() -> None:
        async with FakeWorker(json_of({"error": "overloaded"}, status=503)) as bad, \
                FakeWorker(json_of(completion_json())) as good, \
                running_gateway([bad.url, good.url], scrape_interval_s=10) as gw:
            pool = gw.upstreams.pools["main"]
            index = pool.router.index
            index.remember(PROMPT.blocks, bad.url)
            ctx = await send(pool, gw.store.current)
            assert ctx.worker == good.url and len(bad.requests) == 1, "the bad worker was tried first"
            assert index.longest(PROMPT.blocks) == (good.url, len(PROMPT.blocks)) and index.footprint[bad.url] == 0
    asyncio.run(main())


def test_the_index_names_the_worker_while_it_still_generates_a_whole_answer() -> None:
    """A non-streamed answer's head comes only when it is done: a second request with the prompt, sent meanwhile,
    must find the blocks where the first went (it did not, when the index learned at the head: it went by hash to
    whichever worker had room and prefilled the prompt again)."""
    async def main() -> None:
        received, release = asyncio.Event(), asyncio.Event()

        async def held(request: web.Request) -> web.StreamResponse:
            await request.read()
            received.set()
            await release.wait()
            return web.json_response(completion_json())

        async with FakeWorker(held) as one, FakeWorker(held) as two, \
                running_gateway([one.url, two.url], scrape_interval_s=10) as gw:
            pool = gw.upstreams.pools["main"]
            first = asyncio.get_running_loop().create_task(send(pool, gw.store.current))
            await received.wait()
            holder = one.url if one.requests else two.url
            assert pool.router.index.longest(PROMPT.blocks) == (holder, 4), "placed while it generates"
            second = asyncio.get_running_loop().create_task(send(pool, gw.store.current))
            release.set()
            done, again = await first, await second
            assert (done.route, done.worker) == ("hash", holder)
            assert (again.route, again.worker) == ("prefix 4/4", holder)
    asyncio.run(main())


def test_a_refused_try_withdraws_only_its_own_blocks() -> None:
    index, a, b = PrefixIndex(), live_worker("http://a"), live_worker("http://b")
    index.taken(Affinity(blocks=(1, 2)), b)
    index.taken(PROMPT, a)
    index.refused(Affinity(blocks=(1, 2, *PROMPT.blocks)), a)
    assert len(index) == 2 and index.footprint == {"http://a": 0, "http://b": 2}, "b's blocks stay b's"


def test_a_pinned_request_teaches_the_index_nothing() -> None:
    """A request pinned to the worker holding what it continues: its body is not the prompt the engine caches."""
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as one, FakeWorker(json_of(completion_json())) as two, \
                running_gateway([one.url, two.url], scrape_interval_s=10) as gw:
            pool = gw.upstreams.pools["main"]
            ctx = await send(pool, gw.store.current, pinned=two.url)
            assert ctx.worker == two.url and len(pool.router.index) == 0
    asyncio.run(main())


def test_taken_remembers_the_blocks_and_a_worker_is_forgotten() -> None:
    index, worker = PrefixIndex(), live_worker("http://a")
    index.taken(Affinity(blocks=()), worker)
    assert len(index) == 0, "a prompt shorter than a block names nothing"
    index.taken(PROMPT, worker)
    assert index.longest(PROMPT.blocks) == ("http://a", 4) and index.holds(11) and not index.holds(12345)
    index.forget("http://a")
    assert len(index) == 0 and not index.holds(11)
