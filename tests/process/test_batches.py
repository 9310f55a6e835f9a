"""The OpenAI Batch API through the real `openai` client, against a gateway process and simulated workers."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.auth import hash_key
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, Proc, policy_dict, wait_for
from tests.fakes import HandClock

MODEL = "sim-llama-8b"
FINAL = ("completed", "failed", "expired", "cancelled")


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def request_line(custom_id: str, content: str = "Say hello", max_tokens: int = 8, model: str = MODEL,
                 url: str = "/v1/chat/completions") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}}


def client_for(gateway: Proc, key: str = DEMO_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def submit(client: openai.OpenAI, lines: list[dict[str, Any]]) -> str:
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "test"})
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    return batch.id


def wait_final(client: openai.OpenAI, batch_id: str, timeout: float = 60.0) -> Any:
    assert wait_for(lambda: client.batches.retrieve(batch_id).status in FINAL, timeout=timeout, interval=0.2)
    return client.batches.retrieve(batch_id)


def read_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines() if line.strip()]


@pytest.fixture
def sim(start_sim: Callable[..., Proc]) -> Proc:
    return start_sim("--decode-base-ms", "5")


def test_openai_client_end_to_end(start_gateway: Callable[..., Proc], sim: Proc) -> None:
    gateway = start_gateway(policy_dict([sim.url]))
    client = client_for(gateway)
    lines = [request_line(f"req-{i}", f"Question number {i}") for i in range(6)]
    lines.append(request_line("bad-model", model="no-such-model"))
    batch_id = submit(client, lines)

    batch = wait_final(client, batch_id)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 6, 1)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at

    output = read_lines(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(6))
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["request_id"]
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] > 0
    errors = read_lines(client, batch.error_file_id)
    assert [e["custom_id"] for e in errors] == ["bad-model"]
    assert errors[0]["response"]["status_code"] == 404
    assert errors[0]["response"]["body"]["error"]["code"] == "model_not_found"

    assert batch_id in [b.id for b in client.batches.list(limit=10).data]
    files = client.files.list()
    assert {batch.output_file_id, batch.error_file_id} <= {f.id for f in files.data}
    # each line ran as class batch: the gateway's metrics count them under that tier
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'tollgate_requests_total{model="sim-llama-8b",status="200",tier="batch"} 6.0' in metrics

    # ... and in the ledger as requests of the key that created the batch
    def records() -> list[dict[str, Any]]:
        return [r for r in httpx.get(gateway.url + "/admin/ledger", params={"format": "json"}, timeout=30, headers={
            "Authorization": f"Bearer {FINANCE_TOKEN}"}).json()["data"] if r["batch"] == batch_id]
    assert wait_for(lambda: len(records()) == 7, timeout=15)
    assert {r["key_id"] for r in records()} == {"key-" + hash_key(DEMO_KEY)[:12]}
    # the batch's usage, as the client reads it, is the sum of its lines' answers and of the ledger's records
    assert batch.usage is not None
    answered = [line["response"]["body"]["usage"] for line in output]
    assert batch.usage.input_tokens == sum(u["prompt_tokens"] for u in answered) == \
        sum(r["prompt_tokens"] or 0 for r in records())
    assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in answered) == \
        sum(r["completion_tokens"] or 0 for r in records())
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens > 0


def test_invalid_file_fails_the_batch_naming_each_line(start_gateway: Callable[..., Proc], sim: Proc) -> None:
    gateway = start_gateway(policy_dict([sim.url]))
    client = client_for(gateway)
    raw = b"\n".join([
        json.dumps(request_line("a")).encode(),
        b"{not json",
        json.dumps(request_line("a")).encode(),
        json.dumps(request_line("c", url="/v1/completions")).encode(),
        json.dumps({**request_line("d"), "method": "GET"}).encode(),
    ])
    uploaded = client.files.create(file=("bad.jsonl", io.BytesIO(raw)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    batch = wait_final(client, batch.id)
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data is not None
    found = {(e.line, e.code) for e in batch.errors.data}
    assert found == {(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_url"),
                     (5, "invalid_method")}
    assert batch.request_counts is not None and batch.request_counts.total == 0


def test_files_and_batches_are_private_and_bounded(start_gateway: Callable[..., Proc], sim: Proc) -> None:
    policy = policy_dict([sim.url])
    policy["batches"] = {"max_file_bytes": 4096}
    gateway = start_gateway(policy)
    owner, other = client_for(gateway), client_for(gateway, PREMIUM_KEY)
    batch_id = submit(owner, [request_line("only")])
    file_id = owner.batches.retrieve(batch_id).input_file_id

    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(file_id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(file_id)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch_id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch_id)
    with pytest.raises(openai.BadRequestError):  # another tenant's file cannot feed a batch
        other.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert other.files.list().data == [] and other.batches.list().data == []

    big = jsonl([request_line(f"r{i}", "x" * 200) for i in range(40)])
    with pytest.raises(openai.APIStatusError) as caught:
        owner.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
    assert caught.value.status_code == 413
    assert "larger than the limit of 4096 bytes" in caught.value.message
    with pytest.raises(openai.BadRequestError):
        owner.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    bad = httpx.post(gateway.url + "/v1/batches", headers={"Authorization": f"Bearer {DEMO_KEY}"},
                     json={"input_file_id": file_id, "endpoint": "/v1/moderations", "completion_window": "24h"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "endpoint"
    assert httpx.get(gateway.url + "/v1/files").status_code == 401

    wait_final(owner, batch_id)
    deleted = owner.files.delete(file_id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        owner.files.retrieve(file_id)


def test_cancel_ends_with_partial_output_and_every_line_once(start_gateway: Callable[..., Proc],
                                                             start_sim: Callable[..., Proc]) -> None:
    slow = start_sim("--decode-base-ms", "40")  # ~1.3 s per 32-token line
    policy = policy_dict([slow.url])
    policy["batches"] = {"max_inflight_lines": 2}
    gateway = start_gateway(policy)
    client = client_for(gateway)
    batch_id = submit(client, [request_line(f"c{i}", max_tokens=32) for i in range(30)])
    assert wait_for(lambda: completed(client, batch_id) >= 2, 30)

    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait_final(client, batch_id)
    assert batch.status == "cancelled" and batch.cancelled_at
    output, errors = read_lines(client, batch.output_file_id), read_lines(client, batch.error_file_id)
    ids = [line["custom_id"] for line in output + errors]
    assert sorted(ids) == sorted(f"c{i}" for i in range(30))  # each exactly once
    assert 2 <= len(output) < 30
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    done = wait_final(client, submit(client, [request_line("quick")]))
    assert done.status == "completed"
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(done.id)


def completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return counts.completed if counts else 0


def test_sigkill_mid_batch_resumes_with_every_custom_id_once(start_gateway: Callable[..., Proc],
                                                             start_sim: Callable[..., Proc],
                                                             tmp_path: Path) -> None:
    policy, data_dir, batch_id = killed_mid_batch(
        start_gateway, start_sim, tmp_path, decode_ms=20, inflight=4, until_done=8,
        lines=[request_line(f"k{i}", f"line {i}", max_tokens=24) for i in range(40)])
    assert 8 <= done_lines(data_dir, batch_id) < 40

    restarted = start_gateway(policy, data_dir=data_dir)
    client = client_for(restarted)
    batch = wait_final(client, batch_id, timeout=90)
    assert batch.status == "completed"
    output = read_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(40))
    assert batch.error_file_id is None
    assert batch.request_counts is not None and batch.request_counts.completed == 40


def killed_mid_batch(start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], tmp_path: Path,
                     decode_ms: int, inflight: int, until_done: int,
                     lines: list[dict[str, Any]]) -> tuple[dict[str, Any], Path, str]:
    """A gateway running a batch over a slow worker, SIGKILLed once ``until_done`` lines have finished:
    (its policy, its data directory, the batch id), for a restart on the same data directory."""
    slow = start_sim("--decode-base-ms", str(decode_ms))
    policy = policy_dict([slow.url])
    policy["batches"] = {"max_inflight_lines": inflight}
    data_dir = tmp_path / "batch-data"
    gateway = start_gateway(policy, data_dir=data_dir)
    client = client_for(gateway)
    batch_id = submit(client, lines)
    assert wait_for(lambda: completed(client, batch_id) >= until_done, 60)
    os.kill(gateway.pid, signal.SIGKILL)
    gateway.process.wait(10)
    return policy, data_dir, batch_id


def done_lines(data_dir: Path, batch_id: str) -> int:
    """Lines checkpointed in the store (read directly: the gateway is dead)."""
    with sqlite3.connect(data_dir / "batches.sqlite3") as db:
        return int(db.execute("SELECT count(*) FROM batch_lines WHERE batch_id = ? AND done = 1",
                              (batch_id,)).fetchone()[0])


def test_lines_past_the_window_end_as_batch_expired(start_gateway: Callable[..., Proc],
                                                    start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    """A batch whose 24 h window has passed (set back in the store) ends `expired`; the lines that did not run
    are in the error file as batch_expired, the ones that did keep their answers."""
    policy, data_dir, batch_id = killed_mid_batch(
        start_gateway, start_sim, tmp_path, decode_ms=40, inflight=1, until_done=1,
        lines=[request_line(f"e{i}", max_tokens=32) for i in range(20)])
    with sqlite3.connect(data_dir / "batches.sqlite3") as db:
        db.execute("UPDATE batches SET expires_at = ? WHERE id = ?", (int(time.time()) - 1, batch_id))

    client = client_for(start_gateway(policy, data_dir=data_dir))
    batch = wait_final(client, batch_id)
    assert batch.status == "expired" and batch.expired_at
    output, errors = read_lines(client, batch.output_file_id), read_lines(client, batch.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"e{i}" for i in range(20))
    assert output and errors
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_replicas_on_postgres_share_a_batch_and_a_killed_one_loses_no_line(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], tmp_path: Path, pg_dsn: str) -> None:
    """Two replicas on one PostgreSQL (each with its own data directory): a batch submitted to one is seen
    and run by both (lines claimed a few at a time), the one it was submitted to is SIGKILLed mid-batch, and
    the other finishes every line: its claims lapse (claim_lease_s) and are taken over. Every custom_id is in
    the output once, and no line was answered twice (one ledger record per line at most)."""
    import psycopg

    slow = start_sim("--decode-base-ms", "20")
    policy = policy_dict([slow.url])
    policy["state"] = {"postgres_dsn": pg_dsn}
    policy["batches"] = {"max_inflight_lines": 3, "claim_lease_s": 3}
    a, b = (start_gateway(policy, data_dir=tmp_path / name) for name in ("a", "b"))
    lines = [request_line(f"r{i}", f"Replica question {i}", max_tokens=32) for i in range(90)]
    batch_id = submit(client_for(a), lines)
    client = client_for(b)
    assert client.batches.retrieve(batch_id).id == batch_id, "the other replica serves the batch"

    def served(proc: Proc) -> float:
        """Requests the replica answered (only batch lines are sent here)."""
        text = httpx.get(proc.url + "/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("tollgate_requests_total{"))
    assert wait_for(lambda: served(a) > 0 and served(b) > 0, 60), "both replicas run lines"
    assert completed(client, batch_id) < 80, "killed mid-batch"
    os.kill(a.pid, signal.SIGKILL)
    a.process.wait(10)

    batch = wait_final(client, batch_id, timeout=90)
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 90
    output = read_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"r{i}" for i in range(90))
    with psycopg.connect(pg_dsn) as db:
        counts = [row[0] for row in db.execute(
            "SELECT count(*) FROM ledger WHERE batch = %s GROUP BY request_id", (batch_id,))]
    assert counts and max(counts) == 1, "no line answered twice"
    assert len(counts) >= 90 - 3, "every line recorded but those the killed replica finished as it died"


@pytest.fixture
def clock() -> HandClock:
    """The store's wall clock, moved by hand: a lease lapses when the test says, not after a sleep."""
    return HandClock()


