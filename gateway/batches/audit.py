"""The cache audit's re-asks: each sampled semantic hit asked again of the engine, as batch work.

A sample (``gateway.cache.audit``) goes through ``pipeline.run`` as its tenant's batch-class request, at
temperature 0, with ``Cache-Control: no-cache, no-store`` (never answered by the cache it audits, never stored in
it): the scheduler grants batch work only capacity that premium and standard traffic leave, so an audit never
runs ahead of a live request. It is metered like any request, under the key id ``cache-audit``, so the ledger
shows what auditing costs. ``CacheAuditor.audit`` says which re-asks are made and how they are judged; the
cache counts the verdict.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from gateway import pipeline
from gateway.cache.audit import Sample, Verdict
from gateway.context import RequestContext
from gateway.endpoints import SERVED, Endpoint
from gateway.runtime import Gateway
from gateway.sink import BufferSink


class Outcome(Enum):
    """What the re-asks showed (``CacheAuditor.audit``), before the scope's bookkeeping says what follows."""

    AGREED = "agreed"
    STALE = "stale"
    INCONCLUSIVE = "inconclusive"
    WRONG = "wrong"


def reworded(question: str) -> str:
    """The question in a wording that cannot change what it asks: its first space doubled (a question without
    one gets a zero-width space at its end, which no trim removes). Inside the text, so a chat template that
    trims a message keeps it. An engine that answers this differently at temperature 0 answers surface, not
    meaning."""
    at = question.find(" ")
    return question[:at] + " " + question[at:] if at >= 0 else question + "\u200b"


def reframed(question: str) -> str:
    """The question with a courtesy before it ("Please, "): what it asks unchanged, every token after it moved.
    An engine that holds still under a doubled space but not under this (a random-weights model does) is not
    reading meaning either."""
    return "Please, " + question


@dataclass(slots=True)
class Scores:
    """The agreements an audit measured (cosines of answers' embeddings; None: not needed)."""

    served: float  # the served answer and the new question's fresh one
    own: float | None = None  # the served answer and its own question's fresh one
    pair: float | None = None  # the two fresh answers
    itself: float | None = None  # the own question's fresh answer and its answer to a rewording of it
    unrelated: float | None = None  # the own question's fresh answer and the answer to an unrelated question


Ask = Callable[[str | None], Awaitable[str | None]]
Agreement = Callable[[str, str], Awaitable[float]]
# The controls no cached question is near: the engine's answers to them mark "another question" on its scale.
UNRELATED = ("Describe how the water cycle works, step by step.", "일주일 동안 먹을 채식 식단을 짜 주세요.")
GAP = 0.08  # the engine's self-agreement must stand this far above its agreement with an unrelated answer
SHARE = 0.75  # of that span, an agreement this far up it counts as agreeing


def standing(value: float, itself: float, unrelated: float) -> float:
    """Where an agreement stands between the engine's answers to unrelated questions (0) and its answers to one
    question in two wordings (1): the embedder's cosine, on the engine's own scale."""
    return (value - unrelated) / (itself - unrelated)


async def reask(served: str, own_question: str, ask: Ask, agreement: Agreement) -> tuple[Outcome, Scores] | None:
    """Judge a served hit by asking the engine again (``ask(None)``: the new question; ``ask(q)``: question q in
    its place), each re-ask made only when the ones before leave the verdict open; None when a re-ask failed.
    The steps are ``CacheAuditor.audit``'s."""
    fresh = await ask(None)
    if fresh is None:
        return None
    scores = Scores(await agreement(served, fresh))
    if scores.served >= 1.0:
        return Outcome.AGREED, scores
    # asked together: a planted entry is served meanwhile, so the audit's time is part of its bound
    own, again, framed, *others = await asyncio.gather(*(ask(q) for q in (
        own_question, reworded(own_question), reframed(own_question), *UNRELATED)))
    if own is None or again is None or framed is None or None in others:
        return None
    scores.own, scores.pair = await agreement(served, own), await agreement(own, fresh)
    scores.itself = min(await agreement(own, again), await agreement(own, framed))
    scores.unrelated = max([await agreement(own, other) for other in others if other is not None])
    if scores.itself - scores.unrelated < GAP:
        return Outcome.INCONCLUSIVE, scores
    if standing(scores.own, scores.itself, scores.unrelated) < SHARE:
        return Outcome.STALE, scores
    if standing(scores.pair, scores.itself, scores.unrelated) >= SHARE:
        return Outcome.AGREED, scores
    return Outcome.WRONG, scores


def _shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"

log = logging.getLogger("tollgate.cache.audit")
KEY_ID = "cache-audit"
_BY_NAME = {endpoint.name: endpoint for endpoint in SERVED}
_DROPPED = ("stream", "stream_options", "n", "seed", "top_p", "logprobs", "top_logprobs", "store", "background")


