"""GET /admin/reports/gpu against gateway processes on simulated workers: the GPU hours shared among tenants by
what they ran, idle apart, the sum reconciled with the workers' hours at their rate, and replicas agreeing."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest

from gateway.finance import money
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, Proc, on_shared_state, policy_dict, wait_for

MODEL = "sim-llama-8b"
RATE = 36.0  # USD per worker-hour: a cent a second


def gpu_report(gateway: Proc, **params: str) -> httpx.Response:
    return httpx.get(gateway.url + "/admin/reports/gpu", params=params,
                     headers={"Authorization": f"Bearer {FINANCE_TOKEN}"}, timeout=30)


async def traffic(url: str, rounds: int = 3) -> None:
    """Both tenants in the same batches: prem asks three times the decode tokens of demo."""
    light = openai.AsyncOpenAI(base_url=url + "/v1", api_key=DEMO_KEY, max_retries=0)
    heavy = openai.AsyncOpenAI(base_url=url + "/v1", api_key=PREMIUM_KEY, max_retries=0)

    async def ask(client: openai.AsyncOpenAI, tokens: int, i: int) -> None:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q {i}"}],
                                             max_tokens=tokens, temperature=0.7)

    for r in range(rounds):
        await asyncio.gather(*(ask(light, 20, r * 100 + i) for i in range(6)),
                             *(ask(heavy, 60, r * 100 + i) for i in range(6)))
    await light.close()
    await heavy.close()


def stamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def settled(gateway: Proc, start: float, end: float, requests: int) -> dict[str, Any]:
    """The report once every record is in the ledger."""
    out: dict[str, Any] = {}

    def done() -> bool:
        nonlocal out
        out = gpu_report(gateway, **{"from": stamp(start), "to": stamp(end)}).json()
        return out.get("total", {}).get("requests") == requests

    assert wait_for(done, timeout=20), out
    return out


def test_tenants_pay_for_what_they_ran_and_idle_is_its_own_row(start_gateway: Callable[..., Proc],
                                                                start_sim: Callable[..., Proc]) -> None:
    sims = [start_sim("--decode-base-ms", "10") for _ in range(2)]
    gateway = start_gateway(policy_dict([s.url for s in sims], gpu_usd_per_hour=RATE))
    start = time.time()
    asyncio.run(traffic(gateway.url))
    end = time.time()
    out = settled(gateway, start, end, 36)

    rows = {r["tenant"]: r for r in out["data"] if r["kind"] == "usage"}
    assert rows["bulk"]["requests"] == 0 and rows["bulk"]["gpu_cost_usd"] == 0  # listed, though it ran nothing
    idle = [r for r in out["data"] if r["kind"] == "idle"]
    assert sorted(r["worker"] for r in idle) == sorted(s.url for s in sims)
    assert all(r["tenant"] == "(idle)" and r["gpu_cost_usd"] >= 0 for r in idle)
    ratio = rows["prem"]["gpu_cost_usd"] / rows["demo"]["gpu_cost_usd"]
    assert 2.0 < ratio < 4.5, rows  # three times the decode, in shared batches (the benchmark states it closely)
    rec = out["reconciliation"]
    assert abs(rec["difference_usd"]) < 1e-9
    assert rec["workers_cost_usd"] == pytest.approx(rec["attributed_usd"] + rec["idle_usd"], abs=3e-6)
    assert rec["idle_usd"] > 0
    for w in out["workers"]:  # paid from the period's start, busy or not (the gateway was up before it)
        assert w["configured_hours"] * 3600 == pytest.approx(end - start, abs=0.01)
        assert w["usd_per_hour"] == RATE
        assert w["cost_usd"] == pytest.approx(w["configured_hours"] * RATE, abs=1e-4)
        assert 0 < w["busy_hours"] <= w["configured_hours"]
    assert rows["prem"]["gpu_cost_per_1k_requests"] == pytest.approx(rows["prem"]["gpu_cost_usd"] * 1000 / 18,
                                                                      rel=1e-4)
    assert rows["prem"]["list_cost_usd"] > 0
    (pool,) = out["cheapest"]
    assert pool["pool"] == "main" and pool["workers_ran"] > 0 and pool["cost_needed_usd"] > 0

    by_worker = gpu_report(gateway, group_by="worker,tenant", format="csv",
                           **{"from": stamp(start), "to": stamp(end)})
    assert by_worker.status_code == 200
    assert "gpu_" in by_worker.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(by_worker.text)))
    assert {r["kind"] for r in table} == {"usage", "idle"}
    total = sum(float(r["gpu_cost_usd"]) for r in table)
    assert total == pytest.approx(rec["workers_cost_usd"], abs=1e-5)

    printed = subprocess.run([sys.executable, "-m", "gateway", "costs", "--gpu", "--url", gateway.url, "--token",
                              FINANCE_TOKEN, "--from", stamp(start), "--to", stamp(end)], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "COLUMNS": "120"})
    assert printed.returncode == 0, printed.stderr
    for text in ("(idle)", "prem", "demo", "Workers", "scaling rules would have run",
                 f"= workers' hours x rate {money.amount(rec['workers_cost_usd'])}"):
        assert text in printed.stdout, (text, printed.stdout)


def test_bad_parameters_are_400s(start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc]) -> None:
    gateway = start_gateway(policy_dict([start_sim().url]))
    for params in ({"from": "2026-11-30", "to": "2026-11-01"}, {"group_by": "colour"}, {"group_by": ""},
                   {"from": "yesterday"}, {"format": "xml"}, {"month": "2026-13"}, {"tenant": "nobody"},
                   {"month": "2026-11", "from": "2026-11-02"}):
        response = gpu_report(gateway, **params)
        assert response.status_code == 400, (params, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(gateway.url + "/admin/reports/gpu", headers={"Authorization": f"Bearer {DEMO_KEY}"}
                     ).status_code == 403


def test_two_replicas_on_one_postgres_ledger_answer_one_report(start_gateway: Callable[..., Proc],
                                                               start_sim: Callable[..., Proc], pg_dsn: str) -> None:
    sims = [start_sim("--decode-base-ms", "10") for _ in range(2)]
    policy = on_shared_state(policy_dict([s.url for s in sims], gpu_usd_per_hour=RATE), pg_dsn)
    replicas = [start_gateway(policy), start_gateway(policy)]
    start = time.time()
    asyncio.run(traffic(replicas[0].url, rounds=2))
    asyncio.run(traffic(replicas[1].url, rounds=1))
    end = time.time()
    reports: list[dict[str, Any]] = []

    def agree() -> bool:
        """Once both replicas' presence beats cover the period, whichever is asked answers the same report."""
        reports[:] = [settled(r, start, end, 36) for r in replicas]
        return reports[0] == reports[1]

    assert wait_for(agree, timeout=20, interval=0.5), reports
    for w in reports[0]["workers"]:  # both replicas saw each worker the whole time: its hours once, not twice
        assert w["configured_hours"] * 3600 == pytest.approx(end - start, abs=0.01)
    assert abs(reports[0]["reconciliation"]["difference_usd"]) < 1e-6
