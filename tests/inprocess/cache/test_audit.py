"""The audit's bookkeeping: which hits are sampled, the Wilson bound, and what a wrong hit does to its scope."""

from __future__ import annotations

from gateway.cache.audit import Audits, Sample, ScopeAudit, Verdict
from gateway.cache.keys import CacheKey
from gateway.cache.store import Entry
from gateway.policy.schema import CacheAudit

SPEC = CacheAudit(every=3, max_pending=5, max_false_hit_rate=0.05, max_threshold=0.99)


def key(scope: str = "scope-a") -> CacheKey:
    return CacheKey("acme", "m", scope, "exact", "How do I sell bitcoin?", "en", True, 64)


def entry(entry_id: str = "e1", scope: str = "scope-a") -> Entry:
    return Entry("acme", "m", "chat", scope, "x", "How do I buy bitcoin?", "Buy it on an exchange.", "stop", 5, 5,
                 64, expires=1e12, id=entry_id)


def sample(similarity: float = 0.97, scope: str = "scope-a") -> Sample:
    return Sample("acme", "m", "chat", scope, "e1", "How do I sell bitcoin?", "How do I buy bitcoin?", "Buy it.",
                  similarity, {"model": "m"})


def test_an_entrys_first_hit_is_sampled_then_every_nth() -> None:
    audits = Audits()
    sampled = [audits.consider(key(), entry(), 0.97, {}, SPEC) for _ in range(7)]
    assert sampled == [True, False, False, True, False, False, True]
    assert audits.consider(key(), entry("e2"), 0.97, {}, SPEC), "another entry's first hit"
    assert not audits.consider(key(), entry("e3"), 0.97, {}, CacheAudit(enabled=False))


def test_sampling_stops_while_the_queue_is_full() -> None:
    audits = Audits()
    for i in range(8):
        audits.consider(key(), entry(f"e{i}"), 0.97, {}, SPEC)
    assert len(audits.pending) == SPEC.max_pending


def test_the_wilson_bound_is_wide_on_few_audits_and_narrows_with_many() -> None:
    few, many = ScopeAudit("acme", "m", audited=3, disagreed=0), ScopeAudit("acme", "m", audited=3000, disagreed=3)
    assert few.upper_bound(0.95) > 0.4, "three clean audits prove little"
    assert 0.001 < many.upper_bound(0.95) < 0.003, "3 in 3,000 is about 0.1%, bounded near 0.2%"
    assert ScopeAudit("acme", "m").upper_bound(0.95) == 1.0


def test_a_wrong_hit_raises_the_threshold_past_its_similarity_then_turns_the_scope_off() -> None:
    audits = Audits()
    assert audits.judge(sample(), True, 0.95, SPEC) is Verdict.AGREED
    assert audits.threshold("scope-a", 0.95) == 0.95
    assert audits.judge(sample(0.97), False, 0.95, SPEC) is Verdict.RAISED
    assert audits.threshold("scope-a", 0.95) == 0.975, "just above the wrong hit's similarity"
    assert audits.threshold("scope-b", 0.95) == 0.95, "other scopes keep the policy's"
    assert audits.judge(sample(0.988), False, 0.95, SPEC) is Verdict.OFF, "0.993 would pass max_threshold"
    assert audits.threshold("scope-a", 0.95) is None
    (row,) = audits.report(SPEC, 0.95)
    assert row["audited"] == 3 and row["disagreed"] == 2 and not row["semantic"] and row["threshold"] is None
    assert row["last_wrong"]["cached_question"] == "How do I buy bitcoin?"


def test_one_wrong_hit_among_many_right_ones_is_purged_but_moves_no_threshold() -> None:
    audits = Audits()
    for _ in range(400):
        audits.judge(sample(), True, 0.95, SPEC)
    assert audits.judge(sample(), False, 0.95, SPEC) is Verdict.WRONG
    assert audits.threshold("scope-a", 0.95) == 0.95


def test_a_stale_entry_counts_against_its_scope_but_moves_no_threshold() -> None:
    audits = Audits()
    assert audits.judge(sample(), False, 0.95, SPEC, stale=True) is Verdict.STALE
    (row,) = audits.report(SPEC, 0.95)
    assert row["disagreed"] == 1 and row["threshold"] == 0.95 and row["semantic"]
