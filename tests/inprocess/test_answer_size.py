"""An answer's size against what the gateway relays (the pool's ``max_answer_bytes``): what cannot fit is refused
before a worker makes it; what a worker made past the cap anyway is dropped without a retry elsewhere and billed at
the request's completion bound; and the bound the gateway holds a request to covers the answers vLLM's stand-in
really makes, whatever n, max_tokens and log-probabilities a client asks for."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.endpoints import CHAT, COMPLETIONS
from tests.fakes import MODEL, FakeWorker, call, chat, completion_json, json_of, running_gateway
from workers.sim.engine import EngineConfig
from workers.sim.server import SimServer

ZERO = EngineConfig(decode_base_s=0.0, decode_per_seq_s=0.0, prefill_per_token_s=0.0, mean_output_tokens=0)
CAP = 1 << 20


def test_an_answer_that_cannot_fit_is_refused_before_any_worker_makes_it() -> None:
    """n: 128 with top_logprobs: 20 (40-80 MB of JSON from a 200-byte request) is a 400 naming the parameters;
    no worker sees it, nothing is billed; the same request asking for less goes through."""
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as worker, \
                running_gateway([worker.url], max_answer_bytes=32 << 20) as gw:
            for body in (chat(n=128, max_tokens=512, logprobs=True, top_logprobs=20),
                         chat(stream=True, n=128, max_tokens=1024),
                         {**chat(max_tokens=8), "prompt_logprobs": -1}):
                ctx, sink = await call(gw, body)
                error = orjson.loads(sink.body)["error"]
                assert (sink.status, error["code"]) == (400, "answer_too_large"), sink.body
                assert "MiB" in error["message"] and ctx.completion_tokens in (None, 0)
            assert "n=128" in error["message"] or "prompt_logprobs=-1" in error["message"]
            assert worker.requests == []
            ctx, sink = await call(gw, chat(n=2, max_tokens=512, logprobs=True, top_logprobs=20))
            assert sink.status == 200 and len(worker.requests) == 1
    asyncio.run(main())


def test_an_answer_over_the_cap_is_not_retried_and_is_billed_at_its_bound() -> None:
    """Two workers that answer past the cap (whole, with a Content-Length; and streamed): one try, a 502
    answer_too_large, the other worker untouched and neither cooled down; the request billed at max_tokens for
    every sequence, flagged estimated (what the engine made, whatever the client got)."""
    huge = {**completion_json(), "filler": "x" * (2 * CAP)}

    async def streamed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        event = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "y" * 4096}}]}) + b"\n\n"
        for _ in range(2 * CAP // len(event)):
            await response.write(event)
        return response

    async def main() -> None:
        for handler, stream in ((json_of(huge), False), (streamed, True)):
            async with FakeWorker(handler) as first, FakeWorker(handler) as second, \
                    running_gateway([first.url, second.url], max_answer_bytes=CAP) as gw:
                ctx, sink = await call(gw, chat(stream=stream, n=3, max_tokens=40))
                assert b"answer_too_large" in sink.body, sink.body[-300:]
                assert len(first.requests) + len(second.requests) == 1, "never retried on the other worker"
                assert (ctx.completion_tokens, ctx.usage_estimated) == (3 * 40, True)
                assert all(w.observed.healthy for p in gw.upstreams.pools.values() for w in p.workers)
    asyncio.run(main())


def _sim_answers(bodies: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    async def main() -> list[bytes]:
        server = SimServer(ZERO, MODEL)
        server.engine.start()
        try:
            transport = httpx.ASGITransport(app=server.app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
                return [(await client.post(path, json=body)).content for path, body in bodies]
        finally:
            await server.engine.stop()
    return asyncio.run(main())


asks = st.fixed_dictionaries({
    "n": st.integers(1, 8), "max_tokens": st.integers(1, 120), "stream": st.booleans(),
    "logprobs": st.sampled_from([None, 0, 3, 20]), "echo": st.booleans(),
    "prompt": st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=200)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(asks)
def test_the_bound_covers_every_answer_the_engine_makes(ask: dict[str, Any]) -> None:
    """Over n, max_tokens, log-probabilities (chat's top_logprobs, completions' logprobs with or without echo),
    streamed or whole, with any text: the answer the simulated vLLM makes at its longest (ignore_eos) is never
    larger than what the gateway held the request to. A bound that undercounts (half of it) fails here."""
    n, tokens, stream, logprobs = ask["n"], ask["max_tokens"], ask["stream"], ask["logprobs"]
    options = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}} if stream else {}
    chat_body = {"model": MODEL, "messages": [{"role": "user", "content": ask["prompt"]}], "n": n,
                 "max_tokens": tokens, "stream": stream, "ignore_eos": True, **options,
                 **({"logprobs": True, "top_logprobs": logprobs} if logprobs is not None else {})}
    completion_body = {"model": MODEL, "prompt": ask["prompt"], "n": n, "max_tokens": tokens, "stream": stream,
                       "ignore_eos": True, "echo": ask["echo"], **options,
                       **({"logprobs": logprobs} if logprobs is not None else {})}
    bodies = [("/v1/chat/completions", chat_body), ("/v1/completions", completion_body)]
    for (_, body), endpoint, answer in zip(bodies, (CHAT, COMPLETIONS), _sim_answers(bodies), strict=True):
        raw = orjson.dumps(body)
        bound = endpoint.answer_bytes(body, tokens * n, endpoint.sequences(body), len(raw), stream)
        assert b'"error"' not in answer[:200], answer[:300]
        assert len(answer) <= bound, (endpoint, len(answer), bound)


def test_a_worker_error_over_the_cap_is_the_workers_failure_not_the_requests_size() -> None:
    """A 503 that claims a body past the cap (or sends one) is a broken worker: cooled down, the request retried
    on the other worker and answered there, and billed as that answer, never at the request's bound."""
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=503, body=b"x" * (2 * CAP), content_type="application/json")

    async def main() -> None:
        async with FakeWorker(broken) as bad, FakeWorker(json_of(completion_json(completion=3))) as good, \
                running_gateway([bad.url, good.url], max_answer_bytes=CAP, cooldown_s=30.0) as gw:
            for _ in range(3):
                ctx, sink = await call(gw, chat(n=3, max_tokens=40))
                assert sink.status == 200, sink.body[:200]
                assert (ctx.completion_tokens, ctx.usage_estimated) == (3, False)
            assert len(bad.requests) == 1, "cooled down after its first failure"
            assert not next(w for p in gw.upstreams.pools.values() for w in p.workers
                            if w.url == bad.url).observed.healthy
    asyncio.run(main())


def test_completions_take_max_tokens_only() -> None:
    """vLLM's completions ignore max_completion_tokens (chat's name) and generate max_tokens: a body naming it is
    refused, so the policy's cap and the meter read the bound the engine uses."""
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as worker, running_gateway([worker.url]) as gw:
            body = {"model": MODEL, "prompt": "hi", "max_completion_tokens": 1, "max_tokens": 100_000}
            ctx, sink = await call(gw, body, endpoint=COMPLETIONS)
            error = orjson.loads(sink.body)["error"]
            assert (sink.status, error["param"]) == (400, "max_completion_tokens") and worker.requests == []
            ctx, sink = await call(gw, {"model": MODEL, "prompt": "hi", "max_tokens": 100_000}, endpoint=COMPLETIONS)
            assert worker.requests[-1]["max_tokens"] == ctx.tenant.max_tokens_cap  # clamped by the policy
    asyncio.run(main())
