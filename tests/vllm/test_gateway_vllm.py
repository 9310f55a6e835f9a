"""The gateway's streaming behaviour in front of a real vLLM server (CPU build)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.ops import diagnose
from tests.conftest import (
    ADMIN_TOKEN,
    DEMO_KEY,
    FINANCE_TOKEN,
    PREMIUM_KEY,
    Proc,
    ledger_records,
    metric_value,
    policy_dict,
    wait_for,
)

pytestmark = pytest.mark.vllm
MODEL = "tiny-llama"


@pytest.fixture
def gateway(vllm_server: Any, start_gateway: Callable[..., Proc]) -> Proc:
    return start_gateway(policy_dict([vllm_server.url], model=MODEL))


def test_openai_client_streams_through_the_gateway(gateway: Proc) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].choices == []
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                            max_tokens=4, extra_body={"ignore_eos": True})
    assert answer.usage is not None and answer.usage.completion_tokens == 4


def test_usage_chunk_stripped_but_accounted(gateway: Proc) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {DEMO_KEY}"}) as response:
        raw = response.read()
        assert "ttft;dur=" in response.headers["server-timing"]
    events = raw.split(b"\n\n")[:-1]
    assert events[-1] == b"data: [DONE]"
    assert not any(b'"usage"' in e for e in events)
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert wait_for(lambda: metric_value(gateway.url, "tollgate_tokens_total", direction="completion") >= 8)


def test_client_disconnect_stops_vllm(gateway: Proc, vllm_server: Any) -> None:
    """The gateway closes the upstream stream when its client leaves, so vLLM stops generating.

    Up to six attempts, one of which must abort: see test_conformance.test_abort_on_disconnect for the
    occasional late abort of vLLM 0.32 on this CPU. An attempt whose first byte came late says nothing: in one
    full-suite run every attempt's first byte took 2 s (against 25 ms alone), vLLM having generated all 1,900
    tokens before the gateway saw its response head, so there was nothing left to stop (vLLM's API server
    falling behind its engine: see workers.vllm.cpu.start_vllm_cpu).
    """
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1900, "stream": True,
            "ignore_eos": True}
    attempts: list[tuple[float, float]] = []  # (seconds to the first byte, tokens vLLM generated)
    for attempt in range(6):
        generated_before = metric_value(vllm_server.url, "vllm:generation_tokens_total")
        sent = time.monotonic()
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"authorization": f"Bearer {PREMIUM_KEY}",  # premium: not clamped
                                   "x-request-id": f"leaves-{attempt}"}) as response:
            assert next(response.iter_raw()).startswith(b"data: ")
            first_byte = time.monotonic() - sent
        # the running gauge and the token counter come from the same engine step's stats: once it reads 0, the
        # tokens the aborted request generated are counted. 1,900 tokens take 4-6 s here (28 s at the slowest
        # rate seen): a request that ran to the end would show them all
        assert wait_for(lambda: metric_value(vllm_server.url, "vllm:num_requests_running") == 0, timeout=60)
        attempts.append((first_byte, metric_value(vllm_server.url, "vllm:generation_tokens_total") - generated_before))
        if first_byte < 1.0 and attempts[-1][1] < 1000:
            break
    # on failure, say what the gateway saw of each attempt (a 499 with the tokens relayed, or an answer it thought
    # complete) and what vLLM logged about aborts: the two sides of a cut that did not reach the engine
    seen = [line for line in gateway.log.read_text(errors="replace").splitlines() if "leaves-" in line]
    aborts = [line for line in vllm_server.log_path.read_text(errors="replace").splitlines() if "bort" in line]
    assert any(first < 1.0 and generated < 1000 for first, generated in attempts), \
        f"vLLM went on generating after the client left: {attempts}; {seen}; {aborts[-6:]}"


def test_the_responses_api_through_the_gateway(gateway: Proc) -> None:
    """vLLM's own Responses API (its store on): a streamed answer counted exactly in the ledger, a follow-up
    continuing it by previous_response_id, and the stored answer read back by id."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    events = list(client.responses.create(model=MODEL, input="hello there", max_output_tokens=12, stream=True,
                                          extra_body={"ignore_eos": True}, extra_headers={"x-request-id": "rv-1"}))
    final = events[-1].response  # type: ignore[union-attr]
    assert events[0].type == "response.created" and final.usage is not None and final.usage.output_tokens == 12
    follow = client.responses.create(model=MODEL, input="and more", previous_response_id=final.id,
                                     max_output_tokens=3, extra_body={"ignore_eos": True})
    assert follow.usage is not None and follow.usage.input_tokens > final.usage.input_tokens, "it continued"
    assert client.responses.retrieve(follow.id).id == follow.id
    records = ledger_records(gateway.url, FINANCE_TOKEN, request_id="rv-1")
    assert (records[0]["prompt_tokens"], records[0]["completion_tokens"], records[0]["estimated"]) == (
        final.usage.input_tokens, 12, False)


