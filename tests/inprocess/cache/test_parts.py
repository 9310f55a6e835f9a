"""Cache building blocks: verifier reasons, keys and scopes, language detection, index, stores (the Redis one on
a real Redis: tests/process/cache/test_parts.py), and the quality report on the real model."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.cache.index import VectorIndex
from gateway.cache.keys import CacheKey, cache_key, detect_language
from gateway.cache.replay import json_body
from gateway.cache.store import Entry, MemoryStore, RedisStore
from gateway.cache.verifier import verify
from gateway.endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.policy.loader import TenantView
from gateway.policy.schema import CachePolicy, StatePolicy
from gateway.state import SharedState
from loadtest.benchmarks.cache.cache_eval import GPTCACHE, PAIRS, PAIRS_KO, gptcache, pairs
from tests.fakes import HandClock

TENANT = TenantView("acme", "standard", None, 512, 4096, "clamp")


@pytest.mark.parametrize("query, cached, reason", [
    ("Convert 10 miles to km", "Convert 10 km to miles", "direction"),
    ("Convert 12 km to miles", "Convert 10 km to miles", "number"),
    ("Is it not safe to eat raw eggs?", "Is it safe to eat raw eggs?", "negation"),
    ("How do I sell bitcoin?", "How do I buy bitcoin?", "antonym"),
    ("Weather in London tomorrow", "Weather in London today", "time"),
    ("Set an alarm for 7 pm", "Set an alarm for 7 am", "time"),
    ("What is the slowest sorting algorithm?", "What is the fastest sorting algorithm?", "antonym"),
    ("Which is the safest car?", "Which is the fastest car?", "comparative"),
    ("What's the weather in Manchester today?", "What's the weather in London today?", "entity"),
    ("How do I peel an orange?", "How do I peel an apple?", "substitution"),
    ("부산의 날씨는 어때요?", "서울의 날씨는 어때요?", "entity"),
    ("오후 7시에 알람 맞춰줘", "오전 7시에 알람 맞춰줘", "antonym"),
    ("10마일은 몇 킬로미터인가요?", "10킬로미터는 몇 마일인가요?", "direction"),
    # the source and destination are phrases, not unit words
    ("Sync my notes from the tablet to my work laptop", "Sync my notes from my work laptop to the tablet",
     "direction"),
    ("Pay the invoice from the company card to the supplier account",
     "Pay the invoice from the supplier account to the company card", "direction"),
    ("How do I move emails to the archive folder?", "How do I move emails from the archive folder?", "direction"),
    ("Cast a float array to an int tensor in torch", "Cast an int tensor to a float array in torch", "direction"),
    # quantifiers of different force
    ("List the accounts where each payment bounced", "List the accounts where some payment bounced", "quantifier"),
    ("Do all the pods restart on deploy?", "Do any of the pods restart on deploy?", "quantifier"),
    ("Are most users on mobile?", "Are all users on mobile?", "quantifier"),
])
def test_verifier_names_the_difference(query: str, cached: str, reason: str) -> None:
    assert verify(query, cached) == reason


@pytest.mark.parametrize("query, cached", [
    ("How can I reset my router?", "How do I reset my router?"),
    ("Who was the painter of the Mona Lisa?", "Who painted the Mona Lisa?"),
    ("How do I list every file in a directory with Python?", "How to list all files in a directory in Python"),
    ("What's the capital city of France?", "What is the capital of France?"),
    ("How can I speed up my website?", "How do I make my website faster?"),
    ("What's the drive time to Lyon from Geneva?", "What is the drive time from Geneva to Lyon?"),
    ("How can I move my photos from Google Drive to Dropbox?", "How to move photos from Google Drive to Dropbox"),
    ("Is there any way to recover a deleted branch?", "Is there a way to recover a deleted branch?"),
    ("Does every request go through the proxy at all?", "Does every request go through the proxy?"),
    ("How to copy a folder to a remote host", "How do I copy a folder to a remote host?"),
])
def test_verifier_lets_paraphrases_through(query: str, cached: str) -> None:
    assert verify(query, cached) is None


def test_language_detection() -> None:
    assert detect_language("서울 날씨 어때요?") == "ko"
    assert detect_language("What is the weather in Seoul?") == "en"
    assert detect_language("Quel est le temps à Paris aujourd'hui pour la semaine?") == "fr"
    assert detect_language("東京の天気") == "zh-ja"


def chat(question: str, system: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"model": "m", "messages": messages, "temperature": 0, **extra}


def test_scopes_separate_what_must_not_be_shared() -> None:
    spec = CachePolicy(enabled=True)
    base = cache_key(CHAT, chat("hi there"), TENANT, True, spec, 100)
    assert not isinstance(base, str)
    other_tenant = TenantView("globex", "standard", None, 512, 4096, "clamp")
    for variant in (cache_key(CHAT, chat("hi there"), other_tenant, True, spec, 100),
                    cache_key(CHAT, chat("hi there", system="Be terse."), TENANT, True, spec, 100),
                    cache_key(CHAT, {**chat("hi there"), "model": "m2"}, TENANT, True, spec, 100),
                    cache_key(CHAT, chat("hi there", temperature=0.5), TENANT, True, spec, 100),
                    cache_key(CHAT, chat("hi there", response_format={"type": "json_object"}), TENANT, True, spec,
                              100),
                    cache_key(COMPLETIONS, {"model": "m", "prompt": "hi there", "temperature": 0}, TENANT, True, spec,
                              100)):
        assert not isinstance(variant, str) and variant.scope != base.scope
    same = cache_key(CHAT, chat("  hi   there "), TENANT, True, spec, 100)
    assert not isinstance(same, str) and (same.scope, same.exact) == (base.scope, base.exact)
    assert cache_key(CHAT, chat("hi", temperature=1.2), TENANT, True, spec, 100) == "temperature"
    assert cache_key(CHAT, chat("hi", n=2), TENANT, True, spec, 100) == "n_gt_1"
    assert cache_key(CHAT, chat("hi"), TENANT, False, spec, 100) == "tenant_opt_out"
    multi = {"model": "m", "temperature": 0, "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}
    assert cache_key(CHAT, multi, TENANT, True, spec, 100) == "multi_turn"
    allowed = cache_key(CHAT, multi, TENANT, True, CachePolicy(enabled=True, multi_turn=True), 100)
    other_history = {"model": "m", "temperature": 0, "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}
    allowed2 = cache_key(CHAT, other_history, TENANT, True, CachePolicy(enabled=True, multi_turn=True), 100)
    assert not isinstance(allowed, str) and not isinstance(allowed2, str) and allowed.scope != allowed2.scope, \
        "a multi-turn answer is only reused after the same earlier turns"
    korean = cache_key(CHAT, chat("서울 날씨 어때요?"), TENANT, True, spec, 100)
    assert not isinstance(korean, str) and korean.language == "ko" and korean.semantic, "e5 covers Korean"
    english_model = CachePolicy(enabled=True, embedder={"kind": "sentence-transformers"})
    korean = cache_key(CHAT, chat("서울 날씨 어때요?"), TENANT, True, english_model, 100)
    assert not isinstance(korean, str) and not korean.semantic, "all-MiniLM-L6-v2 covers English only"


UNBOUNDED = (1 << 40, 1 << 40)  # tenant and total bytes


def _vec(seed: int, dim: int = 16) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_index_scopes_removal_and_hnsw_switch() -> None:
    index = VectorIndex(16, hnsw_above=100)
    for i in range(150):
        index.add(f"e{i}", "s1" if i % 2 == 0 else "s2", _vec(i), time.time() + 60, "acme", *UNBOUNDED)
    assert index.scopes["s2"].flat and index.size("s2") == 75
    assert index.search("s1", _vec(10))[0] == ("e10", pytest.approx(1.0, abs=1e-5))
    assert all(entry_id != "e11" for entry_id, _ in index.search("s1", _vec(11))), "never across scopes"
    for i in range(100, 160, 2):  # s1: 75 + 30 entries, past hnsw_above=100
        index.add(f"x{i}", "s1", _vec(1000 + i), time.time() + 60, "acme", *UNBOUNDED)
    assert not index.scopes["s1"].flat, "switched to HNSW past hnsw_above"
    assert index.search("s1", _vec(10))[0][0] == "e10"
    index.remove("e10")
    assert all(entry_id != "e10" for entry_id, _ in index.search("s1", _vec(10)))


def _entry(tenant: str = "acme", question: str = "q", ttl: float = 60, now: float | None = None) -> Entry:
    return Entry(tenant=tenant, model="m", endpoint="chat", scope="s", exact=f"x-{question}", question=question,
                 answer="a", finish_reason="stop", prompt_tokens=3, completion_tokens=2, max_tokens=10,
                 expires=(time.time() if now is None else now) + ttl, vector=_vec(len(question)))


def _state(url: str) -> SharedState:
    """What a gateway process gives its RedisStore: its one client (gateway.state)."""
    return SharedState(StatePolicy(redis_url=url))


@pytest.fixture
def clock() -> HandClock:
    """The store's wall clock, moved by hand: an entry expires when the test says, not after a sleep."""
    return HandClock()


