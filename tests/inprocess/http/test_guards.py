"""One guard per role: the admin API can be off, the reports open to the finance or the admin token (a tenant is
sent to /v1/usage), and /metrics needs a token only when the policy names one."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from gateway.auth import hash_key
from gateway.http.app import create_app
from gateway.http.guards import holds_report_token
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, FINANCE_TOKEN, policy_dict

METRICS_TOKEN = "tg-test-metrics-token"


def snapshot(**server: Any) -> PolicySnapshot:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["server"].update(server)
    return PolicySnapshot.build(Policy.model_validate(policy), "test")


def answers(snap: PolicySnapshot, *requests: tuple[str, str | None]) -> list[tuple[int, str | None]]:
    """(status, error code) for each (path, bearer token) GET, through the app (its gateway not started: the
    guards answer before anything needs it)."""
    async def main() -> list[tuple[int, str | None]]:
        transport = httpx.ASGITransport(app=create_app(PolicyStore(snap)))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            seen = []
            for path, token in requests:
                reply = await client.get(path, headers={"authorization": f"Bearer {token}"} if token else {})
                seen.append((reply.status_code, reply.json()["error"]["code"] if reply.status_code >= 400 else None))
            return seen
    return asyncio.run(main())


def test_without_an_admin_token_in_the_policy_the_admin_api_is_off_for_everyone() -> None:
    assert answers(snapshot(admin_token_sha256=None), ("/admin/policy/status", ADMIN_TOKEN),
                   ("/admin/policy/status", None)) == [(403, "admin_disabled"), (403, "admin_disabled")]


def test_the_reports_open_to_finance_and_admin_and_send_a_tenant_elsewhere() -> None:
    seen = answers(snapshot(), ("/admin/reports/costs", FINANCE_TOKEN), ("/admin/reports/costs", ADMIN_TOKEN),
                   ("/admin/reports/costs", DEMO_KEY), ("/admin/reports/costs", "tg-nobody"))
    assert seen == [(409, "ledger_disabled"), (409, "ledger_disabled"), (403, "forbidden"),
                    (401, "invalid_finance_token")], "past the guard, this app has no ledger: 409"


def test_the_finance_token_is_not_an_admin_token() -> None:
    snap = snapshot()
    assert holds_report_token(f"Bearer {FINANCE_TOKEN}".encode(), snap)
    assert holds_report_token(f"Bearer {ADMIN_TOKEN}".encode(), snap)
    assert not holds_report_token(f"Bearer {DEMO_KEY}".encode(), snap) and not holds_report_token(None, snap)
    assert answers(snap, ("/admin/policy/status", FINANCE_TOKEN)) == [(403, "permission_denied")]


def test_metrics_need_a_token_only_when_the_policy_sets_one() -> None:
    guarded = snapshot(metrics_token_sha256="sha256:" + hash_key(METRICS_TOKEN))
    assert answers(guarded, ("/metrics", None), ("/metrics", ADMIN_TOKEN), ("/metrics", METRICS_TOKEN)) == [
        (401, "invalid_metrics_token"), (401, "invalid_metrics_token"), (200, None)]
    assert answers(snapshot(), ("/metrics", None)) == [(200, None)]
