"""The pipeline steps in-process: a Gateway object, scripted workers on loopback, answers into a BufferSink."""

from __future__ import annotations

import asyncio
import socket

import orjson

from gateway import pipeline, sse
from gateway.context import RequestContext
from gateway.endpoints import CHAT, RESPONSES
from gateway.errors import UpstreamFailed
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from gateway.runtime import Gateway
from gateway.sink import BufferSink
from tests.conftest import policy_dict
from tests.fakes import (
    MODEL,
    FakeWorker,
    call,
    chat,
    completion_json,
    inflight,
    json_of,
    live_worker,
    running_gateway,
    stream_of,
)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def events(sink: BufferSink) -> list[bytes]:
    return list(sse.payloads(sink.body))


def test_non_streaming_answer_is_relayed_with_usage_and_stages() -> None:
    async def main() -> None:
        async with FakeWorker(json_of(completion_json(prompt=11, completion=3))) as w, running_gateway([w.url]) as gw:
            ctx, sink = await call(gw, chat())
            assert sink.status == 200 and orjson.loads(sink.body)["choices"][0]["message"]["content"] == "hi there"
            assert (ctx.prompt_tokens, ctx.completion_tokens, ctx.error) == (11, 3, None)
            assert ctx.worker == w.url and ctx.attempts == 1
            assert ctx.timings.upstream_connect is not None and ctx.timings.ttft is not None
            assert sink.header(b"x-tollgate-max-tokens") == b"requested; value=8"
            timing = dict(part.split(";dur=") for part in (sink.header(b"server-timing") or b"").decode().split(", "))
            assert float(timing["ttft"]) <= float(timing["total"]), "a whole answer's headers carry its total"
            assert ctx.timings.total is not None and float(timing["total"]) <= ctx.timings.total * 1000
            assert inflight(gw) == 0
    asyncio.run(main())


def test_stream_is_forwarded_and_usage_stripped_unless_asked() -> None:
    async def main() -> None:
        async with FakeWorker(stream_of(["a", "b", "c"], prompt=5)) as w, running_gateway([w.url]) as gw:
            ctx, sink = await call(gw, chat(stream=True))
            got = events(sink)
            assert got[-1] == sse.DONE and len(got) == 4, "three tokens and [DONE]; the usage event is stripped"
            assert (ctx.prompt_tokens, ctx.completion_tokens) == (5, 3), "usage read even when stripped"
            assert w.requests[-1]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}, \
                "the gateway always asks for usage, on every chunk"
            ctx, sink = await call(gw, chat(stream=True, stream_options={"include_usage": True}))
            assert orjson.loads(events(sink)[-2])["usage"]["completion_tokens"] == 3
            assert ctx.timings.tpot is not None and inflight(gw) == 0
    asyncio.run(main())


def test_continuous_usage_is_read_on_every_chunk_and_shown_only_if_asked() -> None:
    """vLLM's per-chunk usage lets a cut stream be counted exactly; a client that did not ask never sees it."""
    async def main() -> None:
        async with FakeWorker(stream_of(["a", "b", "c", "d"], prompt=9, continuous=True)) as w, \
                FakeWorker(stream_of(["a", "b", "c", "d"], prompt=9, continuous=True, break_after=2)) as cut, \
                running_gateway([w.url]) as gw, running_gateway([cut.url]) as gw_cut:
            ctx, sink = await call(gw, chat(stream=True))
            assert b'"usage"' not in sink.body and len(events(sink)) == 5
            assert (ctx.prompt_tokens, ctx.completion_tokens, ctx.cached_tokens) == (9, 4, 2)
            assert not ctx.usage_estimated

            ctx, sink = await call(gw, chat(stream=True, stream_options={"include_usage": True}))
            got = [orjson.loads(e) for e in events(sink)[:-1]]
            assert [("usage" in e) for e in got] == [False] * 4 + [True], "only the final usage event"

            options = {"include_usage": True, "continuous_usage_stats": True}
            ctx, sink = await call(gw, chat(stream=True, stream_options=options))
            got = [orjson.loads(e) for e in events(sink)[:-1]]
            assert [e["usage"]["completion_tokens"] for e in got] == [1, 2, 3, 4, 4], "asked for: kept"

            ctx, sink = await call(gw_cut, chat(stream=True))
            assert ctx.error is not None
            assert (ctx.prompt_tokens, ctx.completion_tokens, ctx.usage_estimated) == (9, 2, False), \
                "a stream cut after two tokens counts the prompt and two tokens, from the last chunk's usage"
    asyncio.run(main())


