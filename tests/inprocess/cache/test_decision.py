"""The cache step: whether a request is looked up and whether its answer is kept, as HTTP caches read
Cache-Control, and what the lookup leaves on the request's context and in the metrics."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.cache.decision import decide, settle
from gateway.cache.keys import CacheKey
from gateway.cache.service import Lookup, SemanticCache
from gateway.cache.store import Entry
from gateway.context import CACHE_HEADER, RequestContext
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

    index = None  # no vectors: a miss has no nearest similarity to report

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


def context(cache_enabled: bool = True, tenant: str = "demo", answers: str | None = None) -> RequestContext:
    """A request's context under the test policy; ``answers``: the tenants' cacheability (default: the schema's)."""
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["cache"] = {"enabled": cache_enabled}
    if answers is not None:
        for spec in policy["tenants"].values():
            spec["cache"] = {"answers": answers}
    snapshot = PolicySnapshot.build(Policy.model_validate(policy), "test")
    ctx = RequestContext("test-request", snapshot, CHAT)
    ctx.tenant = snapshot.tenants[tenant]
    return ctx


def bypassed(metrics: GatewayMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("tollgate_cache_bypass_total", {"reason": reason}) or 0.0


def run(cache: Any, ctx: RequestContext, body: dict[str, Any], cache_control: bytes = b"",
        metrics: GatewayMetrics | None = None, late: bool = False) -> Any:
    """The decision, with its semantic lookup (if it started one) run to its end and settled on the context
    (``late``: settled as one that came after the answer, before it ends)."""
    metrics = metrics or GatewayMetrics()

    async def decided() -> Any:
        decision = await decide(cache, ctx, body, cache_control, metrics)
        if decision is not None and decision.semantic is not None:
            if late:
                settle(ctx, decision, None, metrics)
                await decision.semantic
            else:
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


# -- what the answer says: x-tollgate-cache -------------------------------------------------------------------

def header_of(ctx: RequestContext) -> dict[str, str]:
    return {name.decode(): value.decode() for name, value in ctx.response_headers()}


def header_faults(headers: dict[str, str]) -> list[str]:
    """What is wrong with an answer's cache headers by the documented grammar (empty: nothing)."""
    value = headers.get("x-tollgate-cache")
    if value is None:
        return []
    if not CACHE_HEADER.fullmatch(value):
        return [f"{value!r} does not parse"]
    outcome, *params = value.split("; ")
    names = [param.split("=", 1)[0] for param in params]
    faults = [f"{value!r} repeats a parameter"] if len(set(names)) != len(names) else []
    if outcome != "miss" and "nearest" in names:
        faults.append(f"{value!r}: a nearest similarity on a {outcome}")
    if not outcome.startswith("hit") and "x-tollgate-cache-similarity" in headers:
        faults.append(f"a {outcome} with a similarity header {headers['x-tollgate-cache-similarity']}")
    if outcome in ("bypass", "off") and "reason" not in names:
        faults.append(f"{value!r} says no reason")
    return faults


def test_the_header_checks_catch_a_broken_rendering() -> None:
    """Positive control for the property below: each fault a broken rendering could make is caught."""
    assert header_faults({"x-tollgate-cache": "miss; nearest=0.9412"}) == []
    for broken in ({"x-tollgate-cache": "bypass reason=temperature"}, {"x-tollgate-cache": "bypass"},
                   {"x-tollgate-cache": "bypass; reason=temperature; nearest=0.9000"},
                   {"x-tollgate-cache": "bypass; reason=timeout", "x-tollgate-cache-similarity": "0.9700"},
                   {"x-tollgate-cache": "miss; nearest=0.9; nearest=0.8"}, {"x-tollgate-cache": "miss; why=a b"}):
        assert header_faults(broken), broken


def test_a_bypass_says_why_on_the_answer() -> None:
    """The official clients send no temperature: under the default cacheability (low_temperature) that is a bypass,
    and the answer says so, as it says a client's no-cache."""
    ctx = context()
    run(ScriptedCache(Lookup("miss")), ctx, {k: v for k, v in QUESTION.items() if k != "temperature"})
    assert header_of(ctx)["x-tollgate-cache"] == "bypass; reason=temperature"
    ctx = context()
    run(ScriptedCache(Lookup("miss")), ctx, QUESTION, b"no-cache")
    assert header_of(ctx)["x-tollgate-cache"] == "bypass; reason=no-cache"
    ctx = context(answers="off")
    run(ScriptedCache(Lookup("miss")), ctx, QUESTION)
    assert header_of(ctx)["x-tollgate-cache"] == "bypass; reason=tenant_opt_out"


def test_a_tenant_that_caches_any_temperature_looks_up_a_request_without_one() -> None:
    cache, ctx = ScriptedCache(Lookup("miss")), context(answers="any_temperature")
    decision = run(cache, ctx, {k: v for k, v in QUESTION.items() if k != "temperature"})
    assert decision.key is not None and len(cache.asked) == 1 and header_of(ctx)["x-tollgate-cache"] == "miss"
    hot = context(answers="any_temperature")
    assert run(ScriptedCache(Lookup("miss")), hot, {**QUESTION, "temperature": 1.7}).key.scope == decision.key.scope


def test_a_scope_the_audit_turned_off_says_off() -> None:
    """However the cache reports it: an off from the exact layer (no semantic lookup is started for it), an off
    or an audit's bypass from the semantic one."""
    class OffScope(ScriptedCache):
        async def lookup_exact(self, key: CacheKey) -> Lookup:
            return Lookup("off", reason="audit")
    ctx, cache = context(), OffScope(Lookup("miss"))
    decision = run(cache, ctx, QUESTION)
    assert header_of(ctx)["x-tollgate-cache"] == "off; reason=audit" and decision.semantic is None
    for found in (Lookup("off", reason="audit"), Lookup("bypass", reason="audit_off"), Lookup("off")):
        ctx = context()
        run(ScriptedCache(found), ctx, QUESTION)
        assert header_of(ctx)["x-tollgate-cache"] == f"off; reason={found.reason or 'audit'}"


def test_a_semantic_lookup_shows_on_the_headers_written_after_it_and_never_after_the_answer_is_over() -> None:
    """The lookup races the answer: one that ended puts its outcome on the headers written after it (a whole
    answer's are written once its body is read); one that ends after the answer was settled (late) leaves the
    context as ``settle`` left it, for the ledger."""
    async def main(late: bool) -> RequestContext:
        ctx, metrics = context(), GatewayMetrics()
        decision = await decide(ScriptedCache(Lookup("miss", reason="later")), ctx, QUESTION, b"", metrics)
        assert decision is not None and decision.semantic is not None
        if late:
            settle(ctx, decision, None, metrics)
        await decision.semantic
        return ctx
    assert header_of(asyncio.run(main(False)))["x-tollgate-cache"] == "miss; reason=later"
    assert header_of(asyncio.run(main(True)))["x-tollgate-cache"] == "miss"


_REASONS = st.sampled_from(["store_down", "timeout", "error", "embedder_busy", "audit_off", "audit: answers differ",
                            "language:fr", None])
_LOOKUPS = st.one_of(
    st.builds(lambda r: Lookup("bypass", reason=r or "unknown"), _REASONS),
    st.builds(lambda r: Lookup("miss", reason=r, vector=np.zeros(2, np.float32)), _REASONS),
    st.builds(lambda r: Lookup("off", reason=r), _REASONS),
    st.builds(lambda s: Lookup("hit-semantic", ENTRY, s), st.floats(0.5, 1.0)),
    st.just(Lookup("hit-exact", None, 1.0)),
)
_MESSAGES = st.sampled_from([
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "프랑스의 수도는 어디인가요?"}],
    [{"role": "user", "content": "Quelle est la capitale de la France ?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": ""}]])
