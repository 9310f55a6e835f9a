"""Model fallbacks: a model whose pool is down is answered by its fallback, which the answer names and the
ledger prices; a fallback whose context window is too small, or a batch line, is not sent there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.endpoints import CHAT
from gateway.policy.loader import PolicyError, PolicySnapshot, parse_policy
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, ledger_records, policy_dict, wait_for
from workers.process import free_port

MODEL = "sim-llama-8b"


def fallback_policy(primary: str, backup: str, window: int | None = None) -> dict[str, Any]:
    policy = policy_dict([primary], model=MODEL)
    policy["pools"]["backup"] = {**policy["pools"]["main"], "workers": [backup]}
    policy["models"][MODEL].update(fallbacks=["backup-llama"])
    policy["models"]["backup-llama"] = {"pool": "backup", "upstream_model": MODEL,
                                        **({"context_window": window} if window else {})}
    policy["prices"]["models"]["backup-llama"] = [{"effective": "2026-01-01", "input_per_m": 2.0,
                                                   "output_per_m": 6.0}]
    return policy


def test_a_model_whose_pool_is_down_is_answered_by_its_fallback(start_sim: Callable[..., Any],
                                                                 start_gateway: Callable[..., Any]) -> None:
    backup = start_sim()
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gw = start_gateway(fallback_policy(down, backup.url), ready="/healthz")
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=DEMO_KEY, max_retries=0)

    def answered() -> bool:
        try:
            client.models.list()
            return client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "warm"}], max_tokens=1).status_code == 200
        except openai.APIStatusError:
            return False  # the backup pool's first health check has not come yet
    assert wait_for(answered, timeout=20)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
        extra_headers={"x-request-id": "fell-back"}, extra_body={"ignore_eos": True})
    assert raw.headers["x-tollgate-model"] == "backup-llama", "the answer names the model that ran"
    assert raw.parse().usage.completion_tokens == 4  # type: ignore[union-attr]
    record = ledger_records(gw.url, FINANCE_TOKEN, request_id="fell-back")[0]
    assert record["model"] == "backup-llama" and record["price_version"].startswith("backup-llama")
    expected = (record["prompt_tokens"] * 2.0 + record["completion_tokens"] * 6.0) / 1e6
    assert record["cost_usd"] == pytest.approx(expected), "priced as the fallback"

    # the batch class asked for by a request is not a batch line: it falls back like any request
    lower = httpx.post(gw.url + "/v1/chat/completions", timeout=30, headers={
        "authorization": f"Bearer {DEMO_KEY}", "x-tollgate-class": "batch"}, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert lower.status_code == 200 and lower.headers.get("x-tollgate-model") == "backup-llama"


def test_a_fallback_too_small_for_the_request_is_not_used(start_sim: Callable[..., Any],
                                                          start_gateway: Callable[..., Any]) -> None:
    backup = start_sim()
    down = f"http://127.0.0.1:{free_port()}"
    gw = start_gateway(fallback_policy(down, backup.url, window=64), ready="/healthz")

    def ask(max_tokens: int) -> httpx.Response:
        return httpx.post(gw.url + "/v1/chat/completions", timeout=30, headers={
            "authorization": f"Bearer {DEMO_KEY}"}, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
    assert wait_for(lambda: ask(8).status_code == 200, timeout=20), "a small request fits the fallback"
    large = ask(500)
    assert large.status_code == 503 and large.json()["error"]["code"] == "upstream_unavailable"
    assert "x-tollgate-model" not in large.headers


def test_fallbacks_must_name_models_of_the_same_kind() -> None:
    policy = fallback_policy("http://w1", "http://w2")
    policy["models"][MODEL]["fallbacks"] = ["nothing-here", MODEL]
    policy["models"]["embedder"] = {"pool": "backup", "kind": "embed"}
    policy["models"]["backup-llama"]["fallbacks"] = ["embedder"]
    with pytest.raises(PolicyError) as caught:
        parse_policy(yaml.safe_dump(policy))
    text = str(caught.value)
    assert "'nothing-here' is not defined" in text and "its own fallback" in text and "embed model" in text


def test_a_batch_line_falls_back_only_where_its_route_allows() -> None:
    from gateway.context import RequestContext
    from gateway.openai_api import Call
    from gateway.pipeline import _fallback

    policy = fallback_policy("http://w1", "http://w2", window=1000)
    snapshot = PolicySnapshot.build(parse_policy(yaml.safe_dump(policy)), "test")
    route = snapshot.policy.models[MODEL]

    def fallback(batch: str | None, max_output: int = 100, tenant: str = "demo") -> object:
        ctx = RequestContext("r", snapshot, CHAT)
        ctx.tenant, ctx.model, ctx.batch = snapshot.tenants[tenant], MODEL, batch
        call = Call({}, route, False, False, False, 400, max_output, "max_tokens", 1)
        found = _fallback(ctx, call, {MODEL})
        return found[0] if found else None
    assert fallback(None) == "backup-llama"
    assert fallback("batch_1") is None, "a batch line waits for its own model"
    assert fallback(None, max_output=950) is None, "100 prompt tokens + 950 do not fit a 1,000-token window"
    assert fallback(None, tenant="prem") is None, "prem may use only its own model"
    policy["models"][MODEL]["fallbacks_for_batch"] = True
    snapshot = PolicySnapshot.build(parse_policy(yaml.safe_dump(policy)), "test")
    route = snapshot.policy.models[MODEL]
    assert fallback("batch_1") == "backup-llama"
