"""Alerts (budget thresholds, cost anomalies): kept, logged, counted, and POSTed to the policy's webhook.

``raise_alert`` is called on the event loop and does no I/O; a background task appends each alert to
``<data_dir>/alerts.jsonl`` (so /admin/anomalies survives a restart) and delivers the webhook with a few
retries. A slow or failing webhook only delays its own deliveries.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.ops.metrics import GatewayMetrics

log = logging.getLogger("tollgate.alerts")
KEEP = 1000  # recent alerts listed by /admin/anomalies


class Alerts:
    def __init__(self, metrics: GatewayMetrics, path: Path | None) -> None:
        self.metrics = metrics
        self.path = path
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP)
        self._queue: asyncio.Queue[tuple[dict[str, Any], str | None]] = asyncio.Queue(maxsize=10_000)
        if path is not None and path.exists():
            for line in path.read_bytes().splitlines()[-KEEP:]:
                try:
                    self.recent.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue

    def raise_alert(self, kind: str, action: str, webhook: str | None, **details: Any) -> dict[str, Any]:
        alert = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kind": kind, "action": action,
                 **details}
        self.recent.append(alert)
        self.metrics.anomalies.labels(kind, action).inc()
        log.warning("alert %s (%s): %s", kind, action, details)
        try:
            self._queue.put_nowait((alert, webhook))
        except asyncio.QueueFull:
            log.error("alert queue full: %s not persisted or delivered", kind)
        return alert

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                alert, webhook = await self._queue.get()
                if self.path is not None:
                    await asyncio.to_thread(_append, self.path, orjson.dumps(alert) + b"\n")
                if webhook:
                    await self._deliver(client, webhook, alert)

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


def _append(path: Path, line: bytes) -> None:
    with path.open("ab") as f:
        f.write(line)
