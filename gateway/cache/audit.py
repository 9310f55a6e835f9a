"""The semantic layer's live error rate, per scope: which hits to audit, what the audits found, and the threshold
each scope has earned.

A wrong semantic hit is silent: the client gets a fluent answer to another question. So a sample of hits is
asked again of the engine at temperature 0, in idle capacity (``gateway.batches.audit`` runs them as batch
work), and the audit judges the question, not the answer's wording: did the new question ask for what the
cached entry answered? The engine is the judge, and is itself checked first (the re-asks and the rule are in
``gateway.batches.audit``); an audit ends in one ``Verdict``: the hit was right, the entry answers nothing it
was asked (stale or planted: purged, no threshold moves), the hit was wrong, or the engine could not tell
(``INCONCLUSIVE``: its answers move under a rewording that changes nothing, as a random-weights model's do;
it counts neither way). Each scope keeps its audits and wrong hits, overall and per language, and an upper
confidence bound on its false-hit rate (Wilson's score interval: with few audits it stays wide, so one wrong
hit among three says more than one among a thousand). A wrong hit purges the entry; when the bound passes
``audit.max_false_hit_rate`` the scope's threshold rises past the similarity of the wrong hit, up to
``audit.max_threshold``. The semantic layer turns off (lookups then say ``off``, reason ``audit``) only when a
higher threshold would not do and the audits show, at the policy's confidence, that the scope breaks the
contract: Wilson's lower bound above ``max_false_hit_rate``, over ``MIN_AUDITS_OFF`` audits or more, and no more
inconclusive audits than conclusive ones (an engine that mostly cannot tell is not believed when it can). Until
then uncertainty raises the threshold; it never turns the layer off.

A wrong entry's bound: its first semantic hit is always sampled, then every ``audit.every``-th, so it is found
at its first audit that runs; a sample is dropped only while ``audit.max_pending`` wait, and each scope keeps the
most hits any of its entries served before one of them was queued (``hits_before_audit``, 1 while the queue
had room): a planted entry is served at most that many hits, plus those that arrive while its audit waits for
idle capacity.

Plain bookkeeping on the event loop (no I/O); the state is this replica's own.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from enum import Enum
from statistics import NormalDist
from typing import Any

from gateway.cache.keys import CacheKey
from gateway.cache.store import Entry
from gateway.policy.schema import CacheAudit

_SCOPES_KEPT = 10_000
_ENTRIES_COUNTED = 100_000
_STEP = 0.005  # a raised threshold sits this far above the wrong hit's similarity
MIN_AUDITS_OFF = 10  # a scope's semantic layer turns off only on this many audits or more


@dataclass(frozen=True, slots=True)
class Sample:
    """A served semantic hit, to be asked again: who asked what, and what they were given."""

    tenant: str
    model: str
    endpoint: str
    scope: str
    entry_id: str
    question: str
    cached_question: str
    answer: str
    similarity: float
    body: dict[str, Any]
    language: str = ""


class Verdict(Enum):
    AGREED = "agreed"
    INCONCLUSIVE = "inconclusive"  # the engine cannot tell: nothing counted, nothing purged
    STALE = "stale"  # the entry does not answer even its own question now: purged, no threshold moves
    WRONG = "wrong"  # the two questions have different answers: purged; the scope's bound is within the limit
    RAISED = "raised"  # wrong, and the scope's threshold rose
    OFF = "off"  # wrong, and the scope's semantic layer turned off


def wilson_upper(audited: int, wrong: int, confidence: float) -> float:
    """Wilson score upper bound of a false-hit rate (one-sided, at ``confidence``); 1 with no audits."""
    n = audited
    if n == 0:
        return 1.0
    z = NormalDist().inv_cdf(confidence)
    p = wrong / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z * z / n))


def wilson_lower(audited: int, wrong: int, confidence: float) -> float:
    """Wilson score lower bound of a false-hit rate (one-sided, at ``confidence``); 0 with no audits."""
    if audited == 0:
        return 0.0
    return max(0.0, 1.0 - wilson_upper(audited, audited - wrong, confidence))


@dataclass(slots=True)
class ScopeAudit:
    tenant: str
    model: str
    audited: int = 0  # audits that concluded (agreed, stale or wrong): the bound's trials
    disagreed: int = 0
    inconclusive: int = 0
    threshold: float | None = None  # raised by the audit; None: the policy's
    off: bool = False
    last_wrong: dict[str, Any] | None = None
    by_language: dict[str, list[int]] = field(default_factory=dict)  # language: [audited, disagreed]
    hits_before_audit: int = 0  # the most hits an entry of the scope served before its first was queued for audit

    def upper_bound(self, confidence: float) -> float:
        """Wilson score upper bound of the false-hit rate (one-sided, at ``confidence``); 1 with no audits."""
        return wilson_upper(self.audited, self.disagreed, confidence)


@dataclass(slots=True)
class Audits:
    """Every scope's audit state on this replica, and the hits waiting to be audited."""

    scopes: collections.OrderedDict[str, ScopeAudit] = field(default_factory=collections.OrderedDict)
    pending: collections.deque[Sample] = field(default_factory=collections.deque)
    _hits: collections.OrderedDict[str, int] = field(default_factory=collections.OrderedDict)
    _unaudited: collections.OrderedDict[str, int] = field(default_factory=collections.OrderedDict)

    def threshold(self, scope: str, policy_threshold: float) -> float | None:
        """The cosine a semantic hit needs in ``scope``, or None when the audit turned its semantic layer off."""
        state = self.scopes.get(scope)
        if state is None:
            return policy_threshold
        if state.off:
            return None
        return policy_threshold if state.threshold is None else max(policy_threshold, state.threshold)

    def consider(self, key: CacheKey, entry: Entry, similarity: float, body: dict[str, Any],
                 spec: CacheAudit) -> bool:
        """A semantic hit was served: sample it (the entry's first hit, then every ``spec.every``-th) while
        fewer than ``spec.max_pending`` wait. True if it was sampled."""
        if not spec.enabled:
            return False
        seen = self._hits.pop(entry.id, 0) + 1
        self._hits[entry.id] = seen
        if len(self._hits) > _ENTRIES_COUNTED:
            self._hits.popitem(last=False)
        unaudited = self._unaudited.pop(entry.id, 0) + 1  # this entry's hits since its last queued audit
        if (seen - 1) % spec.every or len(self.pending) >= spec.max_pending:
            self._unaudited[entry.id] = unaudited
            if len(self._unaudited) > _ENTRIES_COUNTED:
                self._unaudited.popitem(last=False)
            return False
        state = self._scope(key.scope, key.tenant, key.model)
        if unaudited == seen:  # the entry's first audit: the hits it served before it
            state.hits_before_audit = max(state.hits_before_audit, seen)
        self.pending.append(Sample(key.tenant, key.model, entry.endpoint, key.scope, entry.id, key.text,
                                   entry.question, entry.answer, similarity, body, key.language))
        return True

    def off(self, scope: str) -> bool:
        """Whether the audit turned this scope's semantic layer off."""
        state = self.scopes.get(scope)
        return state is not None and state.off

    def _scope(self, scope: str, tenant: str, model: str) -> ScopeAudit:
        state = self.scopes.pop(scope, None) or ScopeAudit(tenant, model)
        self.scopes[scope] = state
        if len(self.scopes) > _SCOPES_KEPT:
            self.scopes.popitem(last=False)
        return state

    def judge(self, sample: Sample, agreed: bool, policy_threshold: float, spec: CacheAudit,
              stale: bool = False, inconclusive: bool = False) -> Verdict:
        """Count one audit in its scope and say what follows from it. An ``inconclusive`` one counts neither
        way (it is not a trial of the bound). A wrong answer served counts against the scope either way; only one
        the engine tells apart from its own question's (not ``stale``) moves the threshold, since a higher
        threshold cannot keep a wrong entry from a paraphrase."""
        state = self._scope(sample.scope, sample.tenant, sample.model)
        if inconclusive:
            state.inconclusive += 1
            return Verdict.INCONCLUSIVE
        language = state.by_language.setdefault(sample.language or "?", [0, 0])
        state.audited += 1
        language[0] += 1
        if agreed:
            return Verdict.AGREED
        state.disagreed += 1
        language[1] += 1
        state.last_wrong = {"question": sample.question, "cached_question": sample.cached_question,
                            "similarity": round(sample.similarity, 4)}
        self._hits.pop(sample.entry_id, None)
        if stale:
            return Verdict.STALE
        if state.upper_bound(spec.confidence) <= spec.max_false_hit_rate:
            return Verdict.WRONG
        raised = max(policy_threshold, state.threshold or 0.0, sample.similarity + _STEP)
        if raised > spec.max_threshold:
            if state.audited >= MIN_AUDITS_OFF and state.inconclusive <= state.audited and \
                    wilson_lower(state.audited, state.disagreed, spec.confidence) > spec.max_false_hit_rate:
                state.off = True
                return Verdict.OFF
            raised = spec.max_threshold  # not yet shown to break the contract: held at the highest threshold
        state.threshold = round(raised, 4)
        return Verdict.RAISED

    def report(self, spec: CacheAudit, policy_threshold: float) -> list[dict[str, Any]]:
        """Each audited scope, as /admin/cache shows it: its audits, the live upper bound of its false-hit rate
        overall and per language against the policy's ``max_false_hit_rate`` (the contract), and the bound on
        the hits a wrong entry is served before its first audit is queued."""
        return [{"scope": scope, "tenant": s.tenant, "model": s.model, "audited": s.audited,
                 "disagreed": s.disagreed, "inconclusive": s.inconclusive,
                 "false_hit_rate": round(s.disagreed / s.audited, 6) if s.audited else None,
                 "upper_bound": round(s.upper_bound(spec.confidence), 6), "confidence": spec.confidence,
                 "max_false_hit_rate": spec.max_false_hit_rate,
                 "within_contract": s.upper_bound(spec.confidence) <= spec.max_false_hit_rate,
                 "by_language": {language: {"audited": n, "disagreed": wrong,
                                            "upper_bound": round(wilson_upper(n, wrong, spec.confidence), 6)}
                                 for language, (n, wrong) in sorted(s.by_language.items())},
                 "wrong_entry_bound": {"first_hit_audited": True, "then_every": spec.every,
                                       "hits_before_audit": max(1, s.hits_before_audit)},
                 "threshold": self.threshold(scope, policy_threshold), "semantic": not s.off,
                 "off_reason": "audit" if s.off else None, "last_wrong": s.last_wrong}
                for scope, s in self.scopes.items()]