def test_a_cut_stream_without_usage_counts_its_token_events_as_an_estimate() -> None:
    async def main() -> None:
        async with FakeWorker(stream_of(["a", "b", "c", "d"], break_after=3)) as w, running_gateway([w.url]) as gw:
            ctx, _ = await call(gw, chat(stream=True))
            size = len(orjson.dumps(chat(stream=True)))
            assert (ctx.prompt_tokens, ctx.completion_tokens, ctx.usage_estimated) == (size // 4, 3, True), \
                "the prompt estimated from the body (4 bytes a token), the completion from the events relayed"
    asyncio.run(main())


def test_retry_before_first_byte_on_another_worker() -> None:
    async def main() -> None:
        async with FakeWorker(json_of({"error": "overloaded"}, status=503)) as bad, \
                FakeWorker(json_of(completion_json())) as good, running_gateway([bad.url, good.url]) as gw:
            for _ in range(4):  # whichever worker is picked first, the answer comes from the good one
                ctx, sink = await call(gw, chat())
                assert sink.status == 200 and ctx.worker == good.url
            assert len(bad.requests) == 1, "the 503 cooled the bad worker down: it gets no second request"
            assert ctx.attempts == 1 and inflight(gw) == 0
    asyncio.run(main())


def test_connect_error_is_retried_and_cools_the_worker_down() -> None:
    async def main() -> None:
        # scrape_interval_s=10: no scrape during the test, only requests find the dead worker out
        async with FakeWorker(json_of(completion_json())) as good, \
                running_gateway([good.url], scrape_interval_s=10) as gw:
            workers = gw.upstreams.pools["main"].workers
            dead = live_worker(closed_port_url(), "main")
            workers[0].observed.kv_usage = 0.5  # the dead worker looks less loaded: it is picked first
            workers.insert(0, dead)
            answers = [await call(gw, chat()) for _ in range(3)]
            assert all(sink.status == 200 and ctx.worker == good.url for ctx, sink in answers)
            assert not dead.observed.healthy and "ConnectFailed" in (dead.observed.last_error or "")
            assert answers[0][0].attempts == 2 and inflight(gw) == 0
    asyncio.run(main())


def test_every_worker_failing_is_a_502_that_names_nothing_internal() -> None:
    async def main() -> None:
        async with FakeWorker(json_of({"detail": "boom at 10.0.0.7:8000"}, status=503)) as w, \
                running_gateway([w.url]) as gw:
            ctx, sink = await call(gw, chat())
            assert sink.status == 502
            error = orjson.loads(sink.body)["error"]
            assert error["code"] == "upstream_broken" and set(error) == {"message", "type", "param", "code"}
            assert "127.0.0.1" not in error["message"] and "10.0.0.7" not in error["message"]
            assert ctx.error == "upstream_broken" and ctx.worker == w.url, "the worker stays in the log line"
            ctx, sink = await call(gw, chat())  # the worker is cooling down now: nothing to send to
            assert sink.status == 503 and orjson.loads(sink.body)["error"]["code"] == "upstream_unavailable"
            assert inflight(gw) == 0
    asyncio.run(main())


def test_a_workers_4xx_becomes_the_gateways_own_error() -> None:
    async def main() -> None:
        complaint = {"error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}}
        async with FakeWorker(json_of(complaint, status=400)) as w, running_gateway([w.url]) as gw:
            ctx, sink = await call(gw, chat())
            assert sink.status == 400
            assert orjson.loads(sink.body)["error"] == {"message": "too long", "type": "invalid_request_error",
                                                        "param": None, "code": "upstream_400"}
            assert ctx.error == "upstream_400" and inflight(gw) == 0
            worker = gw.upstreams.pools["main"].workers[0]
            assert worker.observed.healthy, "a 4xx is the request's fault, not the worker's"
    asyncio.run(main())


def test_mid_stream_failure_ends_the_stream_with_an_error_event() -> None:
    async def main() -> None:
        async with FakeWorker(stream_of(["a", "b", "c", "d"], break_after=2)) as w, running_gateway([w.url]) as gw:
            ctx, sink = await call(gw, chat(stream=True))
            got = events(sink)
            assert sink.status == 200 and sink.complete
            assert got[-1] == sse.DONE and orjson.loads(got[-2])["error"]["code"] == "upstream_stream_broken"
            assert [orjson.loads(e)["choices"][0]["delta"]["content"] for e in got[:2]] == ["a", "b"]
            assert ctx.error == "upstream_stream_broken" and inflight(gw) == 0
    asyncio.run(main())


def test_a_cancelled_request_gives_its_lease_back_and_drops_the_upstream() -> None:
    """What the disconnect watch does to the pipeline when a client leaves, for streams and plain answers."""
    async def main() -> None:
        slow_stream = stream_of(["x"] * 200, gap_s=0.01)
        async with FakeWorker(slow_stream) as s, FakeWorker(json_of(completion_json(), delay_s=5)) as j:
            for worker, stream in ((s, True), (j, False)):
                async with running_gateway([worker.url]) as gw:
                    task = asyncio.create_task(call(gw, chat(stream=stream)))
                    for _ in range(100):
                        await asyncio.sleep(0.02)
                        if inflight(gw):
                            break
                    assert inflight(gw) == 1
                    for _ in range(100):  # until the worker's handler has the request: it is answering now
                        if worker.requests:
                            break
                        await asyncio.sleep(0.02)
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    assert inflight(gw) == 0, f"lease leaked (stream={stream})"
                    for _ in range(100):
                        if worker.disconnects:
                            break
                        await asyncio.sleep(0.02)
                    assert worker.disconnects == 1, "the worker saw the connection close (vLLM aborts then)"
    asyncio.run(main())


def test_client_errors_are_4xx_in_the_openai_shape() -> None:
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as w, running_gateway([w.url]) as gw:
            deep = b"[" * 300 + b"1" + b"]" * 300  # orjson reads 1,024 levels but writes only 255
            ctx, sink = await call(gw, orjson.dumps(chat())[:-1] + b',"metadata_blob":' + deep + b"}")
            assert sink.status == 400 and ctx.error == "invalid_json"
            ctx, sink = await call(gw, {**chat(), "model": "m" * 10_000})
            assert sink.status == 404 and ctx.model is None
            assert len(orjson.loads(sink.body)["error"]["message"]) < 200, "a client's value is echoed cut short"
            ctx, sink = await call(gw, chat(temperature=7))
            assert sink.status == 400 and orjson.loads(sink.body)["error"]["param"] == "temperature"
            assert w.requests == [] and inflight(gw) == 0
    asyncio.run(main())


def test_fail_after_the_answer_started_only_records() -> None:
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as w, running_gateway([w.url]) as gw:
            ctx = RequestContext("r", gw.store.current, CHAT)
            sink = BufferSink()
            await sink.start(200, [])
            await sink.send(b"{}")
            await pipeline.fail(ctx, sink, UpstreamFailed("head", "late"))
            assert sink.status == 200 and sink.body == b"{}" and ctx.error == "upstream_broken"
            assert sink.error is not None and sink.error.code == "upstream_broken"
    asyncio.run(main())


def test_an_unexpected_exception_ends_as_a_500_and_is_still_accounted() -> None:
    """The lifecycle answers what no step expected with a 500 and closes the request like any other."""
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as w, running_gateway([w.url]) as gw:
            ctx = RequestContext("r", gw.store.current, CHAT)
            ctx.tenant = gw.store.current.tenants["demo"]
            sink = BufferSink()
            async with pipeline.Lifecycle(gw, ctx, sink):
                raise KeyError("a bug")
            assert sink.status == 500 and ctx.status == 500 and ctx.error == "internal_error"
            assert ctx.timings.total is not None, "the finish observers closed it"
            assert orjson.loads(sink.body)["error"]["type"] == "server_error"
    asyncio.run(main())


def test_a_worker_that_goes_silent_times_out_and_gives_the_lease_back() -> None:
    async def main() -> None:
        silent = stream_of(["a", "b"] + ["c"] * 50, gap_s=2.0)  # 2 s between tokens; the pool allows 0.5 s
        async with FakeWorker(json_of(completion_json(), delay_s=3)) as j, FakeWorker(silent) as s:
            for worker, stream, code in ((j, False, "upstream_broken"), (s, True, "upstream_stream_broken")):
                async with running_gateway([worker.url], read_timeout_s=0.5) as gw:
                    ctx, sink = await call(gw, chat(stream=stream))
                    assert ctx.error == code and inflight(gw) == 0
                    if stream:
                        assert sink.status == 200 and orjson.loads(events(sink)[-2])["error"]["code"] == code
                    else:
                        assert sink.status == 502
    asyncio.run(main())


def test_bodies_the_worker_cannot_be_sent_are_a_400_before_admission_and_hold_no_slot() -> None:
    """A text part that is not a string, or JSON nested past what can be written back, is the client's error, found
    before the scheduler grants a slot: a dozen of them leave the pool as idle as it was, and the next request of
    another tenant is served."""
    deep = b'{"model":"sim-llama-8b","messages":[{"role":"user","content":"hi","x":' + b"[" * 300 + b"]" * 300 + b"}]}"

    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as w, running_gateway([w.url]) as gw:
            for _ in range(6):
                ctx, sink = await call(gw, chat(messages=[{"role": "user", "content": [
                    {"type": "text", "text": {"not": "a string"}}]}]))
                assert (sink.status, ctx.error) == (400, "invalid_value"), sink.body
                assert b"messages[0].content[0].text" in sink.body
                ctx, sink = await call(gw, deep)
                assert (sink.status, ctx.error) == (400, "invalid_json"), sink.body
            queues = gw.scheduler.snapshot(gw.upstreams.pools).values()
            assert all(not pool["granted_by_tenant"] for pool in queues), "no slot kept by a refused body"
            assert w.requests == [], "nothing reached the worker"
            ctx, sink = await call(gw, {"model": MODEL, "input": [{"role": "user", "content": [
                {"type": "input_text", "text": 5}]}]}, endpoint=RESPONSES)
            assert (sink.status, ctx.error) == (400, "invalid_value") and b"input[0].content[0].text" in sink.body
            ctx, sink = await call(gw, chat(), tenant="prem")
            assert sink.status == 200 and inflight(gw) == 0
    asyncio.run(main())


def test_the_worker_gets_the_tenants_cache_salt_never_the_clients() -> None:
    """Each tenant's requests reach the engine under one cache_salt of its own; a client's salt, even another
    tenant's, is folded into its tenant's (it narrows the sharing, it cannot join another's)."""
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as w, running_gateway([w.url]) as gw:
            for tenant in ("demo", "prem", "demo"):
                _, sink = await call(gw, chat(), tenant=tenant)
                assert sink.status == 200
            demo, prem, again = (r["cache_salt"] for r in w.requests)
            assert demo == again and demo != prem
            _, sink = await call(gw, chat(cache_salt=demo), tenant="prem")
            assert sink.status == 200 and w.requests[-1]["cache_salt"] not in (demo, prem)
            ctx, sink = await call(gw, chat(cache_salt=""), tenant="prem")
            assert (sink.status, ctx.error) == (400, "invalid_value") and len(w.requests) == 4
    asyncio.run(main())


def test_an_answer_names_the_policys_model_never_the_name_its_workers_serve() -> None:
    """A model served under another name upstream (``upstream_model``) is named as the client asked for it, whole
    and streamed, with the text untouched; a model served under its own name passes as the worker wrote it."""
    async def main() -> None:
        body = completion_json(text='say "model":"sim-llama-8b" here')
        async with FakeWorker(json_of(body)) as whole, FakeWorker(stream_of(["a", "b"])) as streamed:
            for worker, stream in ((whole, False), (streamed, True)):
                policy = policy_dict([worker.url])
                policy["models"]["public-name"] = {"pool": "main", "upstream_model": MODEL}
                gw = Gateway(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")))
                async with gw.lifespan():
                    _, sink = await call(gw, chat(stream=stream, model="public-name"))
                    assert worker.requests[-1]["model"] == MODEL, "the worker is asked by its own name"
                    _, own_sink = await call(gw, chat(stream=stream))
                if stream:
                    shown = [orjson.loads(e)["model"] for e in events(sink) if e != sse.DONE]
                    assert shown and set(shown) == {"public-name"}, shown
                    assert {orjson.loads(e)["model"] for e in events(own_sink) if e != sse.DONE} == {MODEL}
                else:
                    answer = orjson.loads(sink.body)
                    assert answer["model"] == "public-name"
                    assert answer["choices"][0]["message"]["content"] == body["choices"][0]["message"]["content"]
                    assert orjson.loads(own_sink.body)["model"] == MODEL
    asyncio.run(main())
