"""The GPU report's measure against a real vLLM engine's own time: the spans the ledger keeps of each request on
its worker, summed, against the engine's own end-to-end request time; and the tenants' shares of moments they
ran in together (each moment's cost shared among the sequences running)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.conftest import DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, Proc, metric_value, patient, policy_dict, wait_for

pytestmark = pytest.mark.vllm
MODEL = "tiny-llama"


def test_the_ledger_spans_agree_with_the_engines_own_time(vllm_server: Any,
                                                         start_gateway: Callable[..., Proc]) -> None:
    gateway = start_gateway(patient(policy_dict([vllm_server.url], model=MODEL, gpu_usd_per_hour=36.0)))
    engine_before = metric_value(vllm_server.url, "vllm:e2e_request_latency_seconds_sum")
    start = time.time()

    async def traffic() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            async def ask(key: str, tokens: int, i: int) -> None:
                r = await client.post(gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                      json={"model": MODEL, "max_tokens": tokens, "ignore_eos": True,
                                            "temperature": 0.7, "messages": [{"role": "user", "content": f"q{i}"}]})
                assert r.status_code == 200, r.text

            async def lane(key: str, tokens: int, n: int, lane: int) -> None:
                for i in range(n):
                    await ask(key, tokens, lane * 100 + i)

            # four lanes of the same work, in the engine's batch together to the end: demo one, prem three. Lanes
            # of unequal request counts (the benchmark's three times the decode tokens, loadtest/RESULTS.md) end
            # apart on a loaded machine, where a lane of many short requests waits between them, and the last
            # lane running alone rightly pays the whole of those moments: a share this test would read as noise
            await asyncio.gather(*(lane(key, 120, 6, n) for n, key in
                                   enumerate((DEMO_KEY, PREMIUM_KEY, PREMIUM_KEY, PREMIUM_KEY))))

    asyncio.run(traffic())
    engine_seconds = metric_value(vllm_server.url, "vllm:e2e_request_latency_seconds_sum") - engine_before
    finance = {"Authorization": f"Bearer {FINANCE_TOKEN}"}
    # a record is stamped when the gateway finishes the request, which is after the client read its last byte:
    # the window ends when the report is read, not when the traffic ended
    window = {"from": datetime.fromtimestamp(start, UTC).isoformat()}
    out: dict[str, Any] = {}

    def settled() -> bool:
        nonlocal out
        window["to"] = datetime.now(UTC).isoformat()
        out = httpx.get(gateway.url + "/admin/reports/gpu", params=window, headers=finance, timeout=30).json()
        return out["total"]["requests"] == 24

    assert wait_for(settled, timeout=20), out.get("total", out)
    records = httpx.get(gateway.url + "/admin/ledger", params=window, headers=finance, timeout=30).json()["data"]
    ledger_seconds = sum(r["worker_ms"] for r in records) / 1000
    # the gateway's span of a request holds the engine's, plus what vLLM's own front end does outside its e2e
    # metric (the HTTP request, the chat template and tokenizing before the engine stamps its arrival, the answer's
    # serialisation after) and the loopback: a few per cent, and a fixed part a request that a loaded 2-core host
    # stretches (37 ms a request in one CI run, where a 0.2 s allowance for all 24 was exceeded)
    assert engine_seconds <= ledger_seconds <= engine_seconds * 1.1 + 0.05 * len(records), \
        (ledger_seconds, engine_seconds)
    rows = {r["tenant"]: r for r in out["data"] if r["kind"] == "usage"}
    # three lanes against one of the same work: three to one, within what a CPU engine's time does run to run
    # beside the suite's other processes (a lane's share moved by a fifth: 3.62 and 2.28 were seen in CI runs; the
    # benchmark measures it, loadtest/RESULTS.md). An even split by tenant (1), or all to one of them, is far outside.
    assert 2.0 <= rows["prem"]["gpu_cost_usd"] / rows["demo"]["gpu_cost_usd"] <= 4.5, rows
    assert abs(out["reconciliation"]["difference_usd"]) < 1e-9
