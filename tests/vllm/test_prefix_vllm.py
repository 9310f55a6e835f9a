"""Prefix-cache affinity in front of two real vLLM CPU engines, read from vLLM's own prefix-cache counters.

Each engine's KV cache holds about two of four tenants' system prompts (24 blocks of 32 tokens; a prompt is
about ten). Sent in turn, every engine sees all four and evicts each in turn (an LRU of two among four
prompts hits about half the time); routed by prefix, each engine keeps two and hits on nearly every prompt.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import DEMO_KEY, PREMIUM_KEY, Proc, metric_value, policy_dict, wait_for

pytestmark = pytest.mark.vllm
MODEL = "tiny-llama"
# 24 blocks of 32 tokens (the CPU backend's block size is a multiple of 32); two sequences of 384 tokens fit
ENGINE_ARGS = ["--block-size", "32", "--num-gpu-blocks-override", "24", "--max-num-seqs", "2"]
MAX_MODEL_LEN = 384
REQUESTS = 80


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[list[Any]]:
    """Two engines with small KV caches, each pinned to its own core, started side by side."""
    from workers.vllm.cpu import start_vllm_cpu

    logs = tmp_path_factory.mktemp("vllm-prefix")
    with ThreadPoolExecutor(2) as pool:
        starting = [pool.submit(start_vllm_cpu, model_dir=tiny_model, max_model_len=MAX_MODEL_LEN,
                                extra_args=ENGINE_ARGS, log_path=logs / f"engine{i}.log", cpus=str(i))
                    for i in range(2)]
        servers = []
        try:
            for future in starting:
                servers.append(future.result())
        finally:
            if len(servers) < 2:
                for server in servers:
                    server.stop()
    yield servers
    for server in servers:
        server.stop()


def _hit_rate(engines: list[Any], send: Callable[[], None]) -> float:
    """vLLM's prefix-cache hits over queries (in tokens), summed over both engines, for what ``send`` sends."""
    def totals() -> tuple[float, float]:
        return (sum(metric_value(e.url, "vllm:prefix_cache_hits_total") for e in engines),
                sum(metric_value(e.url, "vllm:prefix_cache_queries_total") for e in engines))
    hits_before, queries_before = totals()
    send()
    hits, queries = totals()
    assert queries - queries_before > REQUESTS * 200, "every prompt reached an engine"
    return (hits - hits_before) / (queries - queries_before)


def _workload(seed: int) -> list[dict[str, Any]]:
    """Four tenants' ~320-token system prompts, each followed by a short question, in a seeded random order."""
    from workers.sim.tokenizer import WORDS

    words = list(WORDS)
    rng = random.Random(seed)
    systems = [f"You are tenant {seed}-{t}'s assistant. " + " ".join(rng.choice(words) for _ in range(300))
               for t in range(4)]
    return [{"model": MODEL, "max_tokens": 2, "ignore_eos": True,
             "messages": [{"role": "system", "content": rng.choice(systems)},
                          {"role": "user", "content": " ".join(rng.choice(words) for _ in range(4)) + "?"}]}
            for _ in range(REQUESTS)]


def _send(gateway: Proc, bodies: list[dict[str, Any]]) -> Callable[[], None]:
    def send() -> None:
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer {DEMO_KEY}"}) as client:
            def one(body: dict[str, Any]) -> int:
                return client.post(gateway.url + "/v1/chat/completions", json=body).status_code
            with ThreadPoolExecutor(2) as pool:
                statuses = list(pool.map(one, bodies))
        assert statuses == [200] * len(bodies), [s for s in statuses if s != 200][:3]
    return send


def test_prefix_routing_keeps_each_prompt_where_it_is_cached(engines: list[Any],
                                                             start_gateway: Callable[..., Proc]) -> None:
    """vLLM's own prefix-cache hit rate through the gateway is at least 1.5x that of round-robin (each run with
    prompts of its own, so neither inherits the other's cache)."""
    urls = [e.url for e in engines]
    by_prefix = start_gateway(policy_dict(urls, model=MODEL, routing="prefix"))
    in_turn = start_gateway(policy_dict(urls, model=MODEL, routing="round_robin"))
    round_robin = _hit_rate(engines, _send(in_turn, _workload(1)))
    prefix = _hit_rate(engines, _send(by_prefix, _workload(2)))
    print(f"vLLM prefix-cache hit rate: prefix routing {prefix:.2f}, round robin {round_robin:.2f}")
    assert prefix >= 1.5 * round_robin, (prefix, round_robin)
    assert prefix >= 0.7, prefix


def test_vllm_says_when_its_prefix_cache_is_new(engines: list[Any]) -> None:
    """The prefix index forgets a worker whose engine restarted: vLLM's prefix_cache_queries counter and its
    creation time (the _created sample) are what the scraper reads for it."""
    from gateway.fleet.observe import parse_load

    for engine in engines:
        load = parse_load(httpx.get(engine.url + "/metrics").content)
        assert load["prefix_created"] > 1.7e9 and "prefix_queries" in load, load


def test_two_tenants_identical_prompts_share_no_prefix_cache_hits(engines: list[Any],
                                                                   start_gateway: Callable[..., Proc]) -> None:
    """Through the gateway, a prompt that another tenant has just sent finds nothing in vLLM's prefix cache (each
    tenant's cache_salt is its own), while the same tenant's next question on it does: vLLM's own counters."""
    from workers.sim.tokenizer import WORDS

    engine = engines[0]
    gateway = start_gateway(policy_dict([engine.url], model=MODEL))
    rng = random.Random(26)
    system = "You are the shared desk's assistant. " + " ".join(rng.choice(list(WORDS)) for _ in range(250))

    def hits(key: str, question: str) -> float:
        """The prefix-cache hits, in tokens, that one request of ``key``'s tenant made on the engine."""
        def counted(name: str) -> float:
            return metric_value(engine.url, f"vllm:prefix_cache_{name}_total")
        hits_before, queries_before = counted("hits"), counted("queries")
        response = httpx.post(gateway.url + "/v1/chat/completions", timeout=60,
                              headers={"authorization": f"Bearer {key}"},
                              json={"model": MODEL, "max_tokens": 2, "ignore_eos": True,
                                    "messages": [{"role": "system", "content": system},
                                                 {"role": "user", "content": question}]})
        assert response.status_code == 200, response.text
        prompt = response.json()["usage"]["prompt_tokens"]
        assert wait_for(lambda: counted("queries") >= queries_before + prompt), "the engine counted the prompt"
        return counted("hits") - hits_before

    assert hits(DEMO_KEY, "What is the first rule?") == 0
    assert hits(PREMIUM_KEY, "What is the first rule?") == 0, "another tenant's identical prompt is not cached"
    assert hits(DEMO_KEY, "And the second one?") >= 4 * 32, "the tenant's own system prompt is"
