"""Batch input files in-process: OpenAI's line rules, lines bounded like a request body, memory bounded whatever
the file holds, and a validation that was cut short not retried forever."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson

from gateway.batches import lines
from gateway.batches.store import SqliteBatchStore

URL = "/v1/chat/completions"


def line(custom_id: object = "a", url: str = URL, method: str = "POST", body: object = None) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} if body is None else body
    return orjson.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def write(path: Path, *rows: bytes) -> Path:
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


def test_a_good_file_gives_its_lines_in_order(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", line("a"), b"", line("b", body={"model": "m", "messages": [], "n": 2}))
    assert lines.check(path, URL, 10, 4096) == (2, [])
    found = list(lines.valid_lines(path, URL, 10, 4096))
    assert [(x.line_no, x.custom_id) for x in found] == [(1, "a"), (3, "b")]
    assert orjson.loads(found[1].body) == {"model": "m", "messages": [], "n": 2}


def test_each_rule_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", b"not json", b"[1]", line(""), line("a"), line("a"), line("b", method="GET"),
                 line("c", url="/v1/completions"), line("d", body=[]), line("e", body={"stream": True}))
    total, errors = lines.check(path, URL, 100, 4096)
    assert [(e["line"], e["code"]) for e in errors] == [
        (1, "invalid_json_line"), (2, "invalid_json_line"), (3, "missing_required_parameter"),
        (5, "duplicate_custom_id"), (6, "invalid_method"), (7, "mismatched_url"), (8, "invalid_body"),
        (9, "invalid_body")]
    assert total == 1


def test_a_line_longer_than_a_request_body_may_be_is_refused_without_being_held(tmp_path: Path) -> None:
    """A 20 MB line of {} elements (parsed whole, it took the gateway 20-32x its size) is skipped block by block:
    the check's peak Python memory stays near one read block."""
    path = tmp_path / "bomb.jsonl"
    with path.open("wb") as f:
        f.write(line("ok") + b"\n")
        f.write(b'{"custom_id": "x", "method": "POST", "url": "' + URL.encode() + b'", "body": {"a": [')
        f.write(b"{}," * 7_000_000 + b"{}]}}\n")
        f.write(line("ok2") + b"\n")
    tracemalloc.start()
    try:
        total, errors = lines.check(path, URL, 100, 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(e["line"], e["code"]) for e in errors] == [(2, "line_too_large")] and total == 2
    assert peak < 8 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB while checking a 21 MB file"


def test_a_line_at_the_limit_passes_and_one_byte_over_does_not(tmp_path: Path) -> None:
    base = line("a", body={"model": "m", "messages": [], "user": ""})
    pad = 200 - len(base)
    exact = line("a", body={"model": "m", "messages": [], "user": "x" * pad})
    over = line("b", body={"model": "m", "messages": [], "user": "x" * (pad + 1)})
    assert len(exact) == 200
    assert lines.check(write(tmp_path / "a.jsonl", exact), URL, 10, 200) == (1, [])
    assert lines.check(write(tmp_path / "b.jsonl", over), URL, 10, 200)[1][0]["code"] == "line_too_large"
    assert lines.check(write(tmp_path / "c.jsonl", exact + b"\n" + over), URL, 10, 200)[0] == 1
    no_newline = tmp_path / "d.jsonl"
    no_newline.write_bytes(exact)  # the last line without its newline still counts
    assert lines.check(no_newline, URL, 10, 200) == (1, [])


def test_limits_on_lines_errors_and_emptiness(tmp_path: Path) -> None:
    many = write(tmp_path / "many.jsonl", *(line(str(i)) for i in range(5)))
    errors = lines.check(many, URL, 3, 4096)[1]
    assert errors[-1]["code"] == "too_many_requests" and errors[-1]["line"] == 4
    bad = write(tmp_path / "bad.jsonl", *(b"nope" for _ in range(30)))
    errors = lines.check(bad, URL, 100, 4096)[1]
    assert len(errors) == lines.MAX_REPORTED + 1 and errors[-1]["message"] == "10 more errors are not listed."
    assert lines.check(write(tmp_path / "empty.jsonl", b"", b"  "), URL, 10, 4096)[1][0]["code"] == "empty_file"
    deep = write(tmp_path / "deep.jsonl", b'{"custom_id": "a", "method": "POST", "url": "' + URL.encode()
                 + b'", "body": {"a": ' + b"[" * 400 + b"]" * 400 + b"}}")
    assert lines.check(deep, URL, 10, 4096)[1][0]["code"] == "invalid_body", "deeper than a request can be sent"


def test_validation_is_one_processs_at_a_time_and_not_retried_forever(tmp_path: Path) -> None:
    store = SqliteBatchStore(tmp_path)
    try:
        record = store.add_file("t", "batch", "in.jsonl", lines=[line("a")])
        batch = store.create_batch("t", URL, record.id, "24h", None)
        assert store.begin_validation(batch.id, "p1", 60) == 1
        assert store.begin_validation(batch.id, "p2", 60) is None, "p1 holds it"
        assert store.begin_validation(batch.id, "p1", 60) == 2, "p1 restarted in place takes it back"
        assert store.begin_validation(batch.id, "p2", 0) is None
        store._run("UPDATE batches SET validated_until = 0 WHERE id = ?", (batch.id,))  # p1's lease lapsed
        assert store.begin_validation(batch.id, "p2", 60) == 3
        try:
            store.add_lines(batch.id, "p1", [])
            raise AssertionError("p1 no longer holds the validation")
        except LookupError:
            pass
        found = list(lines.valid_lines(store.file_path(record.id), URL, 10, 4096))
        store.add_lines(batch.id, "p2", found)
        assert store.start_lines(batch.id, "p2", 1)
        assert store.get_batch(batch.id).status == "in_progress"  # type: ignore[union-attr]
    finally:
        store.close()


def test_the_line_gate_shares_its_slots_between_tenants() -> None:
    """A tenant with many lines waiting does not crowd out one with few: a freed slot goes to the waiting
    tenant that holds the fewest."""
    import asyncio

    from gateway.batches.runner import Gate

    async def main() -> list[str]:
        gate, order = Gate(), []
        release = asyncio.Event()

        async def line(tenant: str) -> None:
            async with gate.slot(tenant, 2):
                order.append(tenant)
                await release.wait()
                release.clear()

        tasks = [asyncio.ensure_future(line("big")) for _ in range(12)]
        await asyncio.sleep(0)
        tasks += [asyncio.ensure_future(line("small")) for _ in range(3)]
        while len(order) < 15:
            await asyncio.sleep(0)
            release.set()
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(main())
    assert order[:2] == ["big", "big"], "the first come take the free slots"
    assert max(i for i, t in enumerate(order) if t == "small") <= 6, ("first come, first served would start "
                                                                      "them last, at 12 to 14", order)


def test_files_expire_unless_an_active_batch_reads_them(tmp_path: Path) -> None:
    import time as clock
    store = SqliteBatchStore(tmp_path)
    try:
        old = store.add_file("t", "batch", "old.jsonl", lines=[line("a")])
        read = store.add_file("t", "batch", "read.jsonl", lines=[line("a")])
        store.create_batch("t", URL, read.id, "24h", None)
        assert store.tenant_usage("t") == (2, old.bytes + read.bytes)
        assert store.expire_files(clock.time() + 10) == 1, "the one an active batch reads is kept"
        assert store.get_file("t", old.id) is None and store.get_file("t", read.id) is not None
        assert not store.file_path(old.id).exists()
    finally:
        store.close()
