"""Admin actions against real gateway processes over loopback (and real nginx in front): the audit log stays small
(72 policy changes of 1,500 paths each, every entry bounded in bytes) and reads in pages bounded in bytes, each
naming the cursor of the next, which together hold every entry once; a month closed is audited with who, from
where and its totals, while an X-Forwarded-For sent from loopback (a port-forward, a sidecar) is not believed;
behind deploy/'s nginx with its address trusted, the audit names the caller nginx saw beside nginx; and
`tollgate keys list` prints names that look like console markup as themselves."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.auth import hash_key
from gateway.http.admin import AUDIT_PAGE_BYTES
from gateway.keys.store import MAX_DETAILS_BYTES
from gateway.ledger.stores import COLUMNS, SqliteLedger
from gateway.ledger.times import at
from loadtest.harness.procs import start_nginx
from tests.conftest import ADMIN_TOKEN, ROOT, Proc, policy_dict

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN_ID = "admin:" + hash_key(ADMIN_TOKEN)[:12]
TENANTS, KEYS_EACH, CHANGES = 300, 5, 72


def with_tenants(policy: dict[str, Any], round_: int) -> dict[str, Any]:
    """``policy`` and TENANTS more tenants, each with KEYS_EACH key hashes new in each round: every round changes
    TENANTS * KEYS_EACH paths (the audit shows each as key ids, old and new)."""
    for t in range(TENANTS):
        policy["tenants"][f"t{t:03d}"] = {"tier": "standard", "keys": [
            "sha256:" + hash_key(f"tg-round-{round_}-tenant-{t}-key-{k}") for k in range(KEYS_EACH)]}
    return policy


def audit_pages(url: str, **params: str) -> Iterator[httpx.Response]:
    cursor: str | None = None
    while True:
        reply = httpx.get(url + "/admin/audit", params={**params, **({"cursor": cursor} if cursor else {})},
                          headers=ADMIN, timeout=30)
        assert reply.status_code == 200, reply.text
        yield reply
        if not reply.json()["has_more"]:
            return
        cursor = reply.json()["next_cursor"]


def test_policy_changes_of_hundreds_of_paths_stay_small_and_the_log_reads_in_pages(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    sim = start_sim()
    data_dir = tmp_path / "gateway-data"
    gateway = start_gateway(with_tenants(policy_dict([sim.url]), 0), data_dir=data_dir)
    with httpx.Client(base_url=gateway.url, headers=ADMIN, timeout=60) as client:
        for round_ in range(1, CHANGES + 1):
            applied = client.put("/admin/policy", content=orjson.dumps(with_tenants(policy_dict([sim.url]), round_)))
            assert applied.status_code == 200, applied.text

    with sqlite3.connect(data_dir / "admin.sqlite3") as db:  # beside the gateway (WAL), as it stored them
        count, largest, total = db.execute("SELECT count(*), max(length(CAST(details AS BLOB))), "
                                           "sum(length(CAST(details AS BLOB))) FROM admin_audit").fetchone()
    assert count == CHANGES and largest <= MAX_DETAILS_BYTES and total <= CHANGES * MAX_DETAILS_BYTES

    pages = list(audit_pages(gateway.url, limit="1000"))
    assert len(pages) >= 2, "72 entries of up to 16 KB take more than a page of 1 MB"
    assert all(len(page.content) <= AUDIT_PAGE_BYTES for page in pages)
    entries = [e for page in pages for e in page.json()["data"]]
    assert len(entries) == len({e["id"] for e in entries}) == CHANGES, "every entry once"
    assert [e["time"] for e in entries] == sorted((e["time"] for e in entries), reverse=True), "newest first"
    for e in entries:
        assert e["action"] == "policy.apply" and e["actor"] == ADMIN_ID
        details = e["details"]
        assert details["changes_total"] == TENANTS * KEYS_EACH
        kept = len(details["changes"])
        assert 0 < kept < 200 and details["truncated"]["left_out"] == {"changes": 200 - kept}, \
            "the first 200 paths are kept with values, as far as 16 KB goes; the marker says how many are not"
        assert all(c["path"].startswith("tenants.t") and ".keys." in c["path"] for c in details["changes"])

    few = httpx.get(gateway.url + "/admin/audit", params={"limit": "5"}, headers=ADMIN).json()
    assert [e["id"] for e in few["data"]] == [e["id"] for e in entries[:5]] and few["has_more"] is True
    window = {"from": entries[30]["time"], "to": entries[10]["time"]}  # from included, to excluded
    ranged = [e["id"] for page in audit_pages(gateway.url, limit="3", **window) for e in page.json()["data"]]
    assert ranged == [e["id"] for e in entries[11:31]], "the range and the limit still hold, page after page"
    bad = httpx.get(gateway.url + "/admin/audit", params={"cursor": "not-a-cursor"}, headers=ADMIN)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cursor"
    over = httpx.get(gateway.url + "/admin/audit", params={"limit": "1001"}, headers=ADMIN)
    assert over.status_code == 400 and over.json()["error"]["param"] == "limit"


def past_record(n: int, when: datetime) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    return row | {"id": f"past-{n}", "request_id": f"past-req-{n}", "time": at(when.timestamp()), "tenant": "demo",
                  "tier": "standard", "service_class": "standard", "model": "sim-llama-8b", "endpoint": "chat",
                  "stream": False, "status": 200, "prompt_tokens": 40, "completion_tokens": 12, "cached_tokens": 0,
                  "estimated": False, "cost_usd": 0.02 * n}


def test_a_close_is_audited_and_a_forwarded_address_from_loopback_is_not_believed(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    sim = start_sim()
    data_dir = tmp_path / "gateway-data"
    gateway = start_gateway(policy_dict([sim.url]), data_dir=data_dir)
    last = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
    month = last.strftime("%Y-%m")
    ledger = SqliteLedger(data_dir / "ledger.sqlite3")
    try:
        ledger.insert([past_record(1, last), past_record(2, last + timedelta(hours=1))])
    finally:
        ledger.close()
    spoofed = {**ADMIN, "X-Forwarded-For": "203.0.113.5"}  # what a port-forward or a sidecar would pass on
    epoch = httpx.post(gateway.url + "/admin/statements/close", params={"month": "1970-01"}, headers=spoofed)
    assert epoch.status_code == 409 and epoch.json()["error"]["code"] == "month_before_ledger"
    assert f"its first record is in {month}" in epoch.json()["error"]["message"]
    closed = httpx.post(gateway.url + "/admin/statements/close", params={"month": month}, headers=spoofed,
                        timeout=60)
    assert closed.status_code == 200, closed.text
    (entry,) = httpx.get(gateway.url + "/admin/audit", headers=ADMIN).json()["data"]
    assert (entry["action"], entry["target"], entry["actor"]) == ("statement.close", month, ADMIN_ID)
    assert (entry["client"], entry["peer"]) == ("127.0.0.1", "127.0.0.1"), "the header is loopback's word only"
    assert entry["details"]["total"] == closed.json()["total"] and entry["details"]["total"]["requests"] == 2


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Callable[[int], str]]:
    procs: list[Proc] = []

    def start(port: int) -> str:
        procs.append(start_nginx(tmp_path, [port]))
        return procs[-1].url
    yield start
    for proc in procs:
        proc.kill()


def made_from(url: str, local: str, forwarded: str) -> dict[str, Any]:
    """Make a key through ``url`` from the local address ``local``, claiming ``forwarded``; its audit entry."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=local), timeout=30) as client:
        made = client.post(url + "/admin/keys", json={"tenant": "demo", "name": f"from {local}"},
                           headers={**ADMIN, "X-Forwarded-For": forwarded})
        assert made.status_code == 201, made.text
        log = client.get(url + "/admin/audit", headers=ADMIN).json()["data"]
    return next(e for e in log if e["target"] == made.json()["id"])