_EXTRAS = st.lists(st.one_of(  # most requests send few of these; each may keep it from the cache
    st.tuples(st.just("temperature"), st.one_of(st.none(), st.floats(0, 2))),
    st.tuples(st.just("n"), st.integers(1, 3)),
    st.tuples(st.just("logprobs"), st.booleans()), st.tuples(st.just("seed"), st.integers(0, 9)),
    st.tuples(st.just("tools"), st.just([{"type": "function", "function": {"name": "f"}}])),
    st.tuples(st.just("max_tokens"), st.integers(1, 64))), max_size=1)
_BODIES = st.builds(lambda messages, extras: {"model": "sim-llama-8b", "messages": messages,
                                              **{k: v for k, v in extras if v is not None}}, _MESSAGES, _EXTRAS)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_BODIES, found=_LOOKUPS,
       answers=st.sampled_from(["any_temperature", "any_temperature", "low_temperature", "off"]),
       control=st.sampled_from([b"", b"", b"", b"no-cache", b"no-store"]),
       nearest=st.one_of(st.none(), st.floats(-1, 1)), late=st.booleans())
def test_every_answer_says_what_the_cache_did_by_the_documented_grammar(
        body: dict[str, Any], found: Lookup, answers: str, control: bytes, nearest: float | None,
        late: bool) -> None:
    """Whatever the request and whatever each layer answers (and whether the semantic lookup ended before the
    answer did): the header parses, a bypass or an off says why and shows no similarity, only a miss shows a
    nearest one."""
    if found.result == "hit-exact":
        found = Lookup("hit-exact", ENTRY, 1.0)
    ctx = context(answers=answers)
    cache = ScriptedCache(found)
    if nearest is not None:
        cache.index = OneScope(nearest)  # type: ignore[assignment]
    run(cache, ctx, body, control, late=late)
    assert header_faults(header_of(ctx)) == []


