"""The audit log bounded in bytes, in SQLite (PostgreSQL: tests/process/keys/test_audit_bounds.py): an entry's
details never pass MAX_DETAILS_BYTES (lists cut from their end, large members summarised, a marker saying what
was left out), whichever change writes it (a key's too), and an entry stored before the bound reads bounded; the
log reads in pages bounded in bytes, which together hold every entry in its range once, newest first."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.keys.service import audit_entry
from gateway.keys.store import (
    ENTRY_OVERHEAD_BYTES,
    MAX_DETAILS_BYTES,
    KeyStore,
    SqliteKeyStore,
    bounded,
)

SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=300))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=30) | st.dictionaries(
    st.text(max_size=10), inner, max_size=5), max_leaves=100)
DETAILS = st.dictionaries(st.text(max_size=20).filter(lambda k: k != "truncated"), JSON, max_size=8)


@pytest.fixture(params=["sqlite"])  # tests/process/keys/test_audit_bounds.py runs these on PostgreSQL
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyStore]:
    made = SqliteKeyStore(tmp_path / "admin.sqlite3")
    yield made
    made._disconnect()


def check_bounded(details: dict[str, Any], limit: int) -> dict[str, Any]:
    """``bounded``'s contract on one object: within the limit, as given when it fits, else each list a prefix of
    the original with its left-out count, each other member whole or summarised, and the whole's size said."""
    text = orjson.dumps(details).decode()
    out = bounded(text, limit)
    assert len(out.encode()) <= limit
    shown = orjson.loads(out)
    if len(text.encode()) <= limit:
        assert out == text
        return shown
    marker = shown.pop("truncated")
    assert marker["bytes"] == len(text.encode()) and marker["bytes_left_out"] > 0
    if "members_left_out" in marker:
        assert shown == {} and marker["members_left_out"] == len(details)
        return shown
    assert list(shown) == list(details), "members keep their order"
    for name, value in details.items():
        if isinstance(value, list):
            kept = shown[name]
            assert kept == value[:len(kept)], "a list is cut from its end"
            assert len(kept) + marker["left_out"].get(name, 0) == len(value)
        else:
            assert shown[name] == value or set(shown[name]) == {"omitted"}
    return shown


@settings(max_examples=150, deadline=None)
@given(details=DETAILS, limit=st.sampled_from([1024, 4096, MAX_DETAILS_BYTES]))
def test_any_details_are_bounded_with_a_marker_saying_what_was_left_out(details: dict[str, Any],
                                                                         limit: int) -> None:
    check_bounded(details, limit)


def test_a_policy_change_of_hundreds_of_paths_keeps_its_total_and_says_how_many_paths_were_left_out() -> None:
    changes = [{"path": f"tenants.t{i}.keys", "change": "changed", "old": ["key-" + secrets.token_hex(6)] * 20,
                "new": ["key-" + secrets.token_hex(6)] * 20} for i in range(200)]
    details = {"digest": {"old": "a" * 64, "new": "b" * 64}, "changes": changes, "changes_total": 731}
    assert len(orjson.dumps(details)) > 10 * MAX_DETAILS_BYTES
    shown = check_bounded(details, MAX_DETAILS_BYTES)
    assert shown["digest"] == details["digest"] and shown["changes_total"] == 731, "the small members stay whole"
    kept = len(shown["changes"])
    assert 10 < kept < 200
    marker = orjson.loads(bounded(orjson.dumps(details).decode()))["truncated"]
    assert marker["left_out"] == {"changes": 200 - kept}


def test_a_non_object_or_unreadable_entry_is_the_marker_alone() -> None:
    for text in (orjson.dumps(["x" * 40_000]).decode(), "{" + "x" * 40_000):
        out = orjson.loads(bounded(text))
        assert out == {"truncated": {"bytes": len(text), "bytes_left_out": len(text), "left_out": {}}}


