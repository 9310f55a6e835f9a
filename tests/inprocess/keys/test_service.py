"""Runtime keys through the service, as gateway.auth reads them: a key made by one process is honoured by another
once it polls, a revocation refused there, a rotated key's old value works until its grace ends, an expiry
stops a key, and a key narrows its tenant (never widens it). Real stores: SQLite in tmp_path (PostgreSQL:
tests/process/keys/test_service.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import identify
from gateway.errors import Conflict, InvalidRequest, NotAuthenticated, NotFound, Unavailable
from gateway.keys.model import KeyedTenant, KeySpec, hash_key
from gateway.keys.service import KeyService, serving
from gateway.keys.store import KeyStore, PostgresKeyStore, SqliteKeyStore
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy


def policy(**demo: Any) -> dict[str, Any]:
    return {"tenants": {"demo": {"tier": "standard", "models": ["a", "b"], **demo},
                        "other": {"tier": "premium"}},
            "models": {"a": {"pool": "p"}, "b": {"pool": "p"}, "c": {"pool": "p"}},
            "pools": {"p": {"workers": ["http://127.0.0.1:9"]}}}


def snapshot(**demo: Any) -> PolicySnapshot:
    return PolicySnapshot.build(Policy.model_validate(policy(**demo)), "test")


def bearer(key: str) -> bytes:
    return b"Bearer " + key.encode()


@pytest.fixture(params=["sqlite"])  # tests/process/keys/test_service.py runs these on PostgreSQL
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield lambda: SqliteKeyStore(tmp_path / "admin.sqlite3")


async def started(store: KeyStore, snap: PolicySnapshot) -> KeyService:
    service = KeyService(store)
    await service.start(PolicyStore(snap))
    return service


def test_a_key_made_in_one_process_works_in_another_once_it_polls_and_a_revocation_likewise(
        make_store: Any) -> None:
    async def main() -> None:
        snap_a, snap_b = snapshot(), snapshot()  # each process its own snapshot of one policy
        a, b = await started(make_store(), snap_a), await started(make_store(), snap_b)
        try:
            record, key = await a.create(snap_a, KeySpec(tenant="demo", name="ci"), "admin:x", "10.0.0.1")
            assert record.digest == hash_key(key) and record.id == "key-" + record.digest[:12]
            tenant, kid = identify(bearer(key), snap_a)
            assert (tenant.name, kid) == ("demo", record.id), "at once where it was made"
            with pytest.raises(NotAuthenticated):
                identify(bearer(key), snap_b)
            assert await b.refresh() == 1
            assert identify(bearer(key), snap_b)[1] == record.id

            await a.revoke(record.id, "admin:x", None)
            assert identify(bearer(key), snap_b)[0].name == "demo", "b has not polled yet"
            await b.refresh()
            with pytest.raises(NotAuthenticated, match="revoked"):
                identify(bearer(key), snap_b)
            with pytest.raises(Conflict):
                await b.revoke(record.id, "admin:y", None)
            actions = [e["action"] for e in await b.audit("0000", "9999", 10)]
            assert actions == ["key.revoke", "key.create"]
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())


def test_a_rotated_key_works_until_its_grace_ends_and_its_successor_keeps_its_limits(make_store: Any) -> None:
    async def main() -> None:
        snap = snapshot()
        keys = await started(make_store(), snap)
        try:
            spec = KeySpec(tenant="demo", name="svc", models=["a"], rate_limit={"requests_per_minute": 5})
            old, old_key = await keys.create(snap, spec, "admin:x", None)
            before = time.time()
            new, new_key, previous = await keys.rotate(snap, old.id, 30.0, "admin:x", None)
            assert previous.id == old.id and previous.rotated_to == new.id and new.rotated_from == old.id
            assert previous.expires_at is not None and before + 30 <= previous.expires_at <= time.time() + 30
            assert (new.tenant, new.name, new.models, new.rate_limit) == ("demo", "svc", ("a",), old.rate_limit)
            assert new.expires_at is None, "the old key's own expiry (none) carries over, not the grace"
            assert previous.valid(previous.expires_at - 1) and not previous.valid(previous.expires_at)
            assert previous.status(time.time()) == "rotated" and new.status(time.time()) == "active"
            assert identify(bearer(old_key), snap)[1] == old.id, "in its grace"
            assert identify(bearer(new_key), snap)[1] == new.id
            with pytest.raises(Conflict, match="rotate that one"):
                await keys.rotate(snap, old.id, 30.0, "admin:x", None)

            await keys.expire(old.id, time.time() - 1, "admin:x", None)  # the grace cut short
            with pytest.raises(NotAuthenticated, match="expired"):
                identify(bearer(old_key), snap)
            assert keys.get(old.id).status(time.time()) == "expired"
            await keys.expire(new.id, time.time() + 3600, "admin:x", None)
            assert identify(bearer(new_key), snap)[1] == new.id
            with pytest.raises(NotFound):
                await keys.revoke("key-000000000000", "admin:x", None)
        finally:
            await keys.close()
    asyncio.run(main())


def test_a_key_narrows_its_tenant_and_never_widens_it(tmp_path: Path) -> None:
    async def main() -> None:
        snap = snapshot(budget={"period": "month", "limit_usd": 10},
                        rate_limit={"requests_per_minute": 100, "tokens_per_minute": 1000})
        keys = await started(SqliteKeyStore(tmp_path / "admin.sqlite3"), snap)
        try:
            wide = KeySpec(tenant="demo", models=["a", "c", "nope"], budget={"period": "day", "limit_usd": 11},
                           rate_limit={"requests_per_minute": 101, "tokens_per_minute": 1000},
                           expires_in_s=10)
            with pytest.raises(InvalidRequest) as refused:
                await keys.create(snap, wide, "admin:x", None)
            paths = [d["path"] for d in refused.value.details or []]
            assert paths == ["models.1", "models.2", "budget.limit_usd", "rate_limit.requests_per_minute"]
            for spec, param in ((KeySpec(tenant="ghost"), "tenant"),
                                (KeySpec(tenant="demo", expires_at="2001-01-01T00:00:00"), "expires_at")):
                with pytest.raises(InvalidRequest) as one:
                    await keys.create(snap, spec, "admin:x", None)
                assert one.value.param == param
            assert keys.keys() == [], "nothing made"

            narrow = KeySpec(tenant="demo", models=["b"], budget={"period": "day", "limit_usd": 1},
                             rate_limit={"requests_per_minute": 10})
            record, key = await keys.create(snap, narrow, "admin:x", None)
            view = identify(bearer(key), snap)[0]
            assert isinstance(view, KeyedTenant) and view.key_id == record.id
            assert view.models == frozenset({"b"}) and not view.may_use("a")
            assert view.budget == snap.tenants["demo"].budget, "the tenant's budget still holds beside the key's"
            assert view.key_budget is not None and view.key_budget.limit_usd == 1
            assert view.rate_limit == snap.tenants["demo"].rate_limit and view.key_rate_limit is not None

            _, plain_key = await keys.create(snap, KeySpec(tenant="demo"), "admin:x", None)
            assert identify(bearer(plain_key), snap)[0] is snap.tenants["demo"], "nothing of its own: the tenant"

            narrower = snapshot(models=["a"])  # the policy later takes b from the tenant: the key loses it too
            keys.bind(narrower)
            assert identify(bearer(key), narrower)[0].models == frozenset()
            gone = PolicySnapshot.build(Policy.model_validate({**policy(), "tenants": {"other": {
                "tier": "premium"}}}), "test")
            keys.bind(gone)
            with pytest.raises(NotAuthenticated, match="Incorrect"):
                identify(bearer(plain_key), gone)
        finally:
            await keys.close()
    asyncio.run(main())


def test_keys_hold_under_the_snapshots_of_their_own_gateway_only(tmp_path: Path) -> None:
    """Two gateways in one process (tests do that) each honour their own keys; a snapshot no gateway serves
    knows only the policy's keys, and a closed service none."""
    async def main() -> None:
        mine, theirs = snapshot(), snapshot()
        keys = await started(SqliteKeyStore(tmp_path / "a.sqlite3"), mine)
        other = await started(SqliteKeyStore(tmp_path / "b.sqlite3"), theirs)
        _, key = await keys.create(mine, KeySpec(tenant="demo"), "admin:x", None)
        assert serving(mine) is keys and serving(theirs) is other
        with pytest.raises(NotAuthenticated):
            identify(bearer(key), theirs)
        await keys.close()
        with pytest.raises(NotAuthenticated):
            identify(bearer(key), mine)
        assert serving(mine) is None
        await other.close()
    asyncio.run(main())


