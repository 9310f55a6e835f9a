"""The semantic layer's live error rate, per scope: which hits to audit, what the audits found, and the threshold
each scope has earned.

A wrong semantic hit is silent: the client gets a fluent answer to another question. So a sample of hits is
asked again of the engine at temperature 0, in idle capacity (``gateway.batches.audit`` runs them as batch
work), and the fresh answer compared with the one served. Each scope keeps its audits and disagreements and an
upper confidence bound on its false-hit rate (Wilson's score interval: with few audits it stays wide, so one
disagreement among three says more than one among a thousand). A disagreement purges the entry; when the
bound passes ``audit.max_false_hit_rate`` the scope's threshold rises past the similarity of the wrong hit,
and past ``audit.max_threshold`` its semantic layer turns off. An entry's first semantic hit is always
audited, then every ``audit.every``-th: a wrong entry is found within that many of its hits. A disagreement is
checked once more by asking the entry's own question again: an entry that does not answer even that (stale, or
planted) is purged without blaming the threshold.

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


class Verdict(Enum):
    AGREED = "agreed"
    STALE = "stale"  # the entry does not answer even its own question now: purged, no threshold moves
    WRONG = "wrong"  # the two questions have different answers: purged; the scope's bound is within the limit
    RAISED = "raised"  # wrong, and the scope's threshold rose
    OFF = "off"  # wrong, and the scope's semantic layer turned off


@dataclass(slots=True)
class ScopeAudit:
    tenant: str
    model: str
    audited: int = 0
    disagreed: int = 0
    threshold: float | None = None  # raised by the audit; None: the policy's
    off: bool = False
    last_wrong: dict[str, Any] | None = None

    def upper_bound(self, confidence: float) -> float:
        """Wilson score upper bound of the false-hit rate (one-sided, at ``confidence``); 1 with no audits."""
        n = self.audited
        if n == 0:
            return 1.0
        z = NormalDist().inv_cdf(confidence)
        p = self.disagreed / n
        centre = p + z * z / (2 * n)
        spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return min(1.0, (centre + spread) / (1 + z * z / n))


@dataclass(slots=True)
class Audits:
    """Every scope's audit state on this replica, and the hits waiting to be audited."""

    scopes: collections.OrderedDict[str, ScopeAudit] = field(default_factory=collections.OrderedDict)
    pending: collections.deque[Sample] = field(default_factory=collections.deque)
    _hits: collections.OrderedDict[str, int] = field(default_factory=collections.OrderedDict)

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
        if (seen - 1) % spec.every or len(self.pending) >= spec.max_pending:
            return False
        self.pending.append(Sample(key.tenant, key.model, entry.endpoint, key.scope, entry.id, key.text,
                                   entry.question, entry.answer, similarity, body))
        return True

    def judge(self, sample: Sample, agreed: bool, policy_threshold: float, spec: CacheAudit,
              stale: bool = False) -> Verdict:
        """Count one audit in its scope and say what follows from it. A wrong answer served counts against the
        scope either way; only one the engine tells apart from its own question's (not ``stale``) moves the
        threshold, since a higher threshold cannot keep a wrong entry from a paraphrase."""
        state = self.scopes.pop(sample.scope, None) or ScopeAudit(sample.tenant, sample.model)
        self.scopes[sample.scope] = state
        if len(self.scopes) > _SCOPES_KEPT:
            self.scopes.popitem(last=False)
        state.audited += 1
        if agreed:
            return Verdict.AGREED
        state.disagreed += 1
        state.last_wrong = {"question": sample.question, "cached_question": sample.cached_question,
                            "similarity": round(sample.similarity, 4)}
        self._hits.pop(sample.entry_id, None)
        if stale:
            return Verdict.STALE
        if state.upper_bound(spec.confidence) <= spec.max_false_hit_rate:
            return Verdict.WRONG
        raised = max(policy_threshold, state.threshold or 0.0, sample.similarity + _STEP)
        if raised > spec.max_threshold:
            state.off = True
            return Verdict.OFF
        state.threshold = round(raised, 4)
        return Verdict.RAISED

    def report(self, spec: CacheAudit, policy_threshold: float) -> list[dict[str, Any]]:
        """Each audited scope, as /admin/cache shows it."""
        return [{"scope": scope, "tenant": s.tenant, "model": s.model, "audited": s.audited,
                 "disagreed": s.disagreed, "false_hit_rate": round(s.disagreed / s.audited, 6) if s.audited else None,
                 "upper_bound": round(s.upper_bound(spec.confidence), 6), "confidence": spec.confidence,
                 "threshold": self.threshold(scope, policy_threshold), "semantic": not s.off,
                 "last_wrong": s.last_wrong}
                for scope, s in self.scopes.items()]
