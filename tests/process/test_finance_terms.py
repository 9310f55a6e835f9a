"""Finance in its own terms, over HTTP against a gateway process on a simulated worker: a tenant's drill-down and
its one-tenant statement (printable page, JSON and workbook) show that tenant's GPU cost alone, never the fleet's
idle hours or another tenant's; a key is named as it was created, with its id beside it; the cache audit's key is
said to be the cache's own check; a key's own budget is in the burn-down, spent as the ledger says."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openpyxl

from gateway.finance import labels, money
from gateway.ledger.stores import COLUMNS, SqliteLedger
from gateway.ledger.times import at
from tests.conftest import ADMIN_TOKEN, FINANCE_TOKEN, PREMIUM_KEY, Proc, policy_dict, wait_for

MODEL = "sim-llama-8b"
FINANCE = {"Authorization": f"Bearer {FINANCE_TOKEN}"}


def ask(gateway: Proc, key: str, n: int) -> None:
    for i in range(n):
        answer = httpx.post(gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                            json={"model": MODEL, "max_tokens": 12 + i,
                                  "messages": [{"role": "user", "content": f"question {i}"}]}, timeout=30)
        assert answer.status_code == 200, answer.text


def audit_record(worker: str) -> dict[str, Any]:
    """A cache audit's re-ask as the ledger meters it (gateway.batches.audit: key id ``cache-audit``)."""
    when = datetime.now(UTC) - timedelta(minutes=1)
    return dict.fromkeys(COLUMNS) | {
        "id": "audit-1", "request_id": "audit-req-1", "time": at(when.timestamp()), "tenant": "demo",
        "key_id": labels.AUDIT_KEY, "tier": "standard", "service_class": "batch", "model": MODEL,
        "endpoint": "chat", "stream": False, "status": 200, "prompt_tokens": 30, "completion_tokens": 10,
        "cached_tokens": 0, "estimated": False, "cost_usd": 0.0004, "worker": worker, "worker_ms": 200.0,
        "total_ms": 200.0}


def cells(html: str, test_id: str) -> list[list[str]]:
    rows = re.findall(rf'<tr[^>]*data-testid="{test_id}"[^>]*>(.*?)</tr>', html)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row)] for row in rows]


