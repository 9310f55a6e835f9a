"""Alerts (budget thresholds, cost anomalies, spend rate): kept, logged, counted, and POSTed to the webhook.

``raise_alert`` is called on the event loop and does no I/O; a background task appends each new alert to
``<data_dir>/alerts.jsonl`` (so /admin/anomalies survives a restart) and delivers the webhook with a few
retries. A slow or failing webhook only delays its own deliveries.

Alerts are grouped, because a tenant that sends a thousand anomalous requests is one incident, not a thousand:
the same tenant, kind and action within ``GROUP_S`` of the group's first alert add to its ``count`` (and
``last_time``, and the latest details) instead of making a new one, so there is one log line and one webhook
per group. Webhooks are also rate-limited overall (``WEBHOOKS_PER_MINUTE``), so many tenants at once cannot
flood the receiver, and the list keeps ``KEEP_PER_TENANT`` alerts of each tenant, so one tenant's flood
cannot push another's alerts out of /admin/anomalies.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.ops.metrics import GatewayMetrics

log = logging.getLogger("tollgate.alerts")
GROUP_S = 300.0
KEEP_PER_TENANT = 200
WEBHOOKS_PER_MINUTE = 60


class Alerts:
    def __init__(self, metrics: GatewayMetrics, path: Path | None, clock: Any = time.time) -> None:
        self.metrics = metrics
        self.path = path
        self.clock = clock
        self._by_tenant: dict[str, collections.deque[dict[str, Any]]] = {}
        self._open: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}  # group -> (opened, alert)
        self._order = itertools.count()
        self._sent: collections.deque[float] = collections.deque()  # webhook deliveries in the last minute
        self._queue: asyncio.Queue[tuple[dict[str, Any], str | None]] = asyncio.Queue(maxsize=10_000)
        if path is not None and path.exists():
            for line in path.read_bytes().splitlines()[-KEEP_PER_TENANT * 20:]:
                try:
                    self._keep(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue

    @property
    def recent(self) -> list[dict[str, Any]]:
        """Every kept alert, oldest first."""
        return sorted((a for kept in self._by_tenant.values() for a in kept), key=lambda a: a.get("_seq", 0))

    def raise_alert(self, kind: str, action: str, webhook: str | None, **details: Any) -> dict[str, Any]:
        now = self.clock()
        self.metrics.anomalies.labels(kind, action).inc()
        group = (str(details.get("tenant") or ""), kind, action)
        opened = self._open.get(group)
        if opened is not None and now - opened[0] < GROUP_S:
            alert = opened[1]
            alert["count"] += 1
            alert["last_time"] = _stamp(now)
            alert.update(details)
            return alert
        alert = {"time": _stamp(now), "kind": kind, "action": action, **details, "count": 1,
                 "last_time": _stamp(now)}
        self._open[group] = (now, alert)
        self._keep(alert)
        log.warning("alert %s (%s): %s", kind, action, details)
        if webhook and not self._may_send(now):
            log.error("webhook rate limit (%d a minute): alert %s for %s not delivered", WEBHOOKS_PER_MINUTE, kind,
                      group[0])
            webhook = None
        try:
            self._queue.put_nowait((alert, webhook))
        except asyncio.QueueFull:
            log.error("alert queue full: %s not persisted or delivered", kind)
        return alert

    def _keep(self, alert: dict[str, Any]) -> None:
        alert["_seq"] = next(self._order)
        tenant = str(alert.get("tenant") or "")
        kept = self._by_tenant.get(tenant)
        if kept is None:
            kept = self._by_tenant[tenant] = collections.deque(maxlen=KEEP_PER_TENANT)
        kept.append(alert)

    def _may_send(self, now: float) -> bool:
        while self._sent and now - self._sent[0] >= 60:
            self._sent.popleft()
        if len(self._sent) >= WEBHOOKS_PER_MINUTE:
            return False
        self._sent.append(now)
        return True

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                alert, webhook = await self._queue.get()
                if self.path is not None:
                    await asyncio.to_thread(_append, self.path, orjson.dumps(public(alert)) + b"\n")
                if webhook:
                    await self._deliver(client, webhook, public(alert))

    async def _deliver(self, client: httpx.AsyncClient, url: str, alert: dict[str, Any]) -> None:
        for attempt in range(3):
            try:
                response = await client.post(url, json={"source": "tollgate", "alert": alert})
                if response.status_code < 500:
                    return
            except httpx.HTTPError as exc:
                log.warning("webhook %s failed: %s", url, exc)
            await asyncio.sleep(0.5 * 2 ** attempt)
        log.error("webhook %s: alert %s not delivered after 3 tries", url, alert["kind"])


def public(alert: dict[str, Any]) -> dict[str, Any]:
    """An alert as it is shown and sent (without the order it is kept in)."""
    return {k: v for k, v in alert.items() if k != "_seq"}


def _stamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def _append(path: Path, line: bytes) -> None:
    with path.open("ab") as f:
        f.write(line)
