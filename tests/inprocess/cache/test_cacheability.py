"""Which requests the cache may answer is the tenant's policy (``tenants.<name>.cache``), read once at load:
any_temperature, low_temperature or off, per model too; never a rule read from a temperature the client left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gateway.cache.keys import CacheKey, cache_key
from gateway.endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import CachePolicy, Policy, cross_reference_errors
from tests.conftest import policy_dict

SPEC = CachePolicy(enabled=True)


def snapshot(cache: object, tenant: str = "demo") -> PolicySnapshot:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["tenants"][tenant]["cache"] = cache
    return PolicySnapshot.build(Policy.model_validate(policy), "test")


def ask(question: str = "What is the capital of France?", **sampling: Any) -> dict[str, Any]:
    return {"model": "sim-llama-8b", "messages": [{"role": "user", "content": question}], **sampling}


def key(body: dict[str, Any], answers: str) -> CacheKey | str:
    view = snapshot({"answers": answers}).tenants["demo"]
    return cache_key(CHAT, body, view, view.cache_answers(body["model"]), SPEC, 16)


def test_an_faq_tenant_caches_the_official_clients_requests_whatever_their_sampling() -> None:
    unsent, greedy, hot = key(ask(), "any_temperature"), key(ask(temperature=0), "any_temperature"), \
        key(ask(temperature=1.9), "any_temperature")
    assert isinstance(unsent, CacheKey) and isinstance(greedy, CacheKey) and isinstance(hot, CacheKey)
    assert unsent.scope == greedy.scope == hot.scope, "one answer per question: the temperature is out of the scope"
    seeded = key(ask(seed=3), "any_temperature")
    assert isinstance(seeded, CacheKey) and seeded.scope != unsent.scope, "the other parameters still count"


def test_low_temperature_caches_only_what_samples_at_most_the_policys_temperature() -> None:
    assert key(ask(), "low_temperature") == "temperature", "no temperature sent: the engine's 1.0"
    assert key(ask(temperature=0.9), "low_temperature") == "temperature"
    cool, cooler, greedy = (key(ask(temperature=t), "low_temperature") for t in (0.25, 0.21, 0))
    assert isinstance(cool, CacheKey) and isinstance(cooler, CacheKey) and isinstance(greedy, CacheKey)
    assert cool.scope == cooler.scope != greedy.scope, "scoped by the temperature's tenth"
    faq = key(ask(temperature=0), "any_temperature")
    assert isinstance(faq, CacheKey) and faq.scope != greedy.scope


def test_off_caches_nothing_and_embeddings_have_no_temperature_to_read() -> None:
    assert key(ask(temperature=0), "off") == "tenant_opt_out"
    view = snapshot({"answers": "low_temperature"}).tenants["demo"]
    made = cache_key(EMBEDDINGS, {"model": "sim-llama-8b", "input": ["a"]}, view, "low_temperature", SPEC, 0)
    assert isinstance(made, CacheKey), "an API that does not sample is not kept out by a temperature"
    assert cache_key(COMPLETIONS, {"model": "sim-llama-8b", "prompt": "hi"}, view, "low_temperature", SPEC,
                     16) == "temperature"


def test_a_model_may_differ_from_its_tenants_setting() -> None:
    view = snapshot({"answers": "off", "models": {"other-model": "any_temperature"}}).tenants["demo"]
    assert view.cache_answers("sim-llama-8b") == "off" and view.cache_answers("other-model") == "any_temperature"


@pytest.mark.parametrize("written,answers", [
    ("true", "low_temperature"), ("false", "off"), ("off", "off"), ("any_temperature", "any_temperature"),
    ("{answers: off}", "off"), ("{}", "low_temperature"),
])
def test_the_shorthands_and_yamls_bare_off_read_as_meant(written: str, answers: str) -> None:
    assert snapshot(yaml.safe_load(written)).tenants["demo"].cache == answers


def test_a_wrong_setting_is_a_load_error_naming_its_path() -> None:
    with pytest.raises(ValidationError) as caught:
        snapshot({"answers": "always"})
    assert "tenants.demo.cache.answers" in str(caught.value) and "any_temperature" in str(caught.value)
    with pytest.raises(ValidationError, match=r"tenants\.demo\.cache\.sampling"):
        snapshot({"answers": "off", "sampling": "any"})
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["tenants"]["demo"]["cache"] = {"models": {"no-such-model": "off"}}
    assert cross_reference_errors(Policy.model_validate(policy)) == [
        ("tenants.demo.cache.models.no-such-model", "model 'no-such-model' is not defined under models")]


def test_the_demo_policy_shows_both_kinds_of_tenant() -> None:
    text = (Path(__file__).resolve().parents[3] / "policies" / "default.yaml").read_text()
    demo = PolicySnapshot.build(Policy.model_validate(yaml.safe_load(text)), "default")
    assert demo.tenants["demo"].cache_answers("sim-llama-8b") == "any_temperature"
    assert demo.tenants["demo-premium"].cache_answers("sim-llama-8b") == "off"
