"""Runtime API keys on two gateway replicas sharing PostgreSQL and Redis, called with the real `openai` client: a
key made on A (with `tollgate keys create`) works on B; a key revoked through A's API is refused by B within a
second; a rotated key's old value works through its grace and stops after it; a key's own budget holds within
one reservation, across both replicas, as a tenant's does; the ledger names the key, so a report by key finds
it; the audit log (shared) lists every operation; a tenant's key on an admin route is 403."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx
import openai
import psycopg
import pytest

from gateway.auth import hash_key
from tests.conftest import ADMIN_TOKEN, FINANCE_TOKEN, ROOT, Proc, on_shared_state, policy_dict, wait_for

MODEL = "sim-llama-8b"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN_ID = "admin:" + hash_key(ADMIN_TOKEN)[:12]
PROPAGATION_LIMIT_S = 1.5  # the design's bound is one poll (0.25 s) and a query; room for a loaded machine


@pytest.fixture
def shared_dsn(pg_dsn: str) -> str:
    """The test database without the key and audit tables of an earlier run."""
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        for table in ("api_keys", "api_key_version", "admin_audit"):
            db.execute(f"DROP TABLE IF EXISTS {table}")
    return pg_dsn


def cli(url: str, *words: str) -> Any:
    """`tollgate keys ...` against a running gateway, its answer as JSON."""
    done = subprocess.run([sys.executable, "-m", "gateway", "keys", *words, "--url", url, "--json"], cwd=ROOT,
                          env={**os.environ, "TOLLGATE_ADMIN_TOKEN": ADMIN_TOKEN}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def accepted(url: str, key: str) -> bool:
    """Does the replica take the key now (a models list: the cheapest call a key makes)?"""
    try:
        client(url, key).models.list()
    except openai.AuthenticationError:
        return False
    return True


def until(predicate: Callable[[], bool], timeout: float) -> float | None:
    """Poll every 50 ms; the seconds it took the predicate to hold, or None if it did not within ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def moment(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_runtime_keys_across_two_replicas(start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc],
                                          shared_dsn: str) -> None:
    sim = start_sim("--decode-base-ms", "5")
    run = uuid.uuid4().hex[:8]
    tenant = f"keys-{run}"
    policy = policy_dict([sim.url])
    policy["tenants"][tenant] = {"tier": "standard", "models": [MODEL],
                                 "budget": {"period": "day", "limit_usd": 5.0}}
    on_shared_state(policy, shared_dsn)
    a, b = start_gateway(policy), start_gateway(policy)

    # made on A with the CLI, working on B
    made = cli(a.url, "create", "--tenant", tenant, "--name", "ci")
    key, kid = made["key"], made["id"]
    seen_in = until(lambda: accepted(b.url, key), 10)
    assert seen_in is not None and seen_in <= PROPAGATION_LIMIT_S, seen_in
    answer = client(b.url, key).chat.completions.create(model=MODEL, max_tokens=8,
                                                        messages=[{"role": "user", "content": f"hello {run}"}])
    assert answer.choices[0].message.content

    # a tenant's key is no admin, on either replica; the finance token neither
    for url in (a.url, b.url):
        for path in ("/admin/keys", "/admin/audit", "/admin/policy"):
            denied = httpx.get(url + path, headers={"Authorization": f"Bearer {key}"})
            assert denied.status_code == 403 and denied.json()["error"]["code"] == "permission_denied", path
    finance = httpx.get(b.url + "/admin/audit", headers={"Authorization": f"Bearer {FINANCE_TOKEN}"})
    assert finance.status_code == 403
    assert httpx.get(b.url + "/admin/audit", headers={"Authorization": "Bearer tg-nobody"}).status_code == 401

    # revoked through A's API: refused by B within a second
    revoked = httpx.post(f"{a.url}/admin/keys/{kid}/revoke", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    refused_in = until(lambda: not accepted(b.url, key), 5)
    print(f"\nrevocation seen by the other replica {refused_in and refused_in * 1000:.0f} ms after the revoke's answer")
    assert refused_in is not None and refused_in <= PROPAGATION_LIMIT_S, refused_in
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        client(b.url, key).chat.completions.create(model=MODEL, max_tokens=8,
                                                   messages=[{"role": "user", "content": "still there?"}])

    # rotated with a 2 s grace: the old value works until then, on both, and stops after
    old = cli(a.url, "create", "--tenant", tenant, "--name", "svc")
    assert until(lambda: accepted(b.url, old["key"]), 10) is not None
    rotated = cli(a.url, "rotate", old["id"], "--grace", "2s")
    grace_ends = moment(rotated["previous"]["expires_at"])
    checked_at = time.time()
    assert accepted(b.url, old["key"]) and accepted(a.url, old["key"]), "in its grace"
    assert checked_at < grace_ends, "checked before the grace ended"
    assert until(lambda: accepted(b.url, rotated["key"]), 10) is not None, "the new value, on the other replica"
    stopped_in = until(lambda: not accepted(b.url, old["key"]), 10)
    assert stopped_in is not None
    assert time.time() >= grace_ends and time.time() - grace_ends <= PROPAGATION_LIMIT_S
    assert not accepted(a.url, old["key"]) and accepted(a.url, rotated["key"]) and accepted(b.url, rotated["key"])

    # a key's own budget holds across both replicas within one reservation, as a tenant's does
    limit = 0.0005
    capped = httpx.post(a.url + "/admin/keys", headers=ADMIN, json={
        "tenant": tenant, "name": "capped", "budget": {"period": "day", "limit_usd": limit}}).json()
    assert until(lambda: accepted(b.url, capped["key"]), 10) is not None
    callers = [client(url, capped["key"]) for url in (a.url, b.url)]

    def ask(i: int) -> tuple[int, str | None, str]:
        try:
            callers[i % 2].chat.completions.create(model=MODEL, max_tokens=50,
                                                   messages=[{"role": "user", "content": f"budget question {i}"}])
        except openai.RateLimitError as exc:
            return exc.status_code, exc.code, exc.message
        return 200, None, ""
    with ThreadPoolExecutor(25) as pool:
        answers = list(pool.map(ask, range(50)))
    refused = [a for a in answers if a[0] != 200]
    assert refused and len(refused) < 50, answers
    who = f"API key '{capped['id']}' of tenant '{tenant}' has "
    assert all(status == 429 and code == "insufficient_quota" and who in message
               and "daily budget of 0.0005 USD" in message for status, code, message in refused), refused

    def spent() -> tuple[int, float]:
        with psycopg.connect(shared_dsn) as db:
            row = db.execute("SELECT count(*), coalesce(sum(cost_usd), 0) FROM ledger WHERE key_id = %s",
                             (capped["id"],)).fetchone()
            assert row is not None
            return int(row[0]), float(row[1])
    assert wait_for(lambda: spent()[0] == 50, timeout=15), spent()
    one_reservation = (200 * 0.3 + 50 * 0.9) / 1e6  # a worst case: every byte of a ~200-byte body + 50 out
    assert 0 < spent()[1] <= limit + one_reservation, spent()  # some answered: not refused from the start
    report = httpx.get(b.url + "/admin/reports/costs", params={"group_by": "key", "tenant": tenant},
                       headers={"Authorization": f"Bearer {FINANCE_TOKEN}"}).json()
    by_key = {row["key_id"]: row for row in report["data"]}
    assert by_key[capped["id"]]["requests"] == 50 and by_key[kid]["requests"] == 1
    assert abs(by_key[capped["id"]]["cost_usd"] - spent()[1]) < 1e-9

    # every operation in the one audit log, read on the replica that made none of them, newest first
    log = httpx.get(b.url + "/admin/audit", headers=ADMIN).json()["data"]
    assert [(e["action"], e["target"]) for e in log] == [
        ("key.create", capped["id"]), ("key.rotate", old["id"]), ("key.create", old["id"]),
        ("key.revoke", kid), ("key.create", kid)]
    assert all(e["actor"] == ADMIN_ID and e["client"] == "127.0.0.1" for e in log)
    assert log[1]["details"]["new"] == rotated["id"] and log[1]["details"]["grace_s"] == 2.0
    listed = cli(b.url, "list", "--tenant", tenant)
    assert {k["id"]: k["status"] for k in listed} == {
        kid: "revoked", old["id"]: "expired", rotated["id"]: "active", capped["id"]: "active"}
