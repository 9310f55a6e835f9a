"""Work that escapes the meter: a request must not use a worker past what it reserved, nor without a record.

Background responses are refused; a follow-up's reservation carries its stored conversation; an answer whose
usage cannot be read is estimated, never $0; a stored response read back goes through the lifecycle. In-process
with scripted workers (tests/fakes.py) where a worker must misbehave or wait, over real processes otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import math
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web

from gateway import pipeline
from gateway.auth import hash_key
from gateway.context import RequestContext
from gateway.endpoints import CHAT, RESPONSES, RETRIEVE, Endpoint
from gateway.ledger.stores import OPEN_END, OPEN_START, SqliteLedger
from gateway.ledger.writer import LedgerWriter
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from gateway.runtime import Gateway
from gateway.sink import BufferSink
from gateway.spend.counters import NANO
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, Proc, ledger_records, metric_value, patient, policy_dict
from tests.fakes import MODEL, FakeWorker, chat, completion_json, inflight

Starter = Callable[..., Proc]
AUTH = {"authorization": f"Bearer {DEMO_KEY}"}


@contextlib.asynccontextmanager
async def metered(where: Path, workers: list[str], pool: dict[str, Any] | None = None,
                  demo: dict[str, Any] | None = None, **server: Any) -> AsyncIterator[tuple[Gateway, SqliteLedger]]:
    """A Gateway (no HTTP server) on the test policy (``pool``, ``demo`` and ``server``: settings added to the
    pool, the demo tenant and the server), writing its ledger to SQLite in ``where``; the records are all in the
    store once the block has ended (the writer flushes when the gateway stops)."""
    policy = policy_dict(workers, **(pool or {}))
    policy["server"].update(server)
    policy["tenants"]["demo"].update(demo or {})
    store = SqliteLedger(where / "ledger.db")
    gw = Gateway(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")),
                 LedgerWriter(store, where / "spool.jsonl"))
    async with gw.lifespan():
        yield gw, store


def records(store: SqliteLedger) -> dict[str, dict[str, Any]]:
    return {r["request_id"]: r for r in store.records(OPEN_START, OPEN_END, None, None, 100)}


async def ask(gw: Gateway, body: dict[str, Any], rid: str = "asked", endpoint: Endpoint = CHAT,
              tenant: str = "demo") -> tuple[RequestContext, BufferSink]:
    """One request through the lifecycle, as tests.fakes.call, under a request id of its own (its record's)."""
    ctx = RequestContext(rid, gw.store.current, endpoint)
    ctx.tenant = gw.store.current.tenants[tenant]
    sink = BufferSink()
    async with pipeline.Lifecycle(gw, ctx, sink):
        await pipeline.run(gw, ctx, orjson.dumps(body), sink)
    return ctx, sink


# -- an answer whose usage cannot be read ----------------------------------------------------------------

def raw_json(body: bytes, headers: dict[str, str] | None = None, seen: list[str] | None = None) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        if seen is not None:
            seen.append(request.headers.get("accept-encoding", ""))
        return web.Response(body=body, content_type="application/json", headers=headers)
    return handle


def test_a_2xx_without_readable_usage_is_estimated_from_its_bytes_never_billed_as_nothing(tmp_path: Path) -> None:
    """A body without usage, with usage null, or with usage that is not a count: the prompt from the request's
    size, the completion from the answer's (4 bytes a token), flagged as an estimate, and priced."""
    answer = completion_json("an answer of a few words")
    bodies = {"none": {k: v for k, v in answer.items() if k != "usage"}, "null": {**answer, "usage": None},
              "junk": {**answer, "usage": {"prompt_tokens": "many", "completion_tokens": -3}}}

    async def main() -> None:
        for case, body in bodies.items():
            raw = orjson.dumps(body)
            async with FakeWorker(raw_json(raw)) as w, metered(tmp_path / case, [w.url]) as (gw, store):
                ctx, sink = await ask(gw, chat())
                assert sink.status == 200 and orjson.loads(sink.body) == body, case
                assert ctx.usage_estimated, case
                most = chat()["max_tokens"]
                assert (ctx.prompt_tokens, ctx.completion_tokens) == (len(orjson.dumps(chat())) // 4,
                                                                      min(len(raw) // 4, most)), case
            (row,) = records(store).values()
            assert row["estimated"] and row["cost_usd"] > 0, (case, row)
            assert (row["prompt_tokens"], row["completion_tokens"]) == (ctx.prompt_tokens, ctx.completion_tokens)
    for case in bodies:
        (tmp_path / case).mkdir()
    asyncio.run(main())


def test_a_completion_past_what_the_request_allowed_is_billed_at_that_bound(tmp_path: Path) -> None:
    """A worker that claims more output tokens than max_tokens let it make (or whose answer's bytes would
    estimate more) is billed the bound the reservation held, and the record says it is an estimate."""
    claimed = orjson.dumps(completion_json(prompt=11, completion=10_000))
    unreadable = orjson.dumps({**completion_json(), "usage": None, "pad": "x" * 4000})

    async def main() -> None:
        for case, raw in (("claimed", claimed), ("unreadable", unreadable)):
            async with FakeWorker(raw_json(raw)) as w, metered(tmp_path / case, [w.url]) as (gw, store):
                ctx, sink = await ask(gw, chat())
                assert sink.status == 200
                assert ctx.completion_tokens == chat()["max_tokens"] and ctx.usage_estimated, case
            (row,) = records(store).values()
            assert row["completion_tokens"] == chat()["max_tokens"] and row["estimated"], case
    for case in ("claimed", "unreadable"):
        (tmp_path / case).mkdir()
    asyncio.run(main())


def test_a_compressed_answer_is_a_502_and_still_billed_as_an_estimate(tmp_path: Path) -> None:
    """Workers are asked for identity; one that gzips anyway is refused (its usage and events cannot be read),
    and the ledger bills what its bytes say rather than $0. A compressed stream is dropped at once."""
    answer = gzip.compress(orjson.dumps(completion_json(prompt=11, completion=3)))
    seen: list[str] = []

    async def compressed_stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream", "content-encoding": "gzip"})
        await response.prepare(request)
        await response.write(gzip.compress(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'))
        return response

    async def main() -> None:
        async with FakeWorker(raw_json(answer, {"content-encoding": "gzip"}, seen)) as w, \
                FakeWorker(compressed_stream) as streamer, \
                metered(tmp_path, [w.url]) as (gw, store), \
                metered(tmp_path / "stream", [streamer.url]) as (gw_stream, stream_store):
            ctx, sink = await ask(gw, chat(), "whole")
            assert sink.status == 502 and seen == ["identity"]
            assert ctx.usage_estimated and ctx.completion_tokens == min(len(answer) // 4, chat()["max_tokens"]) > 0
            ctx, sink = await ask(gw_stream, chat(stream=True), "stream")
            assert sink.status == 502 and ctx.usage_estimated and ctx.prompt_tokens
            assert inflight(gw) == inflight(gw_stream) == 0
        for kept, rid in ((store, "whole"), (stream_store, "stream")):
            row = records(kept)[rid]
            assert row["status"] == 502 and row["estimated"] and row["cost_usd"] > 0, row
    (tmp_path / "stream").mkdir()
    asyncio.run(main())


# -- a follow-up carries its conversation --------------------------------------------------------------------

def response_json(rid: str, prompt: int, completion: int) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": "completed", "model": MODEL, "output": [],
            "usage": {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}}


def test_a_follow_ups_worst_case_includes_the_conversation_the_worker_adds(tmp_path: Path) -> None:
    """The worker puts the stored conversation before a follow-up's prompt: its rate-limit charge and its budget
    reservation add what the previous response used, input and output."""
    turns = iter([response_json("resp_first", 30_000, 500), response_json("resp_second", 30_600, 400)])

    async def next_turn(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=orjson.dumps(next(turns)), content_type="application/json")

    async def main() -> None:
        limits = {"rate_limit": {"tokens_per_minute": 10_000_000}, "budget": {"period": "day", "limit_usd": 10.0}}
        async with FakeWorker(next_turn) as w, metered(tmp_path, [w.url], demo=limits) as (gw, _):
            first = {"model": MODEL, "input": "a long document", "max_output_tokens": 600}
            await ask(gw, first, "first", RESPONSES)
            follow = {"model": MODEL, "input": "and then?", "previous_response_id": "resp_first",
                      "max_output_tokens": 400}
            home = gw.responses.find("resp_first", "demo")
            assert home is not None and home.tokens == 30_500
            ctx, sink = await ask(gw, follow, "second", RESPONSES)
            assert sink.status == 200 and ctx.worker == w.url
            size = len(orjson.dumps(follow))
            assert ctx.charge is not None and ctx.charge.tokens == size + 30_500 + 400  # type: ignore[attr-defined]
            worst_usd = ((size + 30_500) * 0.3 + 400 * 0.9) / 1e6  # the test policy's prices in force
            assert ctx.reservation is not None
            assert ctx.reservation.amount == math.ceil(worst_usd * NANO)  # type: ignore[attr-defined]
            home = gw.responses.find("resp_second", "demo")
            assert home is not None and home.tokens == 31_000, "its own count holds the conversation carried"
    asyncio.run(main())


# -- a stored response read back ---------------------------------------------------------------------------------

async def read_back(gw: Gateway, rid: str, tenant: str = "demo",
                    request_id: str = "read") -> tuple[RequestContext, BufferSink]:
    """GET /v1/responses/{rid} as the edge runs it: inside a lifecycle."""
    ctx = RequestContext(request_id, gw.store.current, RETRIEVE)
    ctx.tenant = gw.store.current.tenants[tenant]
    sink = BufferSink()
    async with pipeline.Lifecycle(gw, ctx, sink):
        await pipeline.retrieve(gw, ctx, rid, sink)
    return ctx, sink


def test_a_stored_response_read_is_leased_counted_against_the_tenant_and_recorded(tmp_path: Path) -> None:
    stored = response_json("resp_kept", 12, 4)
    arrived, go_on = asyncio.Event(), asyncio.Event()

    async def slow_read(request: web.Request) -> web.StreamResponse:
        arrived.set()
        await go_on.wait()
        return web.json_response(stored)

    async def main() -> None:
        async with FakeWorker(raw_json(orjson.dumps(stored)), slow_read) as w, \
                metered(tmp_path, [w.url], tenant_max_concurrency=1) as (gw, store):
            await ask(gw, {"model": MODEL, "input": "keep this", "max_output_tokens": 4}, "made", RESPONSES)
            reading = asyncio.create_task(read_back(gw, "resp_kept"))
            await arrived.wait()
            assert inflight(gw) == 1, "the worker is leased while it answers"
            _, busy = await ask(gw, chat(), "busy")
            assert busy.status == 429 and busy.error is not None and busy.error.code == "tenant_concurrency_exceeded"
            _, other = await ask(gw, chat(), "other", tenant="prem")
            assert other.status == 200, "another tenant's limit is its own"
            go_on.set()
            _, sink = await reading
            assert sink.status == 200 and orjson.loads(sink.body) == stored
            assert inflight(gw) == 0 and gw.scheduler.tenant_inflight == {}
            _, unknown = await read_back(gw, "resp_other", request_id="unknown")
            assert unknown.status == 404
            _, foreign = await read_back(gw, "resp_kept", tenant="prem", request_id="foreign")
            assert foreign.status == 404, "only the tenant that made it reads it"
        rows = records(store)
        read = rows["read"]
        assert (read["endpoint"], read["status"], read["worker"]) == ("responses.retrieve", 200, w.url)
        assert (read["prompt_tokens"], read["completion_tokens"], read["cost_usd"]) == (0, 0, 0.0), \
            "the stored usage is the original's, billed once"
        assert rows["unknown"]["status"] == 404 and rows["foreign"]["status"] == 404
    asyncio.run(main())


def test_a_worker_failing_a_read_is_cooled_down_like_any_other(tmp_path: Path) -> None:
    async def failing(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="overloaded")

    async def main() -> None:
        async with FakeWorker(raw_json(orjson.dumps(response_json("resp_kept", 12, 4))), failing) as w, \
                metered(tmp_path, [w.url], {"cooldown_s": 600.0}) as (gw, store):
            await ask(gw, {"model": MODEL, "input": "keep this", "max_output_tokens": 4}, "made", RESPONSES)
            _, sink = await read_back(gw, "resp_kept")
            assert sink.status == 502 and inflight(gw) == 0
            _, again = await read_back(gw, "resp_kept", request_id="again")
            assert again.status == 503 and again.error is not None
            assert again.error.code == "previous_response_unavailable", "the worker is cooling down"
        rows = records(store)
        assert rows["read"]["status"] == 502 and rows["again"]["status"] == 503
    asyncio.run(main())


def test_slow_reads_keep_to_their_own_connections_and_never_take_the_completions(tmp_path: Path) -> None:
    """Forty reads of a worker that answers them slowly: four hold the read connections, the rest get 503
    upstream_busy once the connect timeout has passed (the gateway's own limit: the worker is not cooled down),
    and completions from another tenant go on as before, on the pool's own connections."""
    stored = response_json("resp_kept", 12, 4)
    go_on, four = asyncio.Event(), asyncio.Event()
    arrived = 0

    async def slow_read(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        arrived += 1
        if arrived == 4:
            four.set()
        await go_on.wait()
        return web.json_response(stored)

    async def main() -> None:
        async with FakeWorker(raw_json(orjson.dumps(stored)), slow_read) as w, \
                metered(tmp_path, [w.url], {"max_connections": 16, "connect_timeout_s": 0.3}) as (gw, _):
            await ask(gw, {"model": MODEL, "input": "keep this", "max_output_tokens": 4}, "made", RESPONSES)
            reads = [asyncio.create_task(read_back(gw, "resp_kept", request_id=f"r{i}")) for i in range(40)]
            await four.wait()
            await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)  # the first refusal: the rest wait
            answers = [await ask(gw, chat(), f"c{i}", tenant="prem") for i in range(20)]
            assert all(sink.status == 200 for _, sink in answers), [s.status for _, s in answers]
            assert arrived == 4, "the reads had four connections of their own"
            while sum(task.done() for task in reads) < 36:  # every read past the four is refused before they end
                await asyncio.wait([t for t in reads if not t.done()], return_when=asyncio.FIRST_COMPLETED)
            go_on.set()
            results = [(await task)[1] for task in reads]
            busy = [s for s in results if s.status == 503]
            assert len(busy) == 36 and all(s.error is not None and s.error.code == "upstream_busy" for s in busy)
            assert sum(s.status == 200 for s in results) == 4
            assert all(worker.observed.healthy for pool in gw.upstreams.pools.values() for worker in pool.workers)
            assert inflight(gw) == 0
    asyncio.run(main())


# -- over real processes -----------------------------------------------------------------------------------------

def test_background_responses_are_refused_before_they_reach_a_worker(start_sim: Starter,
                                                                    start_gateway: Starter) -> None:
    """vLLM answers a background request 'queued', with no usage, and generates afterwards: the gateway could
    neither meter nor limit it, so it says so with a 400."""
    sim = start_sim()
    gateway = start_gateway(policy_dict([sim.url]))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="work on this while I wait", background=True,
                                extra_headers={"x-request-id": "in-background"})
    error = refused.value.body
    assert isinstance(error, dict) and (error["code"], error["param"]) == ("invalid_value", "background")
    assert "background" in error["message"].lower() and "meter" in error["message"]
    (row,) = ledger_records(gateway.url, ADMIN_TOKEN, request_id="in-background")
    assert row["status"] == 400 and row["worker"] is None
    assert client.responses.create(model=MODEL, input="now, please", background=False,
                                   max_output_tokens=3).id.startswith("resp_")


def test_a_read_back_is_in_the_ledger_and_under_the_tenants_request_rate(start_sim: Starter,
                                                                        start_gateway: Starter) -> None:
    sim = start_sim()
    policy = policy_dict([sim.url])
    policy["tenants"]["demo"]["rate_limit"] = {"requests_per_minute": 3}
    gateway = start_gateway(policy)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    made = client.responses.create(model=MODEL, input="remember this", max_output_tokens=3)
    got = client.responses.retrieve(made.id, extra_headers={"x-request-id": "read-back"})
    assert got.id == made.id and got.usage == made.usage
    (row,) = ledger_records(gateway.url, ADMIN_TOKEN, request_id="read-back")
    assert (row["endpoint"], row["status"], row["worker"], row["prompt_tokens"], row["completion_tokens"]) == \
        ("responses.retrieve", 200, sim.url, 0, 0)
    assert metric_value(gateway.url, "tollgate_worker_inflight") == 0
    client.responses.retrieve(made.id)
    with pytest.raises(openai.RateLimitError):
        client.responses.retrieve(made.id)


def test_concurrent_follow_ups_of_a_long_conversation_cannot_overspend_the_budget(start_sim: Starter,
                                                                                start_gateway: Starter) -> None:
    """30 follow-ups at once of an 8,000-token conversation: each one's reservation holds the conversation the
    worker adds, so together they stay within the budget (they reserved only their own bytes, and spent 3x it)."""
    sim = start_sim("--max-model-len", "16384", "--prefill-per-token-ms", "0", "--decode-base-ms", "50")
    key = "tg-test-talker-key"
    limit = 0.008
    policy = patient(policy_dict([sim.url]))
    policy["tenants"]["talker"] = {"tier": "standard", "keys": ["sha256:" + hash_key(key)], "models": ["*"],
                                   "budget": {"period": "day", "limit_usd": limit}}
    gateway = start_gateway(policy)
    headers = {"authorization": f"Bearer {key}"}

    def respond(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(gateway.url + "/v1/responses", headers=headers, timeout=60,
                          json={"model": MODEL, "max_output_tokens": 16, "ignore_eos": True, **body})

    first = respond({"input": "!" * 8000})
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    follow = {"input": "Go on.", "previous_response_id": first.json()["id"]}
    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(lambda _: respond(follow), range(30)))
    statuses = [a.status_code for a in answers]
    rows = ledger_records(gateway.url, ADMIN_TOKEN, count=31, tenant="talker")
    spent = sum(float(r["cost_usd"]) for r in rows)
    # the house's bound: the limit plus one request's reservation (its body's bytes and the conversation as
    # input at 0.3 USD a million, its 16 output tokens at 0.9)
    body_bytes = len(orjson.dumps({"model": MODEL, "max_output_tokens": 16, "ignore_eos": True, **follow}))
    one_reservation = ((body_bytes + usage["input_tokens"] + usage["output_tokens"]) * 0.3 + 16 * 0.9) / 1e6
    assert spent <= limit + one_reservation, (spent, statuses.count(200))
    assert set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses, statuses
    assert all(a.json()["error"]["code"] == "insufficient_quota" for a in answers if a.status_code == 429)
    assert sum(r["status"] == 200 and r["endpoint"] == "responses" for r in rows) == statuses.count(200) + 1


def test_an_answer_too_large_to_relay_never_reaches_the_engine(start_sim: Starter, start_gateway: Starter) -> None:
    """Six requests of n: 128 with top_logprobs: 20 (786,432 tokens and tens of MB of JSON on the workers when this
    was a 502 after the fact): each is a 400 answer_too_large through the official client, the engine's own
    generation counter does not move, and each leaves a ledger record of no tokens. The same request with n: 2
    is answered, and the ledger's completion tokens are the engine's."""
    sim = start_sim()
    gateway = start_gateway(policy_dict([sim.url]))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    generated = metric_value(sim.url, "vllm:generation_tokens_total")
    asked: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "list everything"}],
                             "max_tokens": 1024, "logprobs": True, "top_logprobs": 20}
    for i in range(6):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**asked, n=128, extra_headers={"x-request-id": f"bomb-{i}"})
        error = refused.value.body
        assert isinstance(error, dict) and error["code"] == "answer_too_large" and "n=128" in error["message"]
    assert metric_value(sim.url, "vllm:generation_tokens_total") == generated
    rows = [ledger_records(gateway.url, ADMIN_TOKEN, request_id=f"bomb-{i}")[0] for i in range(6)]
    assert {(r["status"], r["worker"], r["completion_tokens"] or 0) for r in rows} == {(400, None, 0)}
    answer = client.chat.completions.create(**{**asked, "max_tokens": 16}, n=2,
                                            extra_headers={"x-request-id": "two"})
    (row,) = ledger_records(gateway.url, ADMIN_TOKEN, request_id="two")
    assert answer.usage is not None and row["completion_tokens"] == answer.usage.completion_tokens
    assert metric_value(sim.url, "vllm:generation_tokens_total") - generated == answer.usage.completion_tokens
