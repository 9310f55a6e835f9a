"""The cache audit's re-asks: each sampled semantic hit asked again of the engine, as batch work.

A sample (``gateway.cache.audit``) goes through ``pipeline.run`` as its tenant's batch-class request, at
temperature 0, with ``Cache-Control: no-cache, no-store`` (never answered by the cache it audits, never stored in
it): the scheduler grants batch work only capacity that premium and standard traffic leave, so an audit never
runs ahead of a live request. It is metered like any request, under the key id ``cache-audit``, so the ledger
shows what auditing costs. The fresh answer is compared with the one served, and the cache counts the verdict.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import orjson

from gateway import pipeline
from gateway.cache.audit import Sample, Verdict
from gateway.context import RequestContext
from gateway.endpoints import SERVED, Endpoint
from gateway.runtime import Gateway
from gateway.sink import BufferSink

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
        """Ask the sample again and judge it; None when it could not be asked (the tenant left, the engine
        refused or failed): an audit that did not run counts nothing. A disagreement asks the entry's own
        question again too, to tell a false match from an entry that answers nothing it was asked."""
        cache, snapshot = self.gw.cache, self.gw.store.current
        endpoint = _BY_NAME.get(sample.endpoint)
        if cache is None or endpoint is None or sample.tenant not in snapshot.tenants:
            return None
        spec = snapshot.policy.cache
        fresh = await self._ask(endpoint, sample.tenant, sample.body)
        if fresh is None:
            return None
        agreement = await cache.agreement(sample.answer, fresh)
        agreed, stale, own = agreement >= spec.audit.agree_at, False, None
        if not agreed:
            control = endpoint.asking(sample.body, sample.cached_question, spec)
            answer = await self._ask(endpoint, sample.tenant, control) if control is not None else None
            if answer is not None:
                own = await cache.agreement(sample.answer, answer)
                stale = own < spec.audit.agree_at
        verdict = await cache.audited(sample, agreed, stale, spec)
        if verdict is not Verdict.AGREED:
            self._tell(sample, verdict, agreement, own)
        return verdict

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

    def _tell(self, sample: Sample, verdict: Verdict, agreement: float, own: float | None) -> None:
        """The log line for every wrong hit found, and an alert when a scope's threshold moved."""
        cache, snapshot = self.gw.cache, self.gw.store.current
        assert cache is not None
        spec = snapshot.policy.cache
        state = cache.audits.scopes[sample.scope]
        upper = state.upper_bound(spec.audit.confidence)
        threshold = cache.audits.threshold(sample.scope, spec.threshold)
        outcome = {Verdict.STALE: "the entry does not answer its own question either (threshold kept)",
                   Verdict.WRONG: "threshold kept", Verdict.RAISED: f"threshold raised to {threshold}",
                   Verdict.OFF: "semantic layer turned off"}[verdict]
        # no question text in the log (it is a tenant's content): /admin/cache shows the last wrong pair to admins
        log.warning("cache audit: a wrong semantic hit for tenant %s (%s), purged: similarity %.4f; the answers agree "
                    "%.3f, with its own question's %s; scope %s: %d of %d audits wrong, upper bound %.3f; %s",
                    sample.tenant, sample.model, sample.similarity, agreement, "n/a" if own is None else f"{own:.3f}",
                    sample.scope[:16], state.disagreed, state.audited, upper, outcome)
        if verdict in (Verdict.RAISED, Verdict.OFF):
            webhook = snapshot.policy.spend.webhook_url
            self.gw.alerts.raise_alert("cache_false_hits", verdict.value, str(webhook) if webhook else None,
                                       tenant=sample.tenant, model=sample.model, scope=sample.scope[:16],
                                       audited=state.audited, disagreed=state.disagreed, upper_bound=round(upper, 4),
                                       threshold=threshold)
