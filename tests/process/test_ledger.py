"""The cost ledger and finance reports, against gateway processes on simulated workers (SQLite and PostgreSQL)."""

from __future__ import annotations

import csv
import io
import os
import signal
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.ledger.prices import Usage, recompute
from gateway.policy.schema import Prices
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, Proc, policy_dict, wait_for

MODEL = "sim-llama-8b"


def ledger_rows(gateway: Proc, token: str = FINANCE_TOKEN, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(gateway.url + "/admin/ledger", params={"format": "json", **params},
                         headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def chat(client: openai.OpenAI, content: str, max_tokens: int = 8, stream: bool = False, rid: str = "") -> Any:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, stream=stream,
                                          extra_headers={"X-Request-ID": rid} if rid else None)


@pytest.fixture
def sim(start_sim: Callable[..., Proc]) -> Proc:
    return start_sim("--decode-base-ms", "5")


def test_each_request_has_one_exact_priced_record(start_gateway: Callable[..., Proc], sim: Proc) -> None:
    policy = policy_dict([sim.url])
    gateway = start_gateway(policy)
    demo = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    premium = openai.OpenAI(base_url=gateway.url + "/v1", api_key=PREMIUM_KEY, max_retries=0)
    expected: dict[str, tuple[int, int]] = {}
    for i in range(4):
        answer = chat(demo, f"plain question {i}", rid=f"plain-{i}")
        assert answer.usage is not None
        expected[f"plain-{i}"] = (answer.usage.prompt_tokens, answer.usage.completion_tokens)
    for i in range(3):
        chunks = list(premium.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"stream {i}"}], max_tokens=6, stream=True,
            stream_options={"include_usage": True}, extra_headers={"X-Request-ID": f"stream-{i}"}))
        usage = chunks[-1].usage
        assert usage is not None
        expected[f"stream-{i}"] = (usage.prompt_tokens, usage.completion_tokens)
    with pytest.raises(openai.NotFoundError):
        demo.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}],
                                     extra_headers={"X-Request-ID": "bad-model"})
    httpx.post(gateway.url + "/v1/chat/completions", json={"model": MODEL, "messages": []},
               headers={"X-Request-ID": "no-key"})
    # a stream the client cuts after three chunks: the record holds what the worker generated up to the cut
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", headers={
            "Authorization": f"Bearer {DEMO_KEY}", "X-Request-ID": "cut"}, json={
            "model": MODEL, "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 400,
            "stream": True}) as response:
        lines = response.iter_lines()
        for _ in range(6):  # three events and their blank lines
            next(lines)

    assert wait_for(lambda: len(ledger_rows(gateway)) == 9, timeout=15), ledger_rows(gateway)
    rows = {row["request_id"]: row for row in ledger_rows(gateway)}
    assert "no-key" not in rows, "a request with no tenant is not a tenant's cost"
    prices = Prices.model_validate(policy["prices"])
    for rid, (prompt, completion) in expected.items():
        row = rows[rid]
        assert (row["prompt_tokens"], row["completion_tokens"], row["status"]) == (prompt, completion, 200)
        assert row["price_version"] == f"{MODEL}@2026-06-01" and row["cost_usd"] > 0
        assert row["cost_usd"] == pytest.approx(recompute(prices, row["price_version"], Usage(prompt, completion),
                                                          row["service_class"], False, False))
        assert row["key_id"].startswith("key-") and DEMO_KEY not in str(row) and PREMIUM_KEY not in str(row)
        assert row["time"].endswith("Z") and row["total_ms"] > 0 and row["worker"] == sim.url
    assert rows["stream-0"]["tier"] == "premium" and rows["stream-0"]["stream"] is True
    assert rows["bad-model"]["status"] == 404 and rows["bad-model"]["cost_usd"] == 0
    cut = rows["cut"]
    # three events read: the role chunk and two tokens, at least
    assert cut["status"] == 499 and cut["prompt_tokens"] > 0 and 2 <= cut["completion_tokens"] < 400
    assert cut["estimated"] is False, "continuous usage: the last chunk's count is the worker's own"

    # reports: grouped sums agree with the records; a tenant reads only its own usage
    headers = {"Authorization": f"Bearer {FINANCE_TOKEN}"}
    report = httpx.get(gateway.url + "/admin/reports/costs", params={"group_by": "tenant,model"},
                       headers=headers).json()
    by_tenant = {row["tenant"]: row for row in report["data"] if row["model"] == MODEL}
    demo_rows = [r for r in rows.values() if r["tenant"] == "demo" and r["model"] == MODEL]
    assert by_tenant["demo"]["requests"] == len(demo_rows)
    assert by_tenant["demo"]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in demo_rows))
    assert report["total"]["requests"] == 9
    text = httpx.get(gateway.url + "/admin/reports/costs", params={"group_by": "day,tenant", "format": "csv"},
                     headers=headers).text
    table = list(csv.DictReader(io.StringIO(text)))
    assert {r["tenant"] for r in table} == {"demo", "prem"} and all(len(r["day"]) == 10 for r in table)
    assert sum(float(r["cost_usd"]) for r in table) == pytest.approx(report["total"]["cost_usd"])
    exported_csv = httpx.get(gateway.url + "/admin/ledger", params={"format": "csv"}, headers=headers).text
    exported = list(csv.DictReader(io.StringIO(exported_csv)))
    assert len(exported) == 9 and {r["stream"] for r in exported} == {"true", "false"}
    # the CSVs load in pandas as typed: ISO times, plain numbers, booleans
    import pandas as pd

    frame = pd.read_csv(io.StringIO(exported_csv), parse_dates=["time"])
    assert str(frame["time"].dtype).startswith("datetime64") and str(frame["time"].dt.tz) == "UTC"
    assert frame["prompt_tokens"].dtype.kind == "i" and frame["cost_usd"].dtype.kind == "f"
    assert frame["stream"].dtype.kind == "b" and frame["status"].dtype.kind == "i"
    grouped = pd.read_csv(io.StringIO(text), parse_dates=["day"])
    assert grouped["day"].dtype.kind == "M" and grouped["requests"].dtype.kind == "i"
    assert grouped["cost_usd"].sum() == pytest.approx(frame["cost_usd"].sum())

    usage = httpx.get(gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {PREMIUM_KEY}"}).json()
    assert usage["tenant"] == "prem" and usage["total"]["requests"] == 3
    assert httpx.get(gateway.url + "/admin/reports/costs",
                     headers={"Authorization": f"Bearer {DEMO_KEY}"}).status_code == 403
    assert httpx.get(gateway.url + "/admin/reports/costs").status_code == 401
    assert len(ledger_rows(gateway, ADMIN_TOKEN)) == 9
    bad = httpx.get(gateway.url + "/admin/reports/costs", params={"group_by": "planet"}, headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_by"


def test_records_survive_a_sigkill(start_gateway: Callable[..., Proc], sim: Proc, tmp_path: Path) -> None:
    data_dir = tmp_path / "kill-data"
    gateway = start_gateway(policy_dict([sim.url]), data_dir=data_dir)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    for i in range(25):
        chat(client, f"q{i}", rid=f"k-{i}")

    def recorded() -> set[str]:
        with sqlite3.connect(data_dir / "ledger.sqlite3") as db:
            return {row[0] for row in db.execute("SELECT request_id FROM ledger")}
    # a record is committed within ~100 ms of its request: wait until the store shows all, then kill
    assert wait_for(lambda: len(recorded()) == 25, timeout=10)
    os.kill(gateway.pid, signal.SIGKILL)
    gateway.process.wait(10)
    assert recorded() == {f"k-{i}" for i in range(25)}, "what was committed survives the kill"


def test_postgres_store_and_the_spool_while_it_is_down(start_gateway: Callable[..., Proc], sim: Proc,
                                                       tmp_path: Path, pg_dsn: str) -> None:
    import psycopg

    data_dir = tmp_path / "pg-data"
    policy = policy_dict([sim.url])
    policy["state"] = {"postgres_dsn": "postgresql://postgres@127.0.0.1:1/nowhere"}
    down = start_gateway(policy, data_dir=data_dir)
    client = openai.OpenAI(base_url=down.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    run = uuid.uuid4().hex[:8]
    for i in range(10):
        chat(client, f"while down {i}", rid=f"{run}-down-{i}")
    spool = data_dir / "ledger-spool.jsonl"
    assert wait_for(lambda: spool.exists() and len(spool.read_bytes().splitlines()) == 10, timeout=15)
    with pytest.raises(openai.APIStatusError) as refused:  # the batches share the unreachable database
        client.batches.list()
    assert refused.value.status_code == 503 and refused.value.code == "batch_store_unavailable"
    down.process.send_signal(signal.SIGTERM)
    down.process.wait(30)

    policy["state"] = {"postgres_dsn": pg_dsn}
    up = start_gateway(policy, data_dir=data_dir)
    client = openai.OpenAI(base_url=up.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    for i in range(5):
        chat(client, f"while up {i}", rid=f"{run}-up-{i}")

    def ids() -> set[str]:
        with psycopg.connect(pg_dsn) as db:
            return {r[0] for r in db.execute("SELECT request_id FROM ledger WHERE request_id LIKE %s", (run + "%",))}
    assert wait_for(lambda: len(ids()) == 15, timeout=15)
    assert ids() == {f"{run}-down-{i}" for i in range(10)} | {f"{run}-up-{i}" for i in range(5)}
    assert not spool.exists(), "replayed, then removed"
    report = httpx.get(up.url + "/admin/reports/costs", params={"group_by": "tenant"},
                       headers={"Authorization": f"Bearer {FINANCE_TOKEN}"}).json()
    assert report["data"][0]["tenant"] == "demo" and report["data"][0]["requests"] == 15


def test_a_client_request_id_cannot_become_a_spreadsheet_formula(start_gateway: Callable[..., Proc], sim: Proc) -> None:
    gateway = start_gateway(policy_dict([sim.url]))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    for rid in ("-2+3", "=cmd|' /C calc'!A0", "@SUM(1)", "plain-id.1"):
        chat(client, "hello", rid=rid)
    assert wait_for(lambda: len(ledger_rows(gateway)) == 4, timeout=15)
    reply = httpx.get(gateway.url + "/admin/ledger", params={"format": "csv"}, timeout=30,
                      headers={"Authorization": f"Bearer {FINANCE_TOKEN}"})
    assert reply.headers["x-content-type-options"] == "nosniff"
    ids = [line.split(",")[reply.text.splitlines()[0].split(",").index("request_id")]
           for line in reply.text.splitlines()[1:]]
    assert "plain-id.1" in ids and not any(cell[:1] in "-=+@" for cell in ids), ids
