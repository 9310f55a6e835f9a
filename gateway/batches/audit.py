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
from gateway.endpoints import SERVED
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
        refused or failed): an audit that did not run counts nothing."""
        gw, cache = self.gw, self.gw.cache
        snapshot = gw.store.current
        tenant = snapshot.tenants.get(sample.tenant)
        endpoint = _BY_NAME.get(sample.endpoint)
        if cache is None or tenant is None or endpoint is None:
            return None
        body: dict[str, Any] = {k: v for k, v in sample.body.items() if k not in _DROPPED}
        body["temperature"] = 0
        ctx = RequestContext(f"audit-{next(self._ids):x}", snapshot, endpoint)
        ctx.tenant, ctx.key_id = tenant, KEY_ID
        sink = BufferSink()
        async with pipeline.Lifecycle(gw, ctx, sink):
            await pipeline.run(gw, ctx, orjson.dumps(body), sink, b"no-cache, no-store", "batch")
        if sink.error is not None or sink.status != 200:
            return None
        try:
            parsed = endpoint.answer_from_json(b"".join(sink.chunks))
        except ValueError:
            return None
        if parsed is None:
            return None
        spec = gw.store.current.policy.cache
        agreement = await cache.agreement(sample.answer, parsed[0])
        verdict = await cache.audited(sample, agreement, spec)
        if verdict is not Verdict.AGREED:
            state = cache.audits.scopes[sample.scope]
            upper = state.upper_bound(spec.audit.confidence)
            threshold = cache.audits.threshold(sample.scope, spec.threshold)
            log.warning("cache audit: a wrong semantic hit for tenant %s (%s), purged: asked %r, served the answer "
                        "to %r (similarity %.4f, answers agree %.3f); scope %s: %d of %d audits wrong, upper bound "
                        "%.3f; %s", sample.tenant, sample.model, sample.question, sample.cached_question,
                        sample.similarity, agreement, sample.scope[:16], state.disagreed, state.audited, upper,
                        {Verdict.WRONG: "threshold kept", Verdict.RAISED: f"threshold raised to {threshold}",
                         Verdict.OFF: "semantic layer turned off"}[verdict])
            if verdict is not Verdict.WRONG:
                webhook = snapshot.policy.spend.webhook_url
                gw.alerts.raise_alert("cache_false_hits", verdict.value, str(webhook) if webhook else None,
                                      tenant=sample.tenant,
                                      model=sample.model, scope=sample.scope[:16], audited=state.audited,
                                      disagreed=state.disagreed, upper_bound=round(upper, 4), threshold=threshold)
        return verdict
