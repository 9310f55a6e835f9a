"""The simulated worker as a process: flags, faults, priority, the openai client."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from tests.conftest import ROOT, Proc, metric_value, wait_for

Starter = Callable[..., Proc]


@pytest.mark.parametrize("flags, message", [
    (["--max-num-seqs", "0"], "must be >= 1"),
    (["--port", "http"], "not a valid int"),
    (["--error-status", "200"], "between 400 and 599"),
    (["--error-rate", "1.5"], "<= 1"),
    (["--scheduling-policy", "lifo"], "invalid choice"),
    (["--max-num-seqs", "64", "--max-num-batched-tokens", "8"], "--max-num-batched-tokens must be >="),
    (["--max-logprobs", "-2"], "must be >= -1"),
])
def test_bad_flags_get_clear_errors(flags: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "workers.sim", *flags], cwd=ROOT, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_openai_client_against_the_sim(start_sim: Starter) -> None:
    sim = start_sim("--zero-delay")
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    answer = client.completions.create(model="sim-llama-8b", prompt="once upon a time", max_tokens=6)
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="sim-llama-8b", prompt="once upon a time", max_tokens=6, stream=True))
    assert streamed == answer.choices[0].text, "deterministic output for the same prompt and seed"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="sim-llama-8b", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=5, extra_body={"priority": 3})


def test_priority_is_accepted_under_the_priority_policy(start_sim: Starter) -> None:
    sim = start_sim("--zero-delay", "--scheduling-policy", "priority")
    response = httpx.post(sim.url + "/v1/completions",
                          json={"model": "sim-llama-8b", "prompt": "x", "max_tokens": 2, "priority": -3})
    assert response.status_code == 200


def test_fault_injection(start_sim: Starter) -> None:
    sim = start_sim("--zero-delay", "--slow-start", "30", ready="/v1/models")
    assert httpx.get(sim.url + "/health").status_code == 503
    httpx.post(sim.url + "/sim/faults", json={"slow_start": 0, "error_rate": 1.0, "error_statuses": [429]})
    assert httpx.get(sim.url + "/health").status_code == 200
    failed = httpx.post(sim.url + "/v1/completions", json={"model": "sim-llama-8b", "prompt": "x"})
    assert failed.status_code == 429 and failed.json()["error"]["code"] == 429
    assert metric_value(sim.url, "tollgate_sim_injected_errors_total", status="429") == 1
    bad = httpx.post(sim.url + "/sim/faults", json={"error_rate": 7})
    assert bad.status_code == 400 and "error_rate" in bad.json()["error"]["message"]

    httpx.post(sim.url + "/sim/faults", json={"error_rate": 0, "hang_after": 2})
    with pytest.raises(httpx.ReadTimeout), httpx.stream(
            "POST", sim.url + "/v1/completions", timeout=httpx.Timeout(5, read=1.0),
            json={"model": "sim-llama-8b", "prompt": "x", "max_tokens": 50, "stream": True}) as response:
        for _ in response.iter_raw():
            pass


def test_a_pooling_sim_serves_embeddings_only(start_sim: Starter) -> None:
    """`--runner pooling`, as vLLM's: the official client's embeddings (base64, decoded by the client) are unit
    vectors, the same for the same text; chat is refused as vLLM refuses it."""
    import math

    sim = start_sim("--runner", "pooling", "--model", "sim-embed")
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    one = client.embeddings.create(model="sim-embed", input=["same text", "other text", "same text"])
    vectors = [d.embedding for d in one.data]
    assert [len(v) for v in vectors] == [384] * 3 and vectors[0] == vectors[2] != vectors[1]
    assert abs(math.sqrt(sum(x * x for x in vectors[1])) - 1) < 1e-5
    assert one.usage.prompt_tokens == one.usage.total_tokens > 0
    floats = httpx.post(sim.url + "/v1/embeddings", json={"model": "sim-embed", "input": [5, 6, 7],
                                                          "encoding_format": "float", "dimensions": 8}).json()
    assert len(floats["data"][0]["embedding"]) == 8
    bad = httpx.post(sim.url + "/v1/embeddings", json={"model": "sim-embed", "input": [True]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="sim-embed", messages=[{"role": "user", "content": "hi"}])


def peak_rss_mb(proc: Proc) -> int:
    """The process's largest resident set so far (VmHWM), in MiB."""
    status = Path(f"/proc/{proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) // 1024


def test_health_answers_while_a_bomb_is_written_and_memory_stays_bounded(start_sim: Starter) -> None:
    """One request that asks for everything at once: n=64, 20 logprobs a token, a schema of ten million items and
    no max_tokens (the rest of a 1024-token context). Once the worker has it (its traceparent is recorded before
    any work), /health answers while the answer is made and written: nothing of the answer is read before, and it
    is tens of megabytes (more than any socket buffer holds), so the worker was still on it. The answer is what
    max_tokens allows, and the worker's memory grows by a little, not by the answer's size (before this was
    bounded, the schema alone took 9 GB and 38 CPU-seconds, and /health stopped answering)."""
    sim = start_sim("--zero-delay", "--max-model-len", "1024")
    before = peak_rss_mb(sim)
    body = {"model": "sim-llama-8b", "messages": [{"role": "user", "content": "List them"}], "n": 64,
            "logprobs": True, "top_logprobs": 20, "response_format": {"type": "json_schema", "json_schema": {
                "name": "many", "schema": {"type": "array", "minItems": 10_000_000}}}}
    traceparent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    healthy = threading.Event()
    got: dict[str, object] = {}

    def bomb() -> None:
        with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body, headers={"traceparent": traceparent},
                          timeout=300) as response:
            got["status"] = response.status_code
            healthy.wait(300)  # nothing of the answer is read until /health has answered
            got["body"] = response.read()

    sender = threading.Thread(target=bomb)
    sender.start()
    try:
        assert wait_for(lambda: traceparent in httpx.get(sim.url + "/sim/traceparents").json(), timeout=60)
        assert httpx.get(sim.url + "/health", timeout=60).status_code == 200
    finally:
        healthy.set()
        sender.join()
    assert got["status"] == 200 and isinstance(got["body"], bytes)
    assert len(got["body"]) > 32 << 20, "the answer was still being written when /health answered"
    answer = orjson.loads(got["body"])
    assert [c["finish_reason"] for c in answer["choices"]] == ["length"] * 64
    budget = 1024 - answer["usage"]["prompt_tokens"]
    assert answer["usage"]["completion_tokens"] == 64 * budget
    assert all(len(c["logprobs"]["content"]) == budget for c in answer["choices"])
    assert peak_rss_mb(sim) - before < 300, "a bounded part of the answer in memory, not the answer"


def test_vllms_limits_of_n_and_logprobs_are_set_as_vllm_sets_them(start_sim: Starter,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-logprobs, as vLLM's flag, and VLLM_MAX_N_SEQUENCES, as vLLM's environment variable."""
    monkeypatch.setenv("VLLM_MAX_N_SEQUENCES", "4")
    sim = start_sim("--zero-delay", "--max-logprobs", "2")

    def status(**extra: object) -> int:
        return httpx.post(sim.url + "/v1/chat/completions", json={
            "model": "sim-llama-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra},
                          timeout=30).status_code

    assert status(n=4, logprobs=True, top_logprobs=2) == 200
    assert status(n=5) == status(logprobs=True, top_logprobs=3) == status(prompt_logprobs=3) == 400