def test_behind_deploys_nginx_the_audit_names_the_caller_it_saw_beside_nginx(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc],
        nginx: Callable[[int], str]) -> None:
    """The caller is 127.0.0.2 (a client on another address than nginx's 127.0.0.1) and claims 203.0.113.5."""
    sim = start_sim()
    trusting = policy_dict([sim.url])
    trusting["server"]["trusted_proxies"] = ["127.0.0.1/32"]  # as deploy/nginx/tollgate.conf says to set it
    gateway = start_gateway(trusting)
    front = nginx(gateway.port)
    via_nginx = made_from(front, "127.0.0.2", "203.0.113.5")
    assert (via_nginx["client"], via_nginx["peer"]) == ("127.0.0.2", "127.0.0.1"), \
        "nginx vouches for who connected to it; the caller's own claim is one hop further and not believed"
    direct = made_from(gateway.url, "127.0.0.2", "203.0.113.5")
    assert (direct["client"], direct["peer"]) == ("127.0.0.2", "127.0.0.2"), "not through the trusted proxy"

    default = start_gateway(policy_dict([sim.url]))  # the default: no proxy trusted
    plain = made_from(nginx(default.port), "127.0.0.2", "203.0.113.5")
    assert (plain["client"], plain["peer"]) == ("127.0.0.1", "127.0.0.1"), "nginx itself, until it is trusted"


def test_keys_list_prints_names_that_look_like_markup_as_themselves(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc]) -> None:
    gateway = start_gateway(policy_dict([start_sim().url]))
    names = ["[/]", "[link=https://evil.example/x]click here[/link]", "[bold red]alarm", "plain name"]
    for name in names:
        made = httpx.post(gateway.url + "/admin/keys", json={"tenant": "demo", "name": name}, headers=ADMIN)
        assert made.status_code == 201, made.text
    refused = httpx.post(gateway.url + "/admin/keys", json={"tenant": "demo", "name": "invoice\u202efdp.exe"},
                         headers=ADMIN)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "name"
    for _ in range(2):  # the second listing too: a name once shown must not break the next
        done = subprocess.run([sys.executable, "-m", "gateway", "keys", "list", "--url", gateway.url], cwd=ROOT,
                              env={**os.environ, "TOLLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "FORCE_COLOR": "1",
                                   "COLUMNS": "300", "TERM": "xterm-256color"},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert all(name in done.stdout for name in names), done.stdout
        assert "\x1b]8;" not in done.stdout, "no terminal hyperlink"