def test_an_unreachable_store_keeps_the_known_keys_and_answers_changes_with_503(tmp_path: Path) -> None:
    async def main() -> None:
        snap = snapshot()
        place = tmp_path / "state"
        place.mkdir()
        store = SqliteKeyStore(place / "admin.sqlite3")
        keys = await started(store, snap)
        try:
            _, key = await keys.create(snap, KeySpec(tenant="demo"), "admin:x", None)
            await store.do(store._disconnect)
            place.rename(tmp_path / "elsewhere")  # the database cannot be opened any more
            with pytest.raises(Unavailable):
                await keys.refresh()
            with pytest.raises(Unavailable):
                await keys.create(snap, KeySpec(tenant="demo"), "admin:x", None)
            assert identify(bearer(key), snap)[0].name == "demo", "the keys known so far stay in force"
        finally:
            await keys.close()
        down = KeyService(PostgresKeyStore("postgresql://postgres@127.0.0.1:1/none"))  # nothing listens there
        await down.start(PolicyStore(snapshot()))  # a gateway starts while its database is down
        with pytest.raises(Unavailable):
            await down.refresh()
        await down.close()
    asyncio.run(main())


def test_a_process_on_an_older_policy_never_revokes_a_new_tenants_keys(make_store: Any) -> None:
    """A tenant added on one process, its key made there at once: a sibling still on the policy without the
    tenant (its file watcher a second behind, or a replica started from an older file) revokes nothing. Only a
    process that saw the tenant leave (a policy with it, then one without) revokes its keys, for good."""
    async def main() -> None:
        older = snapshot()
        raw = policy()
        raw["tenants"]["newco"] = {"tier": "standard"}
        newer = PolicySnapshot.build(Policy.model_validate(raw), "test: newco added")
        ahead, behind = await started(make_store(), newer), await started(make_store(), older)
        try:
            record, key = await ahead.create(newer, KeySpec(tenant="newco", name="first"), "admin:x", None)
            await behind.refresh()
            await ahead.refresh()
            assert ahead.get(record.id).revoked_at is None, "the lagging process revoked a key it cannot judge"
            assert identify(bearer(key), newer)[0].name == "newco"
            behind.bind(newer)  # it catches up: still nothing to revoke
            await behind.refresh()
            assert behind.get(record.id).revoked_at is None
            behind.bind(older)  # the tenant leaves, as this process sees it: the key dies
            await behind.refresh()
            await ahead.refresh()
            assert ahead.get(record.id).revoked_by == "policy"
        finally:
            await ahead.close()
            await behind.close()
    asyncio.run(main())