@pytest.fixture(params=["sqlite", "postgres"])
def batch_store(request: pytest.FixtureRequest, tmp_path: Path, clock: HandClock) -> Any:
    from gateway.batches.store import open_batch_store

    dsn = request.getfixturevalue("pg_dsn") if request.param == "postgres" else None
    store = open_batch_store(tmp_path, dsn, clock)
    yield store
    store.close()


def test_claims_split_lines_lapse_and_come_back(batch_store: Any, clock: HandClock, tmp_path: Path) -> None:
    """Two owners never hold one line; a lapsed claim is taken over; release gives lines back at once; a
    finished line is never claimed again; contents read back chunk by chunk."""
    from gateway.batches.lines import check, valid_lines

    s = batch_store
    one, two, three, four = (f"{name}-{time.time_ns()}" for name in ("one", "two", "three", "four"))
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([request_line(f"c{i}") for i in range(10)]))
    total, errors = check(source, "/v1/chat/completions", 100, 65536)
    found = list(valid_lines(source, "/v1/chat/completions", 100, 65536))
    record = s.add_file("acme", "batch", "in.jsonl", source=source)
    assert not errors and s.read_chunk(record.id, 0) == jsonl([request_line(f"c{i}") for i in range(10)])
    batch = s.create_batch("acme", "/v1/chat/completions", record.id, "24h", None)
    assert s.begin_validation(batch.id, one, 60) == 1
    s.add_lines(batch.id, one, found)
    assert s.start_lines(batch.id, one, total) and not s.start_lines(batch.id, one, total), "validated once"

    first = s.claim(batch.id, one, 4, 60)
    second = s.claim(batch.id, two, 4, 60)
    assert len(first) == len(second) == 4 and not {n for n, _ in first} & {n for n, _ in second}
    s.finish_line(batch.id, first[0][0], True, b"{}")
    assert s.renew(one, 60) == 3, "finished lines are no longer held"
    s.release(two)  # a clean stop
    again = s.claim(batch.id, three, 10, 0.2)
    assert {n for n, _ in again} == {n for n, _ in second} | ({n for n in range(1, 11)} - {n for n, _ in first}
                                                               - {n for n, _ in second})
    clock.now += 0.1
    assert s.claim(batch.id, four, 10, 60) == [], "the third owner's lease still holds its lines"
    clock.now += 0.2  # the third owner's lease lapses (it died)
    assert {n for n, _ in s.claim(batch.id, four, 10, 60)} == {n for n, _ in again}
    assert s.unfinished(batch.id) == 9