@pytest.fixture(params=["memory"])  # tests/process/cache/test_parts.py runs the store's tests on Redis too
def store(request: pytest.FixtureRequest, clock: HandClock) -> Any:
    return MemoryStore(clock)


def test_store_lru_ttl_exact_and_events(store: Any, clock: HandClock) -> None:
    async def main() -> None:
        cursor = await store.last_event_id() if isinstance(store, RedisStore) else "0-0"
        two = CachePolicy(max_entries_per_tenant=2)
        first, second, third = (_entry(question=q, now=clock.now) for q in ("one", "two", "three"))
        assert await store.put(first, two) == []
        assert await store.put(second, two) == []
        clock.now += 1
        await store.touch(first)  # first is now the most recently used
        assert await store.put(third, two) == [second.id], "LRU eviction per tenant"
        assert (await store.get_exact("x-one")).answer == "a"
        assert await store.get(second.id) is None
        assert await store.put(_entry(tenant="other", question="four"), two) == [], "limits are per tenant"
        stored = await store.get(first.id)
        assert stored is not None and np.allclose(stored.vector, first.vector)
        short = _entry(question="brief", ttl=0.5, now=clock.now)
        await store.put(short, CachePolicy())
        assert (await store.get(short.id)) is not None, "alive until its expiry"
        if isinstance(store, RedisStore):  # Redis drops it itself: after the shortest TTL it takes, one second
            for key in (store._key(short.id), f"{store.prefix}x:{short.exact}"):
                assert 0 < await store.redis.pttl(key) <= 1000
        clock.now += 0.5
        assert await store.get(short.id) is None, "expired"
        assert sorted(await store.select("acme", None)) == sorted([first.id, third.id])
        if isinstance(store, RedisStore):
            events, _ = await store.events(cursor, block_ms=100)
            assert ("put", first.id) in events and ("del", second.id) in events
        await store.close()
    asyncio.run(main())


