"""The audit's bookkeeping: which hits are sampled, the Wilson bound, and what a wrong hit does to its scope."""

from __future__ import annotations

from gateway.cache.audit import MIN_AUDITS_OFF, Audits, Sample, ScopeAudit, Verdict, wilson_lower
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
    assert audits.judge(sample(0.988), False, 0.95, SPEC) is Verdict.RAISED, "0.993 would pass max_threshold, but "\
        "two wrong hits in three audits do not show the contract broken"
    assert audits.threshold("scope-a", 0.95) == SPEC.max_threshold, "held at the highest threshold"
    for _ in range(MIN_AUDITS_OFF):
        verdict = audits.judge(sample(0.992), False, 0.95, SPEC)
    assert verdict is Verdict.OFF and audits.threshold("scope-a", 0.95) is None
    (row,) = audits.report(SPEC, 0.95)
    assert row["disagreed"] >= MIN_AUDITS_OFF and not row["semantic"] and row["threshold"] is None
    assert row["last_wrong"]["cached_question"] == "How do I buy bitcoin?"


def test_wrong_hits_turn_a_scope_off_only_once_its_audits_show_the_contract_broken() -> None:
    """A few wrong hits at the highest similarities: with few audits the threshold is held at its maximum, among
    many right ones it stays; the layer stays on while the lower bound of the false-hit rate is in the contract."""
    few = Audits()
    for _ in range(MIN_AUDITS_OFF - 1):
        assert few.judge(sample(0.998), False, 0.95, SPEC) is Verdict.RAISED, "too few audits to turn it off"
    assert few.threshold("scope-a", 0.95) == SPEC.max_threshold
    many = Audits()
    for _ in range(300):
        many.judge(sample(), True, 0.95, SPEC)
    for _ in range(12):
        assert many.judge(sample(0.998), False, 0.95, SPEC) is not Verdict.OFF
    assert wilson_lower(312, 12, SPEC.confidence) < SPEC.max_false_hit_rate < many.scopes["scope-a"].upper_bound(
        SPEC.confidence)
    assert many.threshold("scope-a", 0.95) == SPEC.max_threshold


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


def test_an_inconclusive_audit_counts_neither_way_and_moves_nothing() -> None:
    audits = Audits()
    for _ in range(5):
        assert audits.judge(sample(), False, 0.95, SPEC, inconclusive=True) is Verdict.INCONCLUSIVE
    (row,) = audits.report(SPEC, 0.95)
    assert row["audited"] == 0 and row["disagreed"] == 0 and row["inconclusive"] == 5
    assert row["semantic"] and row["threshold"] == 0.95 and row["off_reason"] is None


def test_the_report_bounds_each_language_and_a_wrong_entrys_hits() -> None:
    audits = Audits()
    for i in range(30):
        judged = Sample("acme", "m", "chat", "scope-a", f"e{i}", "q", "q'", "a", 0.97, {}, "ko" if i % 3 else "en")
        audits.judge(judged, i != 4, 0.95, SPEC)
    (row,) = audits.report(SPEC, 0.95)
    assert row["by_language"]["en"] == {"audited": 10, "disagreed": 0, "upper_bound": row["by_language"]["en"][
        "upper_bound"]} and row["by_language"]["ko"]["disagreed"] == 1
    assert row["by_language"]["ko"]["upper_bound"] > row["upper_bound"], "fewer audits, a wider bound"
    assert row["max_false_hit_rate"] == SPEC.max_false_hit_rate and not row["within_contract"]
    assert row["wrong_entry_bound"] == {"first_hit_audited": True, "then_every": SPEC.every, "hits_before_audit": 1}


def test_hits_served_before_an_entry_is_first_queued_are_bounded_by_the_queue() -> None:
    """While the queue is full an entry's sample points pass unaudited; the scope shows the most hits an entry
    served before one was queued: 1 while there was room, 1 + every after one sample point was missed."""
    audits = Audits()
    for i in range(SPEC.max_pending):
        assert audits.consider(key(), entry(f"filler{i}"), 0.97, {}, SPEC)
    for _ in range(SPEC.every):
        assert not audits.consider(key(), entry("late"), 0.97, {}, SPEC), "the queue is full"
    audits.pending.clear()
    assert audits.consider(key(), entry("late"), 0.97, {}, SPEC)
    for _ in range(SPEC.every):  # later audits of an entry already audited do not count: it was checked
        audits.consider(key(), entry("late"), 0.97, {}, SPEC)
    (row,) = audits.report(SPEC, 0.95)
    assert row["wrong_entry_bound"]["hits_before_audit"] == 1 + SPEC.every


def test_a_scope_the_audit_turned_off_says_so_on_every_lookup() -> None:
    audits = Audits()
    for _ in range(MIN_AUDITS_OFF):
        audits.judge(sample(0.992), False, 0.95, SPEC)
    assert audits.off("scope-a") and not audits.off("scope-b")
    (row,) = audits.report(SPEC, 0.95)
    assert row["off_reason"] == "audit"


def test_a_scope_whose_engine_mostly_cannot_tell_is_never_turned_off() -> None:
    """A random-weights engine is inconclusive on most audits and wrong by chance on a few: its few verdicts
    raise the threshold but never turn the layer off."""
    audits = Audits()
    for _ in range(3 * MIN_AUDITS_OFF):
        audits.judge(sample(), False, 0.95, SPEC, inconclusive=True)
    for _ in range(MIN_AUDITS_OFF):
        assert audits.judge(sample(0.998), False, 0.95, SPEC) is Verdict.RAISED
    assert not audits.off("scope-a") and audits.threshold("scope-a", 0.95) == SPEC.max_threshold
