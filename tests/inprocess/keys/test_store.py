"""The key and audit tables, in SQLite (PostgreSQL: tests/process/keys/test_store.py): changes numbered in
commit order, so a reader that asks for what came after the last number it holds never misses a row, even while
writers race; a refused change writes nothing; the audit log reads newest first within its range."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import Conflict
from gateway.keys.service import audit_entry
from gateway.keys.store import Change, KeyStore, SqliteKeyStore


@pytest.fixture(params=["sqlite"])  # tests/process/keys/test_store.py runs these on PostgreSQL
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of stores on one database (each a process's own connection)."""
    made: list[KeyStore] = []

    def make() -> KeyStore:
        made.append(SqliteKeyStore(tmp_path / "admin.sqlite3"))
        return made[-1]
    yield make
    for store in made:
        store._disconnect()


def row(kid: str, tenant: str = "t") -> dict[str, Any]:
    return {"id": kid, "digest": kid * 4, "tenant": tenant, "name": "", "created_at": 1.0, "created_by": "admin:x",
            "expires_at": None, "revoked_at": None, "revoked_by": None, "rotated_from": None, "rotated_to": None,
            "limits": "{}"}


def entry(now: float, action: str, target: str) -> dict[str, Any]:
    return audit_entry(now, "admin:x", "127.0.0.1", action, target, {})


def test_a_reader_takes_only_what_changed_after_the_last_change_it_holds(make_store: Any) -> None:
    writer, reader = make_store(), make_store()
    writer.add(row("a"), entry(1.0, "key.create", "a"))
    writer.add(row("b"), entry(2.0, "key.create", "b"))
    first = reader.changed_since(0)
    assert [(r["id"], r["version"]) for r in first] == [("a", 1), ("b", 2)]
    writer.change("a", lambda found: Change({"revoked_at": 5.0, "revoked_by": "admin:x"},
                                            audit=entry(5.0, "key.revoke", "a")))
    later = reader.changed_since(2)
    assert [(r["id"], r["version"], r["revoked_at"]) for r in later] == [("a", 3, 5.0)]
    assert reader.changed_since(3) == []


def test_a_refused_change_writes_nothing_not_even_its_number(make_store: Any) -> None:
    store = make_store()
    store.add(row("a"), entry(1.0, "key.create", "a"))

    def refuse(found: dict[str, Any] | None) -> Change:
        assert found is not None and found["id"] == "a"
        raise Conflict("no", "key_revoked")
    with pytest.raises(Conflict):
        store.change("a", refuse)
    seen: list[dict[str, Any] | None] = []
    store.change("missing", lambda found: seen.append(found) or Change())
    assert seen == [None], "a key that is not there is None to the plan"
    assert [r["version"] for r in store.changed_since(0)] == [1]
    assert [e["action"] for e in store.audit("0000", "9999", 10)] == ["key.create"]
    store.add(row("b"), entry(2.0, "key.create", "b"))
    assert [r["version"] for r in store.changed_since(1)] == [3], "the empty change took 2, the refused none"


def test_a_key_id_or_hash_given_twice_is_refused(make_store: Any) -> None:
    store = make_store()
    store.add(row("a"), entry(1.0, "key.create", "a"))
    with pytest.raises(store.duplicate):
        store.add(row("a"), entry(2.0, "key.create", "a"))
    with pytest.raises(store.duplicate):
        store.add({**row("z"), "digest": row("a")["digest"]}, entry(2.0, "key.create", "z"))
    assert [r["id"] for r in store.changed_since(0)] == ["a"]
    assert len(store.audit("0000", "9999", 10)) == 1, "the audit entry went with the refused key"


def test_racing_writers_never_hide_a_row_from_a_poller(make_store: Any) -> None:
    """Two writers (two processes' connections) add keys while a third polls for what came after the highest
    number it holds: every key is seen, once, each stamp above the last."""
    writers, reader = [make_store(), make_store()], make_store()
    done = threading.Event()
    seen: list[tuple[str, int]] = []

    failures: list[BaseException] = []

    def write(store: KeyStore, name: str) -> None:
        try:
            for i in range(40):
                store.add(row(f"{name}{i}"), entry(float(i), "key.create", f"{name}{i}"))
        except BaseException as e:  # a thread's error is this test's failure
            failures.append(e)

    def poll() -> None:
        version = 0
        try:
            while True:
                finished = done.is_set()
                for r in reader.changed_since(version):
                    seen.append((r["id"], r["version"]))
                    version = max(version, r["version"])
                if finished:
                    return
        except BaseException as e:
            failures.append(e)
    threads = [threading.Thread(target=write, args=(w, n)) for w, n in zip(writers, "xy", strict=True)]
    poller = threading.Thread(target=poll)
    poller.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    poller.join()
    assert not failures, failures
    assert sorted(k for k, _ in seen) == sorted(f"{n}{i}" for n in "xy" for i in range(40))
    assert [v for _, v in seen] == list(range(1, 81)), "numbers in commit order, none skipped"


def test_the_audit_log_reads_newest_first_within_its_range(make_store: Any) -> None:
    store = make_store()
    for i, at in enumerate((1_800_000_000.0, 1_800_000_100.0, 1_800_000_200.0, 1_800_000_300.0)):
        store.add_audit(entry(at, "cache.purge", f"t{i}"))
    every = store.audit("0000", "9999", 10)
    assert [e["target"] for e in every] == ["t3", "t2", "t1", "t0"]
    inside = store.audit(every[2]["time"], every[0]["time"], 10)
    assert [e["target"] for e in inside] == ["t2", "t1"], "from included, to excluded"
    assert [e["target"] for e in store.audit("0000", "9999", 2)] == ["t3", "t2"]