def test_redis_store_down_raises_store_unavailable() -> None:
    from gateway.cache.store import StoreUnavailable

    async def main() -> None:
        dead = RedisStore(_state("redis://127.0.0.1:1/0"))
        with pytest.raises(StoreUnavailable):
            await dead.get_exact("x")
        await dead.close()
    asyncio.run(main())


@pytest.fixture(scope="module")
def embedder() -> Any:
    from gateway.cache.embedder import MiniLMEmbedder

    model = MiniLMEmbedder()
    yield model
    model.close()


@pytest.mark.quality
def test_quality_on_the_hand_written_pairs(embedder: Any) -> None:
    near, para = pairs(embedder, PAIRS)
    assert len(near) >= 100 and len(para) >= 100
    above = [r for r in near if r.cosine >= 0.95]
    assert len(above) >= 30, "the set exercises the threshold"
    served = [(r.a, r.b) for r in above if r.rejected_by is None]
    assert served == [], "no near-miss may be served with the verifier on"
    for category in ("phrase_direction", "quantifiers"):
        assert sum(r.cosine >= 0.95 for r in near if r.category == category) >= 10, f"{category} reaches the verifier"
    plain = sum(r.cosine >= 0.95 for r in para)
    kept = sum(r.cosine >= 0.95 and r.rejected_by is None for r in para)
    assert plain >= 60 and plain - kept <= 0.05 * plain, "the verifier costs at most 5% of plain cosine's hits"


@pytest.fixture(scope="module")
def e5() -> Any:
    from gateway.cache.embedder import E5Embedder

    model = E5Embedder()
    yield model
    model.close()


@pytest.mark.quality
def test_quality_on_the_korean_pairs_with_e5(e5: Any) -> None:
    """On e5 Korean paraphrases and must-miss pairs both score near 0.97, so the verifier decides: no must-miss may be
    served (the held-out second round included), and at least half of the paraphrases must be."""
    near, para = pairs(e5, PAIRS_KO)
    assert len(near) >= 150 and len(para) >= 80
    assert sum(r.category == "second_round" for r in near) >= 40
    assert sum(r.category == "paraphrase_second_round" for r in para) >= 30
    above = [r for r in near if r.cosine >= 0.95]
    assert len(above) >= 0.7 * len(near), "the set exercises the verifier, not the threshold"
    served = [(r.a, r.b) for r in above if r.rejected_by is None]
    assert served == [], "no Korean near-miss may be served with the verifier on"
    default = CachePolicy().threshold  # e5's measured default, stricter than the 0.95 the must-miss pairs passed
    hits = sum(r.cosine >= default and r.rejected_by is None for r in para)
    assert hits >= 0.5 * len(para), f"{hits} of {len(para)} Korean paraphrases hit at {default}"


