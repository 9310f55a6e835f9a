"""Cacheability is the policy's, and every answer says what the cache did: the official openai client with its
defaults (no temperature) over HTTP against a gateway process, for an FAQ-style tenant (any_temperature), a
tenant on the default (low_temperature) and one opted out (off)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from gateway.auth import hash_key
from gateway.context import CACHE_HEADER
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, PREMIUM_KEY, Proc, metric_value, policy_dict

MODEL = "sim-llama-8b"
FAQ_TWO_KEY = "tg-test-faq-two-key"
PERSONAL_KEY = "tg-test-personal-key"


def policy(worker: str) -> dict[str, Any]:
    made = policy_dict([worker])
    made["tenants"]["demo"]["cache"] = {"answers": "any_temperature"}  # an FAQ service
    made["tenants"]["faq-two"] = {"tier": "standard", "keys": ["sha256:" + hash_key(FAQ_TWO_KEY)],
                                  "cache": "any_temperature"}  # another one, asking the same questions
    made["tenants"]["personal"] = {"tier": "standard", "keys": ["sha256:" + hash_key(PERSONAL_KEY)],
                                   "cache": {"answers": "off"}}
    # prem: the default, low_temperature. The audit re-asks hits and may purge: its own tests hold it.
    made["cache"] = {"enabled": True, "audit": {"enabled": False}}
    return made


def asked(gw: Proc, key: str, question: str) -> str:
    """x-tollgate-cache of the official client's chat with its defaults (it sends no temperature)."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=8)
    assert raw.parse().choices[0].message.content
    value = raw.headers["x-tollgate-cache"]
    assert CACHE_HEADER.fullmatch(value), value
    if not value.startswith("hit"):
        assert "x-tollgate-cache-similarity" not in raw.headers, "a similarity only on a hit"
    return value


@pytest.fixture
def gateway(start_sim: Any, start_gateway: Any) -> Proc:
    return start_gateway(policy(start_sim().url))  # type: ignore[no-any-return]


def test_the_official_client_with_its_defaults_hits_on_a_repeat_where_the_tenant_opted_in(gateway: Proc) -> None:
    question = "How do I reset my router?"
    assert asked(gateway, DEMO_KEY, question) == "miss", "an empty scope: nothing near"
    deadline = time.monotonic() + 10  # the answer is stored after it is sent
    while (seen := asked(gateway, DEMO_KEY, question)) != "hit-exact" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert seen == "hit-exact"
    assert asked(gateway, FAQ_TWO_KEY, question) == "miss", \
        "another tenant's entry is neither served nor measured against (no nearest)"
    assert asked(gateway, PREMIUM_KEY, question) == "bypass; reason=temperature", \
        "the default cacheability: no temperature sent samples at the engine's 1.0"
    assert asked(gateway, PERSONAL_KEY, question) == "bypass; reason=tenant_opt_out"
    assert metric_value(gateway.url, "tollgate_cache_bypass_total", reason="temperature") == 1
    shown = httpx.get(gateway.url + "/admin/cache", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert {name: t["answers"] for name, t in shown["tenants"].items()} == {
        "demo": "any_temperature", "faq-two": "any_temperature", "prem": "low_temperature", "personal": "off",
        "bulk": "low_temperature"}
    assert shown["bypassed"] == {"temperature": 1, "tenant_opt_out": 1}
    assert shown["outcomes"]["hit-exact"] >= 1 and shown["outcomes"]["bypass"] == 2
