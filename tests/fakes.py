"""In-process fakes for unit tests: a scripted worker on loopback and a Gateway built from a policy dict.

The worker is a real aiohttp server in the test's own event loop (like httpx's MockTransport, but over a
socket, because the upstream client's errors are transport errors): each test scripts
what the worker answers, and the pipeline runs as in production, without ASGI and without subprocesses.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway import pipeline
from gateway.context import RequestContext
from gateway.endpoints import CHAT, Endpoint
from gateway.fleet.worker import Learned, Observed, Worker
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from gateway.runtime import Gateway
from gateway.sink import BufferSink
from gateway.transport.http1 import Response
from tests.conftest import policy_dict

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MODEL = "sim-llama-8b"


def chunk(text: str, finish: str | None = None, usage: tuple[int, int] | None = None) -> bytes:
    """One token's event; with ``usage`` (prompt, completion so far), as vLLM's continuous_usage_stats sends it."""
    event: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": MODEL, "choices": [
        {"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    if usage is not None:
        event["usage"] = {"prompt_tokens": usage[0], "total_tokens": sum(usage), "completion_tokens": usage[1],
                          "prompt_tokens_details": {"cached_tokens": 2}}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def usage_event(prompt: int, completion: int, cached: int | None = None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                                     "usage": usage}) + b"\n\n"


def completion_json(text: str = "hi there", prompt: int = 7, completion: int = 2) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


def stream_of(tokens: list[str], prompt: int = 7, *, gap_s: float = 0.0, break_after: int | None = None,
              continuous: bool = False) -> Handler:
    """A worker that streams ``tokens`` (one event per write), then usage and [DONE]; or drops the
    connection after ``break_after`` tokens. ``continuous``: usage on every chunk when the request asks."""
    async def handle(request: web.Request) -> web.StreamResponse:
        options = orjson.loads(await request.read()).get("stream_options") or {}
        per_chunk = continuous and bool(options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i, token in enumerate(tokens):
            if break_after is not None and i == break_after:
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.write(chunk(token, "stop" if i == len(tokens) - 1 else None,
                                       (prompt, i + 1) if per_chunk else None))
            if gap_s:
                await asyncio.sleep(gap_s)
        await response.write(usage_event(prompt, len(tokens), 2 if continuous else None))
        await response.write(b"data: [DONE]\n\n")
        return response
    return handle


def json_of(body: dict[str, Any], status: int = 200, delay_s: float = 0.0) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.json_response(body, status=status)
    return handle


class FakeWorker:
    """A worker on 127.0.0.1:<free port> answering /health, /metrics and the completion and Responses paths
    with ``handler``, and reads of a stored response (GET /v1/responses/{id}) with ``stored``."""

    def __init__(self, handler: Handler, stored: Handler | None = None) -> None:
        self.handler = handler
        self.stored = stored
        self.requests: list[dict[str, Any]] = []
        self.heads: list[dict[str, str]] = []  # each completion request's headers, lower-cased names
        self.disconnects = 0  # completion requests whose client went away before the handler finished
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(orjson.loads(await request.read()))
        self.heads.append({k.lower(): v for k, v in request.headers.items()})
        try:
            return await self.handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1
            raise

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n"
                                 "vllm:kv_cache_usage_perc 0.0\n")

    async def __aenter__(self) -> FakeWorker:
        app = web.Application(handler_args={"handler_cancellation": True})
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/responses", self._complete)
        if self.stored is not None:
            app.router.add_get("/v1/responses/{response_id}", self.stored)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@contextlib.asynccontextmanager
async def running_gateway(workers: list[str], **pool: Any) -> AsyncIterator[Gateway]:
    """A Gateway (no HTTP server) started on the test policy over ``workers``."""
    policy = Policy.model_validate(policy_dict(workers, **pool))
    gw = Gateway(PolicyStore(PolicySnapshot.build(policy, "test")))
    async with gw.lifespan():
        yield gw


async def call(gw: Gateway, body: dict[str, Any] | bytes, tenant: str = "demo",
               endpoint: Endpoint = CHAT, sink: type[BufferSink] = BufferSink) -> tuple[RequestContext, BufferSink]:
    """One request (a body, or its raw bytes) through the pipeline's lifecycle, answered into a buffer (``sink``:
    its class)."""
    ctx = RequestContext("test-request", gw.store.current, endpoint)
    ctx.tenant = gw.store.current.tenants[tenant]
    answer = sink()
    async with pipeline.Lifecycle(gw, ctx, answer):
        await pipeline.run(gw, ctx, body if isinstance(body, bytes) else orjson.dumps(body), answer)
    return ctx, answer


def live_worker(url: str, pool: str = "p", scraped_at: float = 0.0, limit: int = 0) -> Worker:
    """A worker the scraper has admitted (healthy), as read at ``scraped_at``, with ``limit`` learned."""
    return Worker(url, pool, observed=Observed(healthy=True, scraped_at=scraped_at), learned=Learned(limit=limit))


def inflight(gw: Gateway) -> int:
    return sum(pool.inflight for pool in gw.upstreams.pools.values())


def chat(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
            "stream": stream, **extra}


class HandClock:
    """A wall clock moved by hand (``clock.now += 0.3``), for code that takes ``clock=``: what expires or lapses
    does so when the test says, not after a sleep."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class ScriptedResponse(Response):
    """A worker's answer from memory: its body in the pieces a worker writes, one piece a read (as vLLM's tokens
    arrive one event a read), with no connection behind it."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], pieces: list[bytes]) -> None:
        super().__init__(None, asyncio.get_running_loop())  # type: ignore[arg-type]
        self.status, self.headers, self.keep_alive = status, headers, True
        self.pieces = collections.deque(pieces)

    async def readany(self) -> bytes:
        return self.pieces.popleft() if self.pieces else b""

    async def read(self) -> bytes:
        body = b"".join(self.pieces)
        self.pieces.clear()
        return body


class ScriptedClient:
    """A pool's client (gateway.transport.http1.Client's ``request``) answering from a script, in memory: what a
    request costs the gateway, without the sockets' timing (which decides how a stream's events group into reads).
    ``answer(body)``: (status, headers, pieces) for a request's body."""

    def __init__(self, answer: Callable[[bytes], tuple[int, list[tuple[bytes, bytes]], list[bytes]]]) -> None:
        self.answer = answer
        self.answers: dict[bytes, tuple[int, list[tuple[bytes, bytes]], list[bytes]]] = {}  # written once per body

    async def request(self, method: bytes, url: str, path: str, body: bytes = b"",
                      headers: list[tuple[bytes, bytes]] | None = None,
                      sent: list[float] | None = None) -> ScriptedResponse:
        if sent is not None:
            sent.append(time.perf_counter())
        answer = self.answers.get(body)
        if answer is None:
            answer = self.answers[body] = self.answer(body)
        return ScriptedResponse(*answer)

    def close(self) -> None:
        pass


def vllm_answer(body: bytes, tokens: int = 16) -> tuple[int, list[tuple[bytes, bytes]], list[bytes]]:
    """What vLLM answers a chat request with ``tokens`` tokens: a whole answer, or (``stream``) one event per read,
    each with the continuous usage the gateway asks for, then the usage event and [DONE]."""
    asked = orjson.loads(body)
    if not asked.get("stream"):
        answer = completion_json("word " * tokens, prompt=7, completion=tokens)
        return 200, [(b"content-type", b"application/json")], [orjson.dumps(answer)]
    pieces = [chunk(" word", "length" if i == tokens - 1 else None, (7, i + 1)) for i in range(tokens)]
    pieces += [usage_event(7, tokens, 2), b"data: [DONE]\n\n"]
    return 200, [(b"content-type", b"text/event-stream")], pieces