class CacheAuditor:
    """Takes sampled hits from the cache one at a time and audits them (one at a time: it is idle-time work)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count()

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            cache = self.gw.cache  # a policy reload may replace it (or turn it off): read it again each second
            if cache is None:
                await asyncio.sleep(1.0)
                continue
            try:
                async with asyncio.timeout(1.0):
                    sample = await cache.next_sample()
            except TimeoutError:
                continue
            try:
                await self.audit(sample)
            except Exception:  # one failed audit must not stop the rest
                log.exception("a cache audit failed")

    async def audit(self, sample: Sample) -> Verdict | None:
        """Ask again and judge whether the new question asked for what the entry answered; None when it could not
        be asked (the tenant left, the engine refused or failed): an audit that did not run counts nothing.

        The engine judges, on its own scale: answers are compared by meaning (the embedder's cosine), and a
        cosine means what it means for this engine between two marks it sets itself: its answer to the entry's
        question against its answer to that question reworded in a way that cannot change it (a doubled space: 1 on
        the scale), and against its answers to two unrelated questions (the nearer: 0).
        1. the new question, asked again, gets the served answer word for word: right (one re-ask);
        2. else the entry's question, two rewordings of it and two unrelated questions are asked (the scale's 1 is
           the lower of the two rewordings'). An engine whose two
           marks are within ``GAP`` (its answer moves under a rewording as far as to another question: a
           random-weights model) cannot tell questions apart by answering them: inconclusive;
        3. an entry whose answer stands below ``SHARE`` of the scale from the engine's answer to its own question
           is stale (or planted): purged, no threshold moves;
        4. the two fresh answers standing at ``SHARE`` or above: right; below: the hit was wrong."""
        cache, snapshot = self.gw.cache, self.gw.store.current
        endpoint = _BY_NAME.get(sample.endpoint)
        if cache is None or endpoint is None or sample.tenant not in snapshot.tenants:
            return None
        spec = snapshot.policy.cache

        async def again(question: str | None) -> str | None:
            if question is None:
                return await self._ask(endpoint, sample.tenant, sample.body)
            return await self._ask_question(endpoint, sample, question)

        judged = await reask(sample.answer, sample.cached_question, again, cache.agreement)
        if judged is None:
            return None
        outcome, scores = judged
        verdict = await cache.audited(sample, outcome is Outcome.AGREED, outcome is Outcome.STALE, spec,
                                      inconclusive=outcome is Outcome.INCONCLUSIVE)
        if verdict is not Verdict.AGREED:
            self._tell(sample, verdict, scores)
        return verdict

    async def _ask_question(self, endpoint: Endpoint, sample: Sample, question: str) -> str | None:
        """The sample's request with another question in its place, asked again; None if it cannot be."""
        spec = self.gw.store.current.policy.cache
        body = endpoint.asking(sample.body, question, spec)
        return None if body is None else await self._ask(endpoint, sample.tenant, body)

    async def _ask(self, endpoint: Endpoint, tenant: str, asked: dict[str, Any]) -> str | None:
        """One re-ask through the pipeline as the tenant's batch work at temperature 0; the answer's text."""
        gw = self.gw
        snapshot = gw.store.current
        view = snapshot.tenants.get(tenant)
        if view is None:
            return None
        body = {k: v for k, v in asked.items() if k not in _DROPPED}
        body["temperature"] = 0
        ctx = RequestContext(f"audit-{next(self._ids):x}", snapshot, endpoint)
        ctx.tenant, ctx.key_id = view, KEY_ID
        sink = BufferSink()
        async with pipeline.Lifecycle(gw, ctx, sink):
            await pipeline.run(gw, ctx, orjson.dumps(body), sink, b"no-cache, no-store", "batch")
        if sink.error is not None or sink.status != 200:
            return None
        try:
            parsed = endpoint.answer_from_json(b"".join(sink.chunks))
        except ValueError:
            return None
        return None if parsed is None else parsed[0]

    def _tell(self, sample: Sample, verdict: Verdict, scores: Scores) -> None:
        """The log line for every wrong hit found, and an alert when a scope's threshold moved."""
        cache, snapshot = self.gw.cache, self.gw.store.current
        assert cache is not None
        spec = snapshot.policy.cache
        state = cache.audits.scopes[sample.scope]
        upper = state.upper_bound(spec.audit.confidence)
        threshold = cache.audits.threshold(sample.scope, spec.threshold)
        outcome = {Verdict.STALE: "the entry does not answer its own question either (threshold kept)",
                   Verdict.INCONCLUSIVE: "the engine's answer moves under a rewording that changes nothing: "
                                         "inconclusive (nothing counted, entry kept)",
                   Verdict.WRONG: "threshold kept", Verdict.RAISED: f"threshold raised to {threshold}",
                   Verdict.OFF: "semantic layer turned off"}[verdict]
        # no question text in the log (it is a tenant's content): /admin/cache shows the last wrong pair to admins
        # the answers' agreement: served/fresh, served/own question's, the two fresh ones, the engine with itself
        log.warning("cache audit %s for tenant %s (%s): similarity %.4f; the answers agree %.3f, with its own "
                    "question's %s, the two fresh %s, the engine with itself %s; scope %s: %d of %d audits wrong, "
                    "upper bound %.3f; %s", verdict.value, sample.tenant, sample.model, sample.similarity,
                    scores.served, _shown(scores.own), _shown(scores.pair), _shown(scores.itself), sample.scope[:16],
                    state.disagreed, state.audited, upper, outcome)
        if verdict in (Verdict.RAISED, Verdict.OFF):
            webhook = snapshot.policy.spend.webhook_url
            self.gw.alerts.raise_alert("cache_false_hits", verdict.value, str(webhook) if webhook else None,
                                       tenant=sample.tenant, model=sample.model, scope=sample.scope[:16],
                                       audited=state.audited, disagreed=state.disagreed, upper_bound=round(upper, 4),
                                       threshold=threshold)