def test_unbuffered_first_token(gateway: Proc) -> None:
    """The client holds content long before the stream ends: the gateway forwards as vLLM writes.

    Up to three attempts, one of which must stream: vLLM on this CPU itself holds about one answer in twenty
    until its last token (loadtest/RESULTS.md, "vLLM on this CPU streams"); a gateway that buffers fails every
    attempt. Counted by usage, not by events: vLLM merges tokens into one event when its API server falls behind."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 400, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    attempts: list[tuple[int, int, float]] = []  # (reads in the stream's first half, reads, seconds to the end)
    for _ in range(3):
        reads: list[tuple[float, bytes]] = []
        sent = time.monotonic()
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"authorization": f"Bearer {DEMO_KEY}"}) as response:
            for chunk in response.iter_raw():
                reads.append((time.monotonic() - sent, chunk))
        events = b"".join(chunk for _, chunk in reads).split(b"\n\n")[:-1]
        assert events[-1] == b"data: [DONE]"
        assert json.loads(events[-2].removeprefix(b"data: "))["usage"]["completion_tokens"] == 400
        ended = reads[-1][0]
        early = [at for at, chunk in reads if at < ended / 2 and b"data: " in chunk]
        attempts.append((len(early), len(reads), ended))
        if len(early) >= 10:
            break
    assert attempts[-1][0] >= 10, f"every stream arrived in a few late pieces: {attempts}"


def test_premium_goes_ahead_of_queued_batch_work(vllm_server: Any, start_gateway: Callable[..., Proc]) -> None:
    """Priority queues, scaled down to one CPU engine: batch lines queue in the gateway; premium does not wait for them.

    The engine shares two cores with the rest of the suite, so its /health can answer slowly: this gateway
    scrapes every second (a 2 s timeout) and needs five failed checks in a row to drop it, so a slow answer
    does not empty the pool (an earlier version failed inside the whole suite for that reason)."""
    import threading

    from loadtest.harness.client import parse_server_timing

    policy = policy_dict([vllm_server.url], model=MODEL, scrape_interval_s=1.0, unhealthy_after=5,
                         read_timeout_s=120.0)  # a 1,200-token line on a busy shared CPU can pass 10 s
    policy["pools"]["main"]["max_inflight_per_worker"] = 2  # with the default reserve, batch runs one at a time
    # the point is the order, not the deadline: give premium room to wait if the engine is slow to free a slot
    policy["scheduling"] = {"tiers": {"premium": {"max_queue_wait_ms": 10_000}}}
    # the engine is shared with earlier tests: start from an idle one (aborted generations can run on a while)
    assert wait_for(lambda: metric_value(vllm_server.url, "vllm:num_requests_running") == 0
                    and metric_value(vllm_server.url, "vllm:num_requests_waiting") == 0, timeout=90)
    gw = start_gateway(policy)
    batch_body = {"model": MODEL, "messages": [{"role": "user", "content": "write"}], "max_tokens": 1200,
                  "ignore_eos": True}
    batch: list[tuple[int, float]] = []  # (status, gateway queue wait in ms)

    client = httpx.Client(timeout=180, limits=httpx.Limits(max_connections=16))  # one pool: all at once

    def batch_line() -> None:
        reply = client.post(gw.url + "/v1/chat/completions", json=batch_body, headers={
            "authorization": f"Bearer {DEMO_KEY}", "x-tollgate-class": "batch"})
        batch.append((reply.status_code, parse_server_timing(reply.headers.get("server-timing", "")).get(
            "queue_wait", 0.0)))
    # once, in the suite, the first view of the queue came back only after all six lines had run (13 s, the lines
    # that fast): eight lines keep a queue longer, and the view's client is made once, before they start
    admin = httpx.Client(timeout=30, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    lines = [threading.Thread(target=batch_line, daemon=True) for _ in range(8)]
    for line in lines:
        line.start()
    try:
        # wait until a queue has formed (a line running, one waiting behind it), as the gateway's own queue view
        # says: vLLM holds both cores meanwhile, so its /metrics, the client's threads and even this view can
        # lag by seconds (the lines are not always in at once, and the view may come when a few are done)
        seen: list[object] = []

        def queue_formed() -> bool:
            main = admin.get(gw.url + "/admin/queues").json()["pools"].get("main", {})
            seen.append((main.get("granted"), main.get("classes", {}).get("batch", {}).get("depth"), len(batch)))
            return main.get("granted", 0) >= 1 and main.get("classes", {}).get("batch", {}).get("depth", 0) >= 1
        assert wait_for(queue_formed, timeout=60), seen
        premium = httpx.post(gw.url + "/v1/chat/completions", timeout=120,
                             headers={"authorization": f"Bearer {PREMIUM_KEY}"},
                             json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 8, "ignore_eos": True})
    finally:
        for line in lines:
            line.join(timeout=180)
        client.close()
        admin.close()
    assert premium.status_code == 200
    assert [status for status, _ in batch] == [200] * len(lines), "every batch line ran"
    premium_wait = parse_server_timing(premium.headers["server-timing"])["queue_wait"]
    waits = sorted(wait for _, wait in batch)
    assert waits[-1] > 1000 and waits[-1] > 2 * waits[1], ("the batch lines queued one behind another", waits)
    assert premium_wait < waits[-1] / 2, ("premium went ahead of the queued batch lines", premium_wait, waits)


def test_diagnose_against_real_vllm_gives_every_check_a_reading(gateway: Proc, vllm_server: Any) -> None:
    """Every check reports a figure or says it could not measure; none prints 'nan' (the tiny model's short
    answers can decode to no text, which left the crowding check with nothing to time)."""
    report = asyncio.run(diagnose.run(gateway.url, DEMO_KEY, MODEL, vllm_server.url))
    checks = {f.check for f in report.findings}
    assert {"proxy overhead", "buffering", "long prompts crowd short ones", "upstream keep-alive",
            "gateway event-loop lag", "worker queue"} <= checks, checks
    assert not re.search(r"\bnan\b", report.text(), re.IGNORECASE), report.text()


@pytest.fixture(scope="module")
def vllm_embedder(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real vLLM CPU server of an embedding model: the tiny Llama run as a pooling model (vLLM converts it
    with --runner pooling --convert embed; ~50 s to start)."""
    from workers.vllm.cpu import start_vllm_cpu

    server = start_vllm_cpu(model_dir=tiny_model, served_name="tiny-embed", max_model_len=512,
                            extra_args=["--runner", "pooling", "--convert", "embed"],
                            log_path=tmp_path_factory.mktemp("vllm-embed") / "vllm.log")
    yield server
    server.stop()


