"""Closing and reopening a month through the app in-process, over a real SQLite ledger: the first close is refused
before the ledger began (1970-01 on a ledger of this autumn), a close and a reopen are each in the audit log with
who (the admin token's id), from where (the peer, and what a proxy said only when it is trusted) and the month's
totals, only the latest closed month reopens, and finance may read but neither close nor reopen."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from gateway.auth import hash_key
from gateway.http.app import create_app
from gateway.ledger.stores import COLUMNS
from gateway.ledger.times import at
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, FINANCE_TOKEN, policy_dict

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
FINANCE = {"authorization": f"Bearer {FINANCE_TOKEN}"}
ADMIN_ID = "admin:" + hash_key(ADMIN_TOKEN)[:12]
CLOSE, REOPEN = "/admin/statements/close", "/admin/statements/reopen"


def months_back(n: int) -> tuple[str, float]:
    """The month ``n`` before this one (UTC), and a moment in it."""
    first = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for _ in range(n):
        first = (first - timedelta(days=1)).replace(day=1)
    return first.strftime("%Y-%m"), (first + timedelta(days=3, hours=10)).timestamp()


def record(n: int, tenant: str, when: float, cost: float) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    return row | {"id": f"rec-{n:04d}", "request_id": f"req-{n}", "time": at(when), "tenant": tenant,
                  "tier": "standard", "service_class": "standard", "model": "sim-llama-8b", "endpoint": "chat",
                  "stream": False, "status": 200, "prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 0,
                  "estimated": False, "cost_usd": cost, "worker": None}


def calls(data_dir: Path, *asks: tuple[str, str, dict[str, str], dict[str, str]],
          policy: dict[str, Any] | None = None, peer: tuple[str, int] = ("127.0.0.1", 5000)) -> list[httpx.Response]:
    """Each (method, path, params, headers) in turn against one app on ``data_dir``'s ledger (two months ago:
    two records, last month: one), called from ``peer``; the audit log read last."""
    data_dir.mkdir(exist_ok=True)
    made = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(
        policy or policy_dict(["http://127.0.0.1:9"])), "test")), data_dir)
    assert made.gateway.ledger is not None
    (_, older), (_, last) = months_back(2), months_back(1)
    made.gateway.ledger.store.insert([record(1, "demo", older, 0.25), record(2, "prem", older + 60, 0.5),
                                      record(3, "demo", last, 1.0)])

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=made, client=peer)  # type: ignore[arg-type]
        async with made.gateway.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            out = [await client.request(method, path, params=params, headers=headers)
                   for method, path, params, headers in asks]
            out.append(await client.get("/admin/audit", headers=ADMIN))
            return out
    return asyncio.run(main())


def test_a_first_close_before_the_ledger_began_is_refused_and_names_its_first_month(tmp_path: Path) -> None:
    older, _ = months_back(2)
    before, _ = months_back(3)
    first, epoch, refused_too, audit = calls(
        tmp_path, ("POST", CLOSE, {"month": "1970-01"}, ADMIN), ("POST", CLOSE, {"month": before}, ADMIN),
        ("GET", "/admin/statements/closes", {}, FINANCE))
    for reply, month in ((first, "1970-01"), (epoch, before)):
        assert reply.status_code == 409, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("month_before_ledger", "month")
        assert f"{month} is before the ledger began (its first record is in {older})" in error["message"]
    assert refused_too.json()["data"] == [], "nothing closed"
    assert audit.json()["data"] == [], "a refused close changes nothing and is not an action"


def test_a_close_and_a_reopen_are_audited_with_who_where_and_the_totals(tmp_path: Path) -> None:
    older, _ = months_back(2)
    spoofed = {**ADMIN, "x-forwarded-for": "203.0.113.66"}  # from a peer no policy trusts: its word only
    closed, as_finance, reopened, closed_again, audit = calls(
        tmp_path, ("POST", CLOSE, {"month": older}, spoofed), ("POST", REOPEN, {"month": older}, FINANCE),
        ("POST", REOPEN, {"month": older}, spoofed), ("POST", CLOSE, {"month": older}, ADMIN))
    assert closed.status_code == 200, closed.text
    assert closed.json()["total"]["requests"] == 2 and closed.json()["total"]["cost_usd"] == 0.75
    assert as_finance.status_code == 403
    assert reopened.status_code == 200, reopened.text
    assert (reopened.json()["month"], reopened.json()["closed_at"]) == (older, closed.json()["closed_at"])
    assert closed_again.status_code == 200, "a reopened month closes again"
    entries = audit.json()["data"]
    assert [(e["action"], e["target"]) for e in entries] == [
        ("statement.close", older), ("statement.reopen", older), ("statement.close", older)], "newest first"
    again, reopen, first = entries
    for entry in entries:
        assert entry["actor"] == ADMIN_ID, "the token's id, as every audited action names it"
        assert (entry["client"], entry["peer"]) == ("127.0.0.1", "127.0.0.1"), "the header was not believed"
        assert entry["details"]["month"] == older
    assert "203.0.113.66" not in audit.text
    assert first["details"]["total"] == closed.json()["total"] == reopen["details"]["total"]
    assert first["details"]["closed_at"] == closed.json()["closed_at"] == reopen["details"]["closed_at"]
    assert again["details"]["total"] == closed_again.json()["total"]


def test_only_the_latest_closed_month_reopens(tmp_path: Path) -> None:
    older, _ = months_back(2)
    last, _ = months_back(1)
    replies = calls(tmp_path, ("POST", CLOSE, {"month": older}, ADMIN), ("POST", CLOSE, {"month": last}, ADMIN),
                    ("POST", REOPEN, {"month": older}, ADMIN), ("POST", REOPEN, {"month": "2020-01"}, ADMIN),
                    ("POST", REOPEN, {"month": "nope"}, ADMIN), ("POST", REOPEN, {}, ADMIN),
                    ("POST", REOPEN, {"month": last}, ADMIN), ("POST", REOPEN, {"month": older}, ADMIN),
                    ("GET", "/admin/statements/closes", {}, FINANCE))
    first, second, early, never, bad, missing, latest, then, listed, audit = replies
    assert first.status_code == second.status_code == 200
    assert early.status_code == 409 and early.json()["error"]["code"] == "reopen_out_of_order"
    assert f"reopen {last} first" in early.json()["error"]["message"]
    assert never.status_code == 409 and never.json()["error"]["code"] == "month_not_closed"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "month"
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "missing_month"
    assert latest.status_code == 200 and then.status_code == 200, "the latest, then the one before it"
    assert listed.json()["data"] == []
    assert [e["action"] for e in audit.json()["data"]] == [
        "statement.reopen", "statement.reopen", "statement.close", "statement.close"], "refusals change nothing"


def test_behind_a_trusted_proxy_the_audit_names_the_caller_beside_the_proxy(tmp_path: Path) -> None:
    older, _ = months_back(2)
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["server"]["trusted_proxies"] = ["10.1.2.3/32"]
    closed, audit = calls(tmp_path, ("POST", CLOSE, {"month": older}, {**ADMIN, "x-forwarded-for": "198.51.100.9"}),
                          policy=policy, peer=("10.1.2.3", 4444))
    assert closed.status_code == 200
    (entry,) = audit.json()["data"]
    assert (entry["client"], entry["peer"]) == ("198.51.100.9", "10.1.2.3")