@pytest.mark.quality
def test_quality_on_the_english_pairs_with_e5(e5: Any) -> None:
    near, para = pairs(e5, PAIRS)
    served = [(r.a, r.b) for r in near if r.cosine >= 0.95 and r.rejected_by is None]
    assert served == [], "no English near-miss may be served with the verifier on"
    assert sum(r.cosine >= 0.95 for r in near) >= 100, "on e5 most near-misses reach the verifier"
    assert sum(r.cosine >= 0.95 and r.rejected_by is None for r in para) >= 100
    hits = sum(r.cosine >= CachePolicy().threshold and r.rejected_by is None for r in para)
    assert hits >= 89, f"{hits} English paraphrases hit at e5's default: not below all-MiniLM-L6-v2's 89 at 0.95"


@pytest.mark.quality
def test_quality_on_e5_gptcache_pairs_at_its_default_threshold(e5: Any) -> None:
    """At 0.95 e5 finds another question's original for a fifth of GPTCache's rewrites when their own is left out
    (MiniLM: 1.3%); its default threshold keeps that near MiniLM's while hitting more of them."""
    result = gptcache(e5, GPTCACHE, CachePolicy().threshold)["verifier_on"]
    assert result["false_hit_rate_own_left_out"] < 0.04 and result["hit_rate"] > 0.276


@pytest.mark.quality
def test_quality_on_gptcache_pairs(embedder: Any) -> None:
    if not GPTCACHE.exists():
        pytest.fail(f"{GPTCACHE} is missing: it ships in the repo")
    result = gptcache(embedder, GPTCACHE, 0.95)
    off, on = result["verifier_off"], result["verifier_on"]
    assert off["right_original"] > 350, "the embedder and index find the rewrites"
    assert on["wrong_original_on_top"] < off["wrong_original_on_top"]
    assert on["false_hit_rate_own_left_out"] < off["false_hit_rate_own_left_out"]
    assert on["hit_rate"] > 0.2


def test_embeddings_are_cached_exactly_per_tenant_model_and_parameters() -> None:
    spec = CachePolicy(enabled=True)
    body = {"model": "e", "input": ["a b", "c"]}
    base = cache_key(EMBEDDINGS, body, TENANT, True, spec, 0)
    assert isinstance(base, CacheKey) and not base.semantic, "nothing to compare by meaning"
    other_tenant = TenantView("globex", "standard", None, 512, 4096, "clamp")
    variants = [cache_key(EMBEDDINGS, body, other_tenant, True, spec, 0),
                cache_key(EMBEDDINGS, {**body, "model": "e2"}, TENANT, True, spec, 0),
                cache_key(EMBEDDINGS, {**body, "input": ["a  b", "c"]}, TENANT, True, spec, 0),
                cache_key(EMBEDDINGS, {**body, "encoding_format": "base64"}, TENANT, True, spec, 0),
                cache_key(EMBEDDINGS, {**body, "dimensions": 64}, TENANT, True, spec, 0)]
    assert all(isinstance(v, CacheKey) and v.exact != base.exact for v in variants)
    assert cache_key(EMBEDDINGS, dict(body), TENANT, True, spec, 0) == base
    assert cache_key(EMBEDDINGS, body, TENANT, False, spec, 0) == "tenant_opt_out"
    answer = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"usage":' \
             b'{"prompt_tokens":3,"total_tokens":3}}'
    text, finish, usage = EMBEDDINGS.answer_from_json(answer)  # type: ignore[misc]
    entry = Entry(tenant="acme", model="e", endpoint="embeddings", scope=base.scope, exact=base.exact, question="",
                  answer=text, finish_reason=finish, prompt_tokens=usage["prompt_tokens"], completion_tokens=0,
                  max_tokens=0, expires=0.0)
    replayed = orjson.loads(json_body(EMBEDDINGS, entry, "e", "hit-exact"))
    assert replayed["data"] == orjson.loads(answer)["data"] and replayed["usage"]["prompt_tokens"] == 3
    assert replayed["object"] == "list" and replayed["model"] == "e"


def test_the_byte_bounds_are_checked_at_load() -> None:
    from pydantic import ValidationError

    spec = CachePolicy()
    assert (spec.max_bytes, spec.max_tenant_bytes, spec.max_entry_bytes) == (256 << 20, 32 << 20, 2 << 20)
    for wrong in ({"max_tenant_bytes": 512 << 20}, {"max_bytes": 1000}, {"max_tenant_bytes": 0}):
        with pytest.raises(ValidationError):
            CachePolicy(**wrong)
