"""A month of ledger records made up for the finance benchmarks and tests (a statement over an ordinary month)."""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.ledger.stores import COLUMNS, SqliteLedger
from gateway.ledger.times import at

TENANTS = ("bulk", "demo", "prem")


def seed_month(path: Path, first: datetime, records: int, users: int, worker: str, seed: int,
               prefix: str = "bench") -> None:
    """``records`` over the month's first 28 days: end user k belongs to tenant k % 3; one in 50 untagged; a few
    hundredths of a cent each, one in a thousand fifty cents (so a tenant's top cost centres are not all alike); a
    worker span of 0.4-2.4 s each. Written straight into the SQLite ledger of a data directory, before a gateway
    starts on it."""
    rng = random.Random(seed)
    span = 28 * 86400
    store = SqliteLedger(path)
    blank = dict.fromkeys(COLUMNS)
    batch: list[dict[str, Any]] = []
    for i in range(records):
        user = rng.randrange(users)
        batch.append(blank | {
            "id": f"{prefix}-{i:07d}", "request_id": f"{prefix}-req-{i}", "time": at(first.timestamp() + 60 +
                                                                               span * i / records),
            "tenant": TENANTS[user % 3], "key_id": f"key-{user % 3:012d}", "tier": "standard",
            "service_class": "standard", "model": "sim-llama-8b" if i % 5 else "other-model", "endpoint": "chat",
            "stream": bool(i % 2), "status": 200 if i % 97 else 500, "prompt_tokens": 20 + i % 300,
            "completion_tokens": 5 + i % 120, "cached_tokens": i % 7, "estimated": False,
            "cost_usd": (0.5 if i % 1000 == 0 else 0.0003) * (1 + i % 9), "worker": worker,
            "worker_ms": 400.0 + i % 2000, "total_ms": 500.0 + i % 2000, "queue_wait_ms": 1.0, "ttft_ms": 40.0,
            "tags": None if i % 50 == 0 else f"team=t{user % 4},user=u-{user}"})
        if len(batch) == 20_000:
            store.insert(batch)
            batch = []
    store.insert(batch)
    store.close()
