"""Budgets across replicas (one Redis, one PostgreSQL) and the cost-anomaly rule, on gateway processes."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from gateway.auth import hash_key
from tests.conftest import ADMIN_TOKEN, Proc, on_shared_state, policy_dict, wait_for

MODEL = "sim-llama-8b"


def with_tenant(policy: dict[str, Any], name: str, key: str, **extra: Any) -> dict[str, Any]:
    policy["tenants"][name] = {"tier": "standard", "keys": ["sha256:" + hash_key(key)], "models": ["*"], **extra}
    return policy


def ask(url: str, key: str, max_tokens: int, content: str = "How are you today?") -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": content}],
                            "max_tokens": max_tokens})


@pytest.fixture
def sim(start_sim: Callable[..., Proc]) -> Proc:
    return start_sim("--decode-base-ms", "10")


def test_a_budget_holds_across_two_replicas(start_gateway: Callable[..., Proc], sim: Proc,
                                            pg_dsn: str) -> None:
    tenant, key = f"budget-{uuid.uuid4().hex[:8]}", "tg-test-budget-key-" + uuid.uuid4().hex
    limit = 0.0005
    policy = with_tenant(policy_dict([sim.url]), tenant, key, budget={"period": "day", "limit_usd": limit})
    on_shared_state(policy, pg_dsn)  # every 429 here is the budget's, none the queue's
    replicas = [start_gateway(policy), start_gateway(policy)]

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda i: ask(replicas[i % 2].url, key, 50), range(50)))
    ok = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(ok) + len(refused) == 50 and ok and refused
    for answer in refused:
        error = answer.json()["error"]
        assert error["code"] == "insufficient_quota" and error["type"] == "insufficient_quota"
        assert tenant in error["message"]

    def spent() -> tuple[int, float]:
        with psycopg.connect(pg_dsn) as db:
            row = db.execute("SELECT count(*), coalesce(sum(cost_usd), 0) FROM ledger WHERE tenant = %s",
                             (tenant,)).fetchone()
            assert row is not None
            return int(row[0]), float(row[1])
    assert wait_for(lambda: spent()[0] == 50, timeout=15)
    one_reservation = (100 * 0.3 + 50 * 0.9) / 1e6  # a worst case: a ~400-byte body's prompt estimate + 50 out
    assert spent()[1] <= limit + one_reservation
    assert spent()[1] >= limit * 0.5, "the budget was used, not refused from the start"


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local webhook receiver: (url, the JSON bodies it got)."""
    got: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()


@pytest.mark.parametrize("action", ["reject", "clamp"])
def test_one_request_far_above_the_baseline_fires_the_action_once(
        start_gateway: Callable[..., Proc], sim: Proc, receiver: tuple[str, list[dict[str, Any]]],
        action: str) -> None:
    url, got = receiver
    tenant, key = f"steady-{action}", f"tg-test-steady-{action}-key"
    policy = with_tenant(policy_dict([sim.url]), tenant, key,
                         anomaly={"k": 10, "action": action, "min_samples": 20})
    policy["spend"] = {"webhook_url": url}
    gateway = start_gateway(policy)
    for _ in range(25):
        assert ask(gateway.url, key, 8).status_code == 200
    big = ask(gateway.url, key, 8 * 20)
    if action == "reject":
        assert big.status_code == 400 and big.json()["error"]["code"] == "cost_anomaly"
        assert "usual" in big.json()["error"]["message"]
    else:
        assert big.status_code == 200
        fitted = int(big.headers["x-tollgate-max-tokens"].split("value=")[1])
        assert big.headers["x-tollgate-max-tokens"].startswith("clamped-anomaly")
        assert 8 < fitted < 160 and big.json()["usage"]["completion_tokens"] == fitted
    assert ask(gateway.url, key, 8).status_code == 200, "the steady traffic goes on"

    assert wait_for(lambda: len(got) >= 1, timeout=10)
    assert len(got) == 1, "fired once"
    alert = got[0]["alert"]
    assert (alert["kind"], alert["action"], alert["tenant"]) == ("request_cost", action, tenant)
    assert alert["worst_case_usd"] > 10 * alert["baseline_usd"]
    listed = httpx.get(gateway.url + "/admin/anomalies", params={"tenant": tenant},
                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["data"]
    assert [a["action"] for a in listed] == [action]
    metrics = httpx.get(gateway.url + "/metrics").text
    assert f'tollgate_cost_anomalies_total{{action="{action}",kind="request_cost"}} 1.0' in metrics


def test_the_budget_alert_fires_once_at_its_threshold(start_gateway: Callable[..., Proc], sim: Proc,
                                                      receiver: tuple[str, list[dict[str, Any]]]) -> None:
    url, got = receiver
    tenant, key = f"alerted-{uuid.uuid4().hex[:8]}", "tg-test-alerted-" + uuid.uuid4().hex
    policy = with_tenant(policy_dict([sim.url]), tenant, key,
                         budget={"period": "month", "limit_usd": 0.001, "alert_at": 0.5})
    policy["spend"] = {"webhook_url": url}
    gateway = start_gateway(policy)
    answers = [ask(gateway.url, key, 50).status_code for _ in range(30)]
    assert answers[0] == 200 and 429 in answers, "the budget ran out"
    assert wait_for(lambda: any(g["alert"]["kind"] == "budget" for g in got), timeout=10)
    budget_alerts = [g["alert"] for g in got if g["alert"]["kind"] == "budget"]
    assert len(budget_alerts) == 1, "once per period"
    assert budget_alerts[0]["tenant"] == tenant and budget_alerts[0]["spent_usd"] >= 0.0005
    remaining = [line for line in httpx.get(gateway.url + "/metrics").text.splitlines()
                 if line.startswith(f'tollgate_budget_remaining_usd{{tenant="{tenant}"}}')]
    assert remaining and float(remaining[0].split()[-1]) < 0.0005