class OneScope:
    """An index whose every scope holds one entry at ``score``: what a miss's nearest reads."""

    def __init__(self, score: float) -> None:
        self.score = score

    def size(self, scope: str) -> int:
        return 1

    def search(self, scope: str, vector: Any, k: int = 4) -> list[tuple[str, float]]:
        return [("e", self.score)]


ENTRY = Entry("demo", "sim-llama-8b", "chat", "scope", "exact", "q", "Paris.", "stop", 9, 3, 16, expires=1e12)


class TextEmbedder:
    """Each text its own unit vector (the same text, the same vector), as a real embedder is for this test: a
    tenant's miss must not find another tenant's entry however near it is."""

    name, dim = "text", 16

    async def embed(self, text: str, priority: int = 0) -> np.ndarray:
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big"))
        vector = rng.standard_normal(self.dim).astype(np.float32)
        return vector / np.linalg.norm(vector)

    def expected_wait_s(self) -> float:
        return 0.0

    def close(self) -> None:
        return None


def test_a_miss_reports_the_nearest_of_its_own_tenants_entries_never_anothers() -> None:
    """Two tenants ask the same question: the first's answer is stored; the second's miss has no nearest (its own
    entries are none), while the first tenant asking anew sees its own entry's similarity."""
    async def main() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        spec = CachePolicy(enabled=True, audit={"enabled": False})
        cache = SemanticCache(spec, GatewayMetrics(), embedder=TextEmbedder())  # type: ignore[arg-type]
        await cache.start()
        try:
            first = context(tenant="demo", answers="any_temperature")
            stored = await decide(cache, first, QUESTION, b"", GatewayMetrics())
            assert stored is not None and stored.key is not None and stored.semantic is not None
            await stored.semantic
            await cache._remember(stored.key, CHAT, ANSWER, False, stored.semantic, spec)
            seen = []
            for tenant, question in (("prem", "What is the capital of France?"),
                                     ("demo", "Which city is the capital of France?"),
                                     ("demo", "What is the capital of France?")):
                ctx = context(tenant=tenant, answers="any_temperature")
                body = {**QUESTION, "messages": [{"role": "user", "content": question}]}
                decision = await decide(cache, ctx, body, b"", GatewayMetrics())
                assert decision is not None
                if decision.semantic is not None:
                    settle(ctx, decision, await decision.semantic, GatewayMetrics())
                seen.append(header_of(ctx))
            return seen[0], seen[1], seen[2]
        finally:
            await cache.close()
    other_tenant, own_paraphrase, own_repeat = asyncio.run(main())
    assert other_tenant["x-tollgate-cache"] == "miss", "another tenant's entry is not its to measure against"
    assert own_paraphrase["x-tollgate-cache"].startswith("miss; nearest="), own_paraphrase
    assert own_repeat["x-tollgate-cache"] == "hit-exact", "the control: the entry is there, for its tenant"
    assert header_faults(own_paraphrase) == []


ANSWER = (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":9,"completion_tokens":3}}')
