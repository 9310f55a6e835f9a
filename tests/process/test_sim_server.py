"""The simulated worker as a process: flags, faults, priority, the openai client."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.conftest import ROOT, Proc, metric_value

Starter = Callable[..., Proc]


@pytest.mark.parametrize("flags, message", [
    (["--max-num-seqs", "0"], "must be >= 1"),
    (["--port", "http"], "not a valid int"),
    (["--error-status", "200"], "between 400 and 599"),
    (["--error-rate", "1.5"], "<= 1"),
    (["--scheduling-policy", "lifo"], "invalid choice"),
    (["--max-num-seqs", "64", "--max-num-batched-tokens", "8"], "--max-num-batched-tokens must be >="),
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