def test_embeddings_from_a_real_vllm_embedding_model(vllm_embedder: Any, start_gateway: Callable[..., Proc]) -> None:
    """The official client's embeddings through the gateway from vLLM's own pooling runner: the vectors vLLM
    computes (the client asks for base64 and decodes it), vLLM's token count in the usage and in the ledger,
    priced; a chat request to the embedding model is refused by the gateway, not sent."""
    policy = policy_dict([vllm_embedder.url], model="tiny-embed")
    policy["models"]["tiny-embed"]["kind"] = policy["models"]["other-model"]["kind"] = "embed"
    gw = start_gateway(policy)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    texts = ["The invoice is overdue.", "Where is my parcel?"]
    direct = httpx.post(vllm_embedder.url + "/v1/embeddings", json={"model": "tiny-embed", "input": texts},
                        timeout=60).json()
    answer = client.embeddings.create(model="tiny-embed", input=texts, extra_headers={"x-request-id": "vllm-embed"})
    assert [len(d.embedding) for d in answer.data] == [len(d["embedding"]) for d in direct["data"]]
    for got, want in zip(answer.data, direct["data"], strict=True):
        assert got.embedding == pytest.approx(want["embedding"], rel=1e-4, abs=1e-6)
    assert answer.usage.prompt_tokens == direct["usage"]["prompt_tokens"] > 0
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "model_not_supported"
    [record] = ledger_records(gw.url, FINANCE_TOKEN, request_id="vllm-embed")
    assert (record["endpoint"], record["prompt_tokens"], record["completion_tokens"]) == (
        "embeddings", answer.usage.prompt_tokens, 0)
    assert float(record["cost_usd"]) > 0  # type: ignore[arg-type]
