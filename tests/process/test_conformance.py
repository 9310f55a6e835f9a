"""The same assertions against the simulator and against real vLLM on the CPU.

Where they disagree, the simulator is what gets fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Proc, metric_value, wait_for

MODEL = "tiny-llama"
MAX_LEN = 2048
JSON = {"content-type": "application/json"}


@pytest.fixture(params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)])
def backend(request: pytest.FixtureRequest, start_sim: Callable[..., Proc]) -> Iterator[str]:
    if request.param == "sim":
        yield start_sim("--max-model-len", str(MAX_LEN), "--decode-base-ms", "5", model=MODEL).url
    else:
        yield request.getfixturevalue("vllm_server").url


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "say something about the cache"}],
            "ignore_eos": True, **extra}


def sse_events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n"), "an SSE stream ends with a blank line"
    events = raw.split(b"\n\n")[:-1]
    assert all(e.startswith(b"data: ") for e in events), "every event is a single data: line"
    return [e[len(b"data: "):] for e in events]


def test_endpoints(backend: str) -> None:
    assert httpx.get(backend + "/health").status_code == 200
    models = httpx.get(backend + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == MAX_LEN

    chat = httpx.post(backend + "/v1/chat/completions", json=chat_body(max_tokens=7)).json()
    assert chat["object"] == "chat.completion"
    assert chat["id"].startswith("chatcmpl-")
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 7
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 7

    completion = httpx.post(backend + "/v1/completions",
                            json={"model": MODEL, "prompt": "the queue", "max_tokens": 4, "ignore_eos": True}).json()
    assert completion["object"] == "text_completion"
    assert isinstance(completion["choices"][0]["text"], str)
    assert completion["usage"]["completion_tokens"] == 4

    tokens = httpx.post(backend + "/tokenize", json={"model": MODEL, "prompt": "hello world"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert tokens["max_model_len"] == MAX_LEN


def test_openai_client_stream_and_non_stream(backend: str) -> None:
    client = openai.OpenAI(base_url=backend + "/v1", api_key="unused")
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=5, extra_body={"ignore_eos": True})
    assert answer.usage is not None and answer.usage.completion_tokens == 5
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].choices == []
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)


@pytest.mark.parametrize("include_usage", [True, False])
def test_sse_framing_and_usage_chunk(backend: str, include_usage: bool) -> None:
    body = chat_body(max_tokens=6, stream=True)
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", backend + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read()
    events = sse_events(raw)
    assert events[-1] == b"[DONE]"
    import json
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finishing] == ["length"]
    usage_chunks = [c for c in chunks if c.get("usage")]
    if include_usage:
        assert usage_chunks == [chunks[-1]], "usage comes once, last, before [DONE]"
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == 6
    else:
        assert usage_chunks == []


def test_completion_stream_shape(backend: str) -> None:
    body = {"model": MODEL, "prompt": "the worker", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", backend + "/v1/completions", json=body) as response:
        raw = response.read()
    events = sse_events(raw)
    assert events[-1] == b"[DONE]"
    import json
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and "text" in c["choices"][0] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def _assert_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["code"] == status
    assert error["message"]
    return error


def test_error_shapes(backend: str) -> None:
    too_long = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 5}
    error = _assert_error(httpx.post(backend + "/v1/chat/completions", json=too_long), 400)
    assert error["type"] == "BadRequestError"
    assert f"maximum context length is {MAX_LEN}" in error["message"]

    too_many = chat_body(max_tokens=MAX_LEN + 100)
    error = _assert_error(httpx.post(backend + "/v1/chat/completions", json=too_many), 400)
    assert error["param"] == "max_tokens"

    unknown = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    error = _assert_error(httpx.post(backend + "/v1/chat/completions", json=unknown), 404)
    assert error["type"] == "NotFoundError"
    assert "no-such-model" in error["message"]

    wrong_type = httpx.post(backend + "/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
    _assert_error(wrong_type, 400)


METRIC_NAMES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
]


def test_metric_names(backend: str) -> None:
    httpx.post(backend + "/v1/chat/completions", json=chat_body(max_tokens=3))
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(backend + "/metrics").text
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    for name in METRIC_NAMES:
        assert name in samples, name
        assert samples[name].labels.get("model_name") == MODEL
    assert metric_value(backend, "vllm:request_success_total", finished_reason="length") >= 1


def _disconnect_after_first_chunk(backend: str) -> float:
    """Stream 1,900 tokens, leave after the first chunk; return how many tokens the worker generated."""
    # the token counter is the engine's, not the request's: an earlier test's request still running would count
    assert wait_for(lambda: metric_value(backend, "vllm:num_requests_running") == 0
                    and metric_value(backend, "vllm:num_requests_waiting") == 0, timeout=60)
    generated_before = metric_value(backend, "vllm:generation_tokens_total")
    with httpx.Client(timeout=30) as client, client.stream("POST", backend + "/v1/chat/completions",
                                                           json=chat_body(max_tokens=1900, stream=True)) as response:
        first = next(response.iter_raw())
    assert first.startswith(b"data: ")
    # the running gauge and the token counter come from the same engine step's stats: once it reads 0, the
    # tokens the aborted request generated are counted (a run to the end at vLLM's slowest here, ~70 tokens/s,
    # would take 28 s)
    assert wait_for(lambda: metric_value(backend, "vllm:num_requests_running") == 0, timeout=60)
    return metric_value(backend, "vllm:generation_tokens_total") - generated_before


def test_abort_on_disconnect(backend: str) -> None:
    """Leaving mid-stream makes the worker stop generating at once.

    1,900 tokens take 4-6 s on real vLLM here and ~10 s on the sim, so a request that ran to the end shows
    them all. Real vLLM 0.32 on this CPU occasionally notices a disconnect late (after more than a second
    of generating; seen in 3 of ~11 CI-like runs, never in 6 tries by hand): up to three attempts, of which
    one must stop at once.
    """
    finished_before = metric_value(backend, "vllm:request_success_total")
    attempts = []
    for _ in range(3):
        attempts.append(_disconnect_after_first_chunk(backend))
        if attempts[-1] < 1000:
            break
    assert attempts[-1] < 1000, f"the worker went on generating after the client left: {attempts}"
    # an abort is not a success; only an attempt that generated every token may have completed
    may_have_completed = sum(1 for generated in attempts if generated >= 1900)
    assert finished_before <= metric_value(backend, "vllm:request_success_total") <= (
        finished_before + may_have_completed), "an abort is not a success"