def test_a_batch_over_its_budget_ends_its_lines_instead_of_retrying_them(start_gateway: Callable[..., Proc],
                                                                          sim: Proc) -> None:
    """insufficient_quota is the line's answer, not a shed to wait out: a 20-line batch over a budget that
    covers two lines finishes at once with error lines, writes one ledger record per line, and its lines are
    charged against the tenant's rate limit once each (the tenant's live requests still get through)."""
    policy = policy_dict([sim.url])
    # a line's worst case is ~1.4e-5 USD (its ~90 bytes as prompt tokens, 8 output tokens, batch prices), its
    # cost ~4e-6: this budget lets two or three lines run
    policy["tenants"]["demo"]["budget"] = {"limit_usd": 0.00003, "period": "day"}
    policy["tenants"]["demo"]["rate_limit"] = {"requests_per_minute": 25}
    gateway = start_gateway(policy)
    client = client_for(gateway)
    batch = wait_final(client, submit(client, [request_line(f"r{i}", max_tokens=8) for i in range(20)]), 30)
    assert batch.status == "completed" and batch.request_counts is not None
    errors = read_lines(client, batch.error_file_id)
    assert batch.request_counts.failed == len(errors) >= 15
    assert {e["response"]["body"]["error"]["code"] for e in errors} == {"insufficient_quota"}
    records = httpx.get(gateway.url + "/admin/ledger", params={"format": "json"}, timeout=30,
                        headers={"Authorization": f"Bearer {FINANCE_TOKEN}"}).json()["data"]
    assert len(records) == 20, "one record per line: no hot loop of refusals"
    live = httpx.post(gateway.url + "/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {DEMO_KEY}"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert live.json()["error"]["code"] == "insufficient_quota", "the budget, not the rate limit, refuses it"


def test_a_tenants_files_are_bounded(start_gateway: Callable[..., Proc], sim: Proc) -> None:
    policy = policy_dict([sim.url])
    policy["batches"] = {"tenant_files": 2, "tenant_bytes": 4096}
    gateway = start_gateway(policy)
    client = client_for(gateway)
    for i in range(2):
        client.files.create(file=(f"f{i}.jsonl", io.BytesIO(jsonl([request_line("a")]))), purpose="batch")
    with pytest.raises(openai.RateLimitError) as third:
        client.files.create(file=("f2.jsonl", io.BytesIO(jsonl([request_line("a")]))), purpose="batch")
    assert third.value.code == "file_quota_exceeded"
    other = client_for(gateway, PREMIUM_KEY)
    other.files.create(file=("mine.jsonl", io.BytesIO(jsonl([request_line("a")]))), purpose="batch")
    client.files.delete(client.files.list().data[0].id)
    big = jsonl([request_line(f"r{i}", "x" * 400) for i in range(10)])  # over 4,096 bytes
    with pytest.raises(openai.RateLimitError):
        client.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
    client.files.create(file=("f3.jsonl", io.BytesIO(jsonl([request_line("a")]))), purpose="batch")


def test_an_upload_slower_than_the_body_timeout_goes_through_and_a_trickle_does_not(
        start_gateway: Callable[..., Proc], sim: Proc) -> None:
    """The body timeout (2 s here) holds for every 64 KiB an upload delivers, not for the whole file."""
    import socket

    policy = policy_dict([sim.url])
    policy["server"]["body_timeout_s"] = 2.0
    gateway = start_gateway(policy)
    content = jsonl([request_line(f"r{i}", "y" * 900) for i in range(500)])  # ~0.5 MB
    boundary = "tollgate-test"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEMO_KEY}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n").encode()

    def send(pieces: int, pause_s: float, upto: int | None = None) -> bytes:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as s:
            s.sendall(head)
            step = len(body) // pieces
            for i in range(pieces):
                if upto is not None and i * step >= upto:
                    break
                try:
                    s.sendall(body[i * step:(i + 1) * step if i < pieces - 1 else len(body)])
                except OSError:
                    break
                time.sleep(pause_s)  # the client's own pace: this test is about a slow sender
            return s.recv(65536)

    slow = send(pieces=8, pause_s=0.7)  # ~5.6 s in all, 64 KiB a piece: each piece moves the deadline
    assert slow.startswith(b"HTTP/1.1 200"), slow[:200]
    trickle = send(pieces=len(body) // 100, pause_s=0.05, upto=60_000)  # 2 KB/s: under 64 KiB in 2 s
    assert trickle.startswith(b"HTTP/1.1 408"), trickle[:200]


def test_a_batch_keeps_the_key_that_created_it(batch_store: Any) -> None:
    made = batch_store.create_batch("acme", "/v1/chat/completions", "file-x", "24h", None, "key-0123456789ab")
    assert batch_store.get_batch(made.id).key_id == "key-0123456789ab"
    assert batch_store.create_batch("acme", "/v1/chat/completions", "file-x", "24h", None).key_id is None


def test_a_postgres_table_made_before_keys_were_kept_gets_the_column_at_open(pg_dsn: str, tmp_path: Path) -> None:
    """In a schema of its own (the shared tables are left alone): an old batches table, its row read on."""
    import psycopg

    from gateway.batches.store import PostgresBatchStore

    schema = f"before_keys_{os.getpid()}_{time.time_ns()}"
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
        db.execute(f"CREATE TABLE {schema}.batches (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, endpoint TEXT NOT "
                   "NULL, input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL, "
                   "created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, in_progress_at BIGINT, finalizing_at "
                   "BIGINT, completed_at BIGINT, failed_at BIGINT, expired_at BIGINT, cancelling_at BIGINT, "
                   "cancelled_at BIGINT, output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT, "
                   "total INTEGER NOT NULL DEFAULT 0)")
        db.execute(f"INSERT INTO {schema}.batches (id, tenant, endpoint, input_file_id, completion_window, status, "
                   "created_at, expires_at) VALUES ('batch_old', 'acme', '/v1/chat/completions', 'f', '24h', "
                   "'completed', 1, 2)")
    store = PostgresBatchStore(tmp_path, f"{pg_dsn}?options=-csearch_path%3D{schema}")
    try:
        old = store.get_batch("batch_old")
        assert old is not None and old.key_id is None and old.status == "completed"
        made = store.create_batch("acme", "/v1/chat/completions", "f", "24h", None, "key-new")
        assert store.get_batch(made.id).key_id == "key-new"
    finally:
        store.close()
        with psycopg.connect(pg_dsn, autocommit=True) as db:
            db.execute(f"DROP SCHEMA {schema} CASCADE")