def test_a_tenant_sees_its_own_gpu_cost_its_keys_by_name_and_their_budgets(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    from gateway.batches.audit import KEY_ID

    assert labels.AUDIT_KEY == KEY_ID, "finance names the key the cache audit is metered under"
    sim = start_sim("--decode-base-ms", "2")
    data_dir = tmp_path / "gateway-data"
    gateway = start_gateway(policy_dict([sim.url], gpu_usd_per_hour=36.0), data_dir=data_dir)
    made = httpx.post(gateway.url + "/admin/keys", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                      json={"tenant": "demo", "name": "search-prod", "budget": {"period": "month",
                                                                               "limit_usd": 5.0}})
    assert made.status_code == 201, made.text
    key, kid = made.json()["key"], made.json()["id"]
    ask(gateway, key, 4)
    ask(gateway, PREMIUM_KEY, 3)
    ledger = SqliteLedger(data_dir / "ledger.sqlite3")
    try:
        ledger.insert([audit_record(sim.url)])
    finally:
        ledger.close()
    month = f"{datetime.now(UTC):%Y-%m}"

    def by_key() -> list[dict[str, Any]]:
        return httpx.get(gateway.url + "/admin/reports/costs", headers=FINANCE,
                         params={"group_by": "key", "tenant": "demo", "month": month}).json()["data"]
    assert wait_for(lambda: sum(r["requests"] for r in by_key()) == 5, timeout=20)
    spent = {r["key_id"]: r["cost_usd"] for r in by_key()}

    # the drill-down: keys by name, the audit key said to be the cache's check, the key's own budget
    page = httpx.get(gateway.url + "/reports", params={"month": month, "tenant": "demo"}, headers=FINANCE,
                     timeout=60).text
    keys = {row[0]: row for row in cells(page, "drill-key")}
    assert set(keys) == {f"search-prod ({kid})", f"Cache audit ({labels.AUDIT_KEY})"}, keys
    assert keys[f"search-prod ({kid})"][4] == money.amount(spent[kid])
    assert "re-asking a sample of its hits" in page and 'data-testid="audit-key-note"' in page
    burn = {row[0]: row for row in cells(page, "budget-row")}
    assert burn[f"Key search-prod ({kid}) of demo"][1:4] == ["month", money.amount(spent[kid]), "5.00"], burn
    assert "No tenant or key has a budget" not in page

    # its GPU section: demo's cost alone, as the GPU report gives it for demo, and nothing of the fleet's
    every = httpx.get(gateway.url + "/admin/reports/gpu", headers=FINANCE, params={"month": month}).json()
    mine = httpx.get(gateway.url + "/admin/reports/gpu", headers=FINANCE,
                     params={"month": month, "tenant": "demo"}).json()
    assert {r["kind"] for r in mine["data"]} == {"usage"} and {r["tenant"] for r in mine["data"]} == {"demo"}
    assert "workers" not in mine and "reconciliation" not in mine
    assert any(r["kind"] == "idle" for r in every["data"]), "the fleet has idle hours that are not demo's"
    demo_gpu = sum(r["gpu_cost_usd"] for r in every["data"] if r.get("tenant") == "demo" and r["kind"] == "usage")
    assert demo_gpu > 0
    gpu_rows = cells(page, "gpu-tenant-row")
    assert [r[0] for r in gpu_rows] == ["demo"] and cells(page, "gpu-idle-row") == []
    assert cells(page, "gpu-worker-row") == [] and 'data-testid="cheapest"' not in page
    assert re.search(r'data-testid="gpu-total">([^<]*)<', page)[1] == money.amount(demo_gpu)  # type: ignore[index]
    everyone = httpx.get(gateway.url + "/reports", params={"month": month}, headers=FINANCE, timeout=60).text
    assert cells(everyone, "gpu-idle-row") and cells(everyone, "gpu-worker-row"), "the fleet's, on the fleet's page"

    # the one-tenant statement: its GPU cost, never the idle hours nor the fleet's reconciliation
    whole = httpx.get(gateway.url + "/admin/statements", params={"month": month}, headers=FINANCE, timeout=60).json()
    one = httpx.get(gateway.url + "/admin/statements", params={"month": month, "tenant": "demo"}, headers=FINANCE,
                    timeout=60).json()
    assert one["idle"] == [] and one["reconciliation"] is None and whole["idle"] and whole["reconciliation"]
    demo_line = next(r for r in whole["tenants"] if r["tenant"] == "demo")
    assert one["total"]["gpu_cost_usd"] == demo_line["gpu_cost_usd"] < whole["reconciliation"]["workers_cost_usd"]
    printed = httpx.get(gateway.url + "/admin/statements", params={"month": month, "tenant": "demo",
                                                                   "format": "html"}, headers=FINANCE).text
    assert "GPU idle by worker" not in printed and 'data-testid="reconciliation"' not in printed
    assert 'data-testid="own-gpu"' in printed
    assert cells(printed, "summary-total")[0][6] == money.amount(demo_line["gpu_cost_usd"])
    book = openpyxl.load_workbook(io.BytesIO(httpx.get(
        gateway.url + "/admin/statements", params={"month": month, "tenant": "demo", "format": "xlsx"},
        headers=FINANCE).content))
    assert "GPU idle by worker" not in book.sheetnames
    items = {r[0]: r[1] for r in book["Statement"].iter_rows(min_row=2, values_only=True)}
    assert items["GPU cost of demo (USD)"] == demo_line["gpu_cost_usd"]
    assert "Idle GPU cost (USD)" not in items and "Workers' hours at their rate (USD)" not in items
    csv_text = httpx.get(gateway.url + "/admin/statements", params={"month": month, "tenant": "demo",
                                                                    "format": "csv"}, headers=FINANCE).text
    assert ",idle," not in csv_text and "reconciliation" not in csv_text
