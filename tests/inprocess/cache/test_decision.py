"""The cache step: whether a request is looked up and whether its answer is kept, as HTTP caches read
Cache-Control, and what the lookup leaves on the request's context and in the metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.cache.decision import decide, settle
from gateway.cache.keys import CacheKey
from gateway.cache.service import Lookup
from gateway.cache.store import Entry
from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import CachePolicy, Policy
from tests.conftest import policy_dict

QUESTION = {"model": "sim-llama-8b", "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16}


class ScriptedCache:
    """Stands in for SemanticCache's two layers (the decision's own rules are under test): ``found`` is what the
    exact layer answers if it is an exact hit or a bypass, else what the semantic layer answers."""

    def __init__(self, found: Lookup) -> None:
        self.found = found
        self.asked: list[CacheKey] = []
        self.semantic: list[CacheKey] = []

    async def lookup_exact(self, key: CacheKey) -> Lookup:
        self.asked.append(key)
        return self.found if self.found.result in ("hit-exact", "bypass") else Lookup("miss")

    def expected_semantic_s(self, key: CacheKey, spec: CachePolicy) -> float | None:
        return 0.02

    async def lookup_semantic(self, key: CacheKey, spec: CachePolicy) -> Lookup:
        self.semantic.append(key)
        return self.found


def context(cache_enabled: bool = True) -> RequestContext:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["cache"] = {"enabled": cache_enabled}
    snapshot = PolicySnapshot.build(Policy.model_validate(policy), "test")
    ctx = RequestContext("test-request", snapshot, CHAT)
    ctx.tenant = snapshot.tenants["demo"]
    return ctx


def bypassed(metrics: GatewayMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("tollgate_cache_bypass_total", {"reason": reason}) or 0.0


def run(cache: Any, ctx: RequestContext, body: dict[str, Any], cache_control: bytes = b"",
        metrics: GatewayMetrics | None = None) -> Any:
    """The decision, with its semantic lookup (if it started one) run to its end and settled on the context."""
    metrics = metrics or GatewayMetrics()

    async def decided() -> Any:
        decision = await decide(cache, ctx, body, cache_control, metrics)
        if decision is not None and decision.semantic is not None:
            settle(ctx, decision, await decision.semantic, metrics)
        return decision
    return asyncio.run(decided())


def test_no_cache_or_a_cache_off_in_the_policy_decides_nothing() -> None:
    assert run(None, context(), QUESTION) is None
    assert run(ScriptedCache(Lookup("miss")), context(cache_enabled=False), QUESTION) is None


def test_no_cache_skips_the_lookup_but_keeps_the_answer() -> None:
    cache, metrics, ctx = ScriptedCache(Lookup("miss")), GatewayMetrics(), context()
    decision = run(cache, ctx, QUESTION, b"No-Cache", metrics)
    assert cache.asked == [] and ctx.cache == "bypass" and bypassed(metrics, "no-cache") == 1
    assert decision.key is not None and decision.keep_answer, "the fresh answer may still be stored"


def test_no_store_looks_up_but_never_keeps() -> None:
    cache, ctx = ScriptedCache(Lookup("miss")), context()
    decision = run(cache, ctx, QUESTION, b"no-store")
    assert len(cache.asked) == 1 and ctx.cache == "miss"
    assert not decision.store and not decision.keep_answer


def test_a_request_the_cache_may_not_hold_is_counted_by_why() -> None:
    cache, metrics, ctx = ScriptedCache(Lookup("miss")), GatewayMetrics(), context()
    decision = run(cache, ctx, {**QUESTION, "n": 2}, b"", metrics)
    assert cache.asked == [] and decision.key is None and not decision.keep_answer
    assert ctx.cache == "bypass" and bypassed(metrics, "n_gt_1") == 1


def test_an_exact_hit_is_not_stored_again_and_starts_no_semantic_lookup() -> None:
    entry = Entry("demo", "sim-llama-8b", "chat", "scope", "exact", "q", "Paris.", "stop", 9, 3, 16, expires=1e12)
    cache, ctx = ScriptedCache(Lookup("hit-exact", entry, 1.0)), context()
    decision = run(cache, ctx, QUESTION)
    assert decision.hit and not decision.keep_answer and decision.semantic is None and cache.semantic == []
    assert (ctx.cache, ctx.cache_similarity) == ("hit-exact", 1.0)
    assert ctx.timings.cache is not None and ctx.timings.cache >= 0


def test_an_exact_miss_starts_the_semantic_lookup_beside_the_request_and_settles_its_similarity() -> None:
    entry = Entry("demo", "sim-llama-8b", "chat", "scope", "exact", "q", "Paris.", "stop", 9, 3, 16, expires=1e12)
    cache, metrics, ctx = ScriptedCache(Lookup("hit-semantic", entry, 0.97)), GatewayMetrics(), context()
    decision = run(cache, ctx, QUESTION, b"", metrics)
    assert not decision.hit, "the exact layer missed: the request goes on while the semantic layer looks"
    assert decision.semantic is not None and decision.semantic.result().hit and len(cache.semantic) == 1
    assert (ctx.cache, ctx.cache_similarity) == ("hit-semantic", 0.97)
    observed = metrics.registry.get_sample_value("tollgate_cache_semantic_seconds_count", {"result": "hit-semantic"})
    assert observed == 1


def test_a_semantic_lookup_that_came_after_the_answer_is_counted_late() -> None:
    metrics, ctx = GatewayMetrics(), context()
    decision = asyncio.run(decide(ScriptedCache(Lookup("miss")), ctx, QUESTION, b"", metrics))
    settle(ctx, decision, None, metrics)
    assert ctx.cache == "miss" and bypassed(metrics, "late") == 1


def test_a_lookup_that_bypassed_says_why_in_the_metrics() -> None:
    metrics, ctx = GatewayMetrics(), context()
    decision = run(ScriptedCache(Lookup("bypass", reason="store_down")), ctx, QUESTION, b"", metrics)
    assert ctx.cache == "bypass" and bypassed(metrics, "store_down") == 1
    assert decision.keep_answer, "the store was down for the lookup; the answer is still offered to it"
