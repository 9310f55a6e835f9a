"""Tenants apart in the engine's prefix cache, over loopback: a simulated worker with vLLM's prefix caching (its
``cache_salt`` honoured as vLLM does) behind gateway processes. What one tenant sent never makes another's
prompt faster (prompt_tokens_details.cached_tokens in the usage); a tenant's own prompts still hit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.auth import hash_key
from tests.conftest import DEMO_KEY, PREMIUM_KEY, Proc, on_shared_state, policy_dict

SHARED_KEYS = ("tg-test-shared-one", "tg-test-shared-two")
MODEL = "sim-llama-8b"


def system_prompt(name: str) -> str:
    """About 200 tokens: a dozen of the simulator's 16-token blocks."""
    return f"You are the assistant of {name}. " + " ".join(f"rule {i} of {name} is to be brief." for i in range(30))


def with_shared_tenants(policy: dict[str, Any]) -> dict[str, Any]:
    for i, key in enumerate(SHARED_KEYS):
        policy["tenants"][f"shared{i}"] = {"tier": "standard", "keys": ["sha256:" + hash_key(key)],
                                           "prefix_cache": "shared"}
    return policy


def cached(url: str, key: str | None, system: str, question: str, **extra: Any) -> int:
    """The prompt tokens the engine's prefix cache served for one chat request."""
    body = {"model": MODEL, "max_tokens": 2, **extra,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 160
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def salt_of(data_dir: Path, tenant: str) -> str:
    """A tenant's salt as the gateway on ``data_dir`` derives it (checked against the engine by the caller)."""
    from gateway.state.secret import Secret

    secret = Secret()
    secret.load(data_dir)
    return secret.derive(b"cache_salt", orjson.dumps([tenant, None])).hex()


def test_one_tenants_prompts_never_warm_anothers(start_sim: Callable[..., Proc],
                                                 start_gateway: Callable[..., Proc]) -> None:
    """The same long prompt from two salted tenants: the second finds nothing cached, while the first tenant's
    next question on it does; two shared tenants share the engine-wide cache, which no salted tenant sees."""
    sim = start_sim()
    gw = start_gateway(with_shared_tenants(policy_dict([sim.url])))
    system = system_prompt("acme")
    assert cached(gw.url, DEMO_KEY, system, "First question?") == 0
    assert cached(gw.url, PREMIUM_KEY, system, "First question?") == 0, "another tenant's prompt is not cached"
    assert cached(gw.url, DEMO_KEY, system, "Second question?") >= 160, "its own system prompt still hits"
    assert cached(gw.url, PREMIUM_KEY, system, "Second question?") >= 160
    common = system_prompt("the commons")
    assert cached(gw.url, SHARED_KEYS[0], common, "First question?") == 0
    assert cached(gw.url, SHARED_KEYS[1], common, "Another question?") >= 160, "shared tenants share"
    assert cached(gw.url, DEMO_KEY, common, "Third question?") == 0, "a salted tenant does not see theirs"
    assert cached(sim.url, None, common, "Direct?") >= 160, "what shared tenants cache is the unsalted cache"


def test_a_client_cannot_name_another_tenants_salt(start_sim: Callable[..., Proc],
                                                   start_gateway: Callable[..., Proc], tmp_path: Path) -> None:
    """A client that sends another tenant's very salt does not reach that tenant's blocks (its salt is folded
    into its own tenant's); a client's own salt narrows its sharing, consistently."""
    sim = start_sim()
    data_dir = tmp_path / "gateway-data"
    gw = start_gateway(policy_dict([sim.url]), data_dir=data_dir)
    system = system_prompt("globex")
    assert cached(gw.url, DEMO_KEY, system, "First question?") == 0
    demo = salt_of(data_dir, "demo")
    assert cached(sim.url, None, system, "Direct?", cache_salt=demo) >= 160, "this is demo's salt, and blocks"
    assert cached(gw.url, PREMIUM_KEY, system, "Stolen?", cache_salt=demo) == 0, "another tenant cannot use it"
    assert cached(gw.url, DEMO_KEY, system, "Own?", cache_salt="conversation-1") == 0, "a salt of its own narrows"
    assert cached(gw.url, DEMO_KEY, system, "Own again?", cache_salt="conversation-1") >= 160
    assert cached(gw.url, DEMO_KEY, system, "Plain?") >= 160


def test_replicas_give_a_tenant_one_salt(start_sim: Callable[..., Proc], start_gateway: Callable[..., Proc],
                                         tmp_path: Path) -> None:
    """Two replicas with data directories of their own agree on each tenant's salt through Redis: a tenant's
    prompt cached through one hits through the other, and another tenant's still does not."""
    sim = start_sim()
    policy = on_shared_state(policy_dict([sim.url]))
    one = start_gateway(policy, data_dir=tmp_path / "one")
    two = start_gateway(policy, data_dir=tmp_path / "two")
    system = system_prompt("initech")
    assert cached(one.url, DEMO_KEY, system, "First question?") == 0
    assert cached(two.url, DEMO_KEY, system, "Second question?") >= 160, "one salt on both replicas"
    assert cached(two.url, PREMIUM_KEY, system, "First question?") == 0
    assert (tmp_path / "one" / "gateway.key").read_bytes() != (tmp_path / "two" / "gateway.key").read_bytes(), \
        "the replicas' own keys differ: the agreement came through Redis"


def test_the_simulator_takes_cache_salt_where_vllm_does(start_sim: Callable[..., Proc]) -> None:
    """vLLM 0.32 takes ``cache_salt`` on chat, completions, responses and embeddings, and refuses a salt it could
    not keep apart (empty, over 128 characters, or with '@', '/', '\\' or NUL): so does the simulator."""
    sim, embedder = start_sim(), start_sim("--runner", "pooling", model="sim-embed-small")
    text = system_prompt("umbrella")

    def responses(salt: str) -> int:
        answer = httpx.post(sim.url + "/v1/responses", timeout=30, json={
            "model": MODEL, "input": text, "max_output_tokens": 2, "cache_salt": salt})
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["input_tokens_details"]["cached_tokens"])

    assert responses("one") == 0 and responses("one") >= 160 and responses("two") == 0
    completion = httpx.post(sim.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": text, "max_tokens": 2, "cache_salt": "one"})
    assert completion.status_code == 200, completion.text
    embedding = httpx.post(embedder.url + "/v1/embeddings", timeout=30, json={
        "model": "sim-embed-small", "input": "hello", "cache_salt": "one"})
    assert embedding.status_code == 200, embedding.text
    for bad in ("", "a/b", "x" * 129, 7):
        for url, body in ((sim.url + "/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "user", "content": "hi"}]}), (embedder.url + "/v1/embeddings",
                                                       {"model": "sim-embed-small", "input": "hi"})):
            refused = httpx.post(url, json={**body, "cache_salt": bad}, timeout=30)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "cache_salt", refused.text