def entry(n: int, size: int) -> dict[str, Any]:
    return audit_entry(1_800_000_000.0 + n, "admin:x", "127.0.0.1", "policy.apply", f"t{n}",
                       {"n": n, "changes": [{"path": f"p{i}", "v": "x" * 90} for i in range(size // 100)]})


def test_every_write_is_bounded_a_keys_too_and_an_old_entry_reads_bounded(store: KeyStore) -> None:
    store.add_audit(entry(1, 200_000))
    big_key = audit_entry(1_800_000_002.0, "admin:x", None, "key.create", "key-1", {
        "tenant": "t", "models": [f"model-{i:04d}-" + "m" * 100 for i in range(1000)]})
    store.add({"id": "key-1", "digest": "d" * 64, "tenant": "t", "name": "", "created_at": 1.0,
               "created_by": "admin:x", "expires_at": None, "revoked_at": None, "revoked_by": None,
               "rotated_from": None, "rotated_to": None, "limits": "{}"}, big_key)
    old = entry(3, 3_000_000)  # written before the bound: stored whole, as the 31 MB database held them
    store._run("INSERT INTO admin_audit (id, time, actor, client, action, target, details) VALUES (?, ?, ?, ?, ?, "
               "?, ?)", [old[c] for c in ("id", "time", "actor", "client", "action", "target", "details")])
    stored = {r["id"]: r["size"] for r in store._rows(f"SELECT id, {store._octets.format('details')} AS size "
                                                      "FROM admin_audit")}
    assert int(stored.pop(old["id"])) > 1_000_000
    assert len(stored) == 2 and all(int(size) <= MAX_DETAILS_BYTES for size in stored.values()), "bounded as written"
    read = store.audit("0000", "9999", 10)
    assert [e["target"] for e in read] == ["t3", "key-1", "t1"]
    for e in read:
        assert len(e["details"].encode()) <= MAX_DETAILS_BYTES and "truncated" in orjson.loads(e["details"])
    assert orjson.loads(read[1]["details"])["tenant"] == "t"


@settings(max_examples=6, deadline=None)
@given(sizes=st.lists(st.integers(0, 40_000), min_size=1, max_size=30), budget=st.integers(1, 120_000),
       limit=st.integers(1, 9))
def test_pages_bounded_in_bytes_hold_every_entry_once_newest_first(tmp_path_factory: pytest.TempPathFactory,
                                                                   sizes: list[int], budget: int,
                                                                   limit: int) -> None:
    store = SqliteKeyStore(tmp_path_factory.mktemp("pages") / "admin.sqlite3")
    try:
        page_through(store, sizes, budget, limit)
    finally:
        store._disconnect()


def test_pages_on_each_store(store: KeyStore) -> None:
    page_through(store, [0, 30_000, 500, 16_000, 0, 9_000, 40_000, 100, 2_000, 700, 12_000], 40_000, 4)


def page_through(store: KeyStore, sizes: list[int], budget: int, limit: int) -> None:
    for n, size in enumerate(sizes):
        store.add_audit(entry(n, size))
    whole = store.audit("0000", "9999", 1000)
    assert [e["target"] for e in whole] == [f"t{n}" for n in reversed(range(len(sizes)))]
    seen: list[dict[str, Any]] = []
    after = None
    for _ in range(len(sizes) + 1):
        page, more = store.audit_page("0000", "9999", limit, after, budget)
        assert 1 <= len(page) <= limit
        cost = sum(len(e["details"].encode()) + len(e["target"].encode()) + ENTRY_OVERHEAD_BYTES for e in page)
        assert len(page) == 1 or cost <= budget, "over the budget only with one entry"
        seen += page
        if not more:
            break
        after = (page[-1]["time"], page[-1]["id"])
    assert not more and seen == whole, "every entry once, in order"
    assert store.audit_page("0000", "9999", limit, (whole[-1]["time"], whole[-1]["id"]), budget) == ([], False)


def test_a_page_of_the_log_costs_its_own_entries_however_deep_the_cursor(tmp_path: Path) -> None:
    """Paging back through a long log is linear: SQLite's work for the last of 60 pages (its virtual machine's
    steps, not timed) is about the first's. The control is the predicate the pages once had, whose index range
    ended at the period's end for every page: its last page steps through every newer entry first."""
    store = SqliteKeyStore(tmp_path / "admin.sqlite3")
    for n in range(6_000):
        store.add_audit(entry(n, 0))
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    store.db.set_progress_handler(tick, 100)
    work: list[int] = []
    after: tuple[str, str] | None = None
    more = True
    while more:
        steps[0] = 0
        page, more = store.audit_page("0000", "9999", 100, after, None)
        work.append(steps[0])
        after = (page[-1]["time"], page[-1]["id"])
    assert len(work) == 60 and max(work) <= 2 * work[0], work
    old = ("SELECT id FROM admin_audit WHERE time >= ? AND time < ? AND (time < ? OR (time = ? AND id < ?)) "
           "ORDER BY time DESC, id DESC LIMIT 101")
    steps[0] = 0
    assert after is not None
    assert len(store.db.execute(old, ["0000", "9999", after[0], after[0], after[1]]).fetchall()) == 0
    last_page_old = steps[0]
    assert last_page_old > 10 * work[0], f"the control ({last_page_old} against {work[0]}) steps through every entry"
    store._disconnect()
