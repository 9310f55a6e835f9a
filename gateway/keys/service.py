"""The runtime keys this process honours, and the admin actions that change them.

Requests are checked against an in-memory map (sha256 of the key -> its record), never the database. The map is
kept in step by a poll every ``POLL_S`` seconds of the rows stamped after the last change it holds
(gateway.keys.store): a key made, revoked, rotated or given an expiry on one replica is seen by every other
within a poll, and by the one that made the change at once. Expiry (a rotated key's grace included) needs no
poll: each request compares the record's ``expires_at`` with the clock. While the store does not answer, the
last map stays in force (logged once) and the admin key operations answer 503.

A policy snapshot is bound to the service of the gateway that serves it (``bind``, at start and on every
reload, before any request sees the new snapshot): ``gateway.auth.identify`` finds the keys valid under a
snapshot through ``serving(snapshot)``, so two gateways in one process (tests) keep their keys apart.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from gateway.errors import Conflict, InvalidRequest, KeyRevoked, NotFound
from gateway.keys.model import (
    KeyRecord,
    KeySpec,
    hash_key,
    iso,
    key_id,
    narrowed,
    new_key,
    spec_problems,
)
from gateway.keys.store import Change, KeyStore, open_key_store
from gateway.ledger import times
from gateway.policy.loader import PolicySnapshot, PolicyStore, TenantView
from gateway.policy.schema import StatePolicy

log = logging.getLogger("tollgate.keys")
POLL_S = 0.25
_serving: dict[int, KeyService] = {}  # id of a live policy snapshot -> the service whose keys hold under it


def serving(snapshot: PolicySnapshot) -> KeyService | None:
    return _serving.get(id(snapshot))


def audit_entry(now: float, actor: str, client: str | None, action: str, target: str | None,
                details: dict[str, Any]) -> dict[str, Any]:
    return {"id": secrets.token_hex(8), "time": times.at(now), "actor": actor, "client": client,
            "action": action, "target": target, "details": orjson.dumps(details).decode()}


class KeyService:
    def __init__(self, store: KeyStore, poll_s: float = POLL_S, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.poll_s = poll_s
        self.clock = clock
        self.version = 0  # the highest change this process holds
        self._by_digest: dict[str, KeyRecord] = {}
        self._by_id: dict[str, KeyRecord] = {}
        self._views: dict[str, tuple[TenantView, int, TenantView]] = {}  # digest -> (base, version, view)
        self._down = False
        self._bound: PolicySnapshot | None = None  # the newest snapshot bound
        self._orphans: set[str] = set()  # keys whose tenant left the policy, to be revoked
        self._left: dict[str, float] = {}  # tenants this process saw leave the policy -> when

    # -- the request path ------------------------------------------------------------------------------------

    def find(self, digest: str) -> KeyRecord | None:
        return self._by_digest.get(digest)

    def view(self, snapshot: PolicySnapshot, record: KeyRecord) -> TenantView | None:
        """The key's tenant as the key narrows it, under this snapshot (None: the tenant left the policy)."""
        base = snapshot.tenants.get(record.tenant)
        if base is None or record.id in self._orphans:  # an orphan stays dead while its revocation is pending
            return None
        cached = self._views.get(record.digest)
        if cached is not None and cached[0] is base and cached[1] == record.version:
            return cached[2]
        view = narrowed(base, record, self.lineage(record))
        self._views[record.digest] = (base, record.version, view)
        return view

    def lineage(self, record: KeyRecord) -> tuple[str, ...]:
        """The key's id and those it was rotated from, oldest first (a broken chain ends where it breaks)."""
        chain = [record.id]
        seen = {record.id}
        while (previous := self._by_id.get(chain[-1])) is not None and previous.rotated_from is not None \
                and previous.rotated_from not in seen:
            chain.append(previous.rotated_from)
            seen.add(previous.rotated_from)
        return tuple(reversed(chain))

    def holder(self, snapshot: PolicySnapshot, kid: str, now: float) -> TenantView | None:
        """The tenant view a runtime key's deferred work (a batch's lines) runs under now: the key's, or, when it
        was rotated and its grace ended, its live successor's. None: no runtime key of that id (a policy key's
        work runs as its tenant). Raises ``KeyRevoked`` when neither the key nor a successor is live, or the key's
        tenant left the policy."""
        record = self._by_id.get(kid)
        if record is None:
            return None
        seen = {record.id}
        while not record.valid(now) and record.revoked_at is None and record.rotated_to is not None:
            successor = self._by_id.get(record.rotated_to)
            if successor is None or successor.id in seen:
                break
            record = successor
            seen.add(record.id)
        if not record.valid(now):
            raise KeyRevoked(f"The API key {kid} that submitted this work is {record.status(now)}.")
        view = self.view(snapshot, record)
        if view is None:
            raise KeyRevoked(f"The API key {kid}'s tenant '{record.tenant}' is no longer in the policy.")
        return view

    def bind(self, snapshot: PolicySnapshot) -> None:
        """Honour this service's keys under ``snapshot`` (a PolicyStore listener: called before any request
        reads the new snapshot)."""
        sid = id(snapshot)
        if sid not in _serving:
            weakref.finalize(snapshot, _serving.pop, sid, None)
        _serving[sid] = self
        previous, self._bound = self._bound, snapshot
        if previous is not None:
            now = self.clock()
            for name in previous.tenants.keys() - snapshot.tenants.keys():
                self._left[name] = now
        self._orphans.update(self._orphaned(self._by_id.values()))

    def _orphaned(self, records: Iterable[KeyRecord]) -> set[str]:
        """Keys not yet revoked that were made before their tenant left the policy, as this process saw it leave
        (a policy it applied without the tenant, after one with it). A process still on an older policy, or
        started without the tenant, revokes nothing: it may simply not have the newer policy yet."""
        left = self._left
        return {r.id for r in records
                if r.revoked_at is None and r.tenant in left and r.created_at <= left[r.tenant]}

    async def _retire(self) -> None:
        """Revoke, for good, the keys whose tenant left the policy (a tenant of that name added back later is a
        new tenant and gets new keys). Audited as the policy's doing; another replica's revocation first is
        fine."""
        now = self.clock()
        for kid in sorted(self._orphans):
            def plan(row: dict[str, Any] | None, kid: str = kid) -> Change:
                if row is None or row["revoked_at"] is not None:
                    return Change()
                return Change({"revoked_at": now, "revoked_by": "policy"}, audit=audit_entry(
                    now, "policy", None, "key.revoke", kid,
                    {"tenant": row["tenant"], "name": row["name"], "reason": "tenant_removed"}))
            await self.store.do(self.store.change, kid, plan)
            self._orphans.discard(kid)

    # -- keeping in step --------------------------------------------------------------------------------------

    async def start(self, policies: PolicyStore) -> None:
        self.bind(policies.current)
        policies.listeners.append(self.bind)
        await self._refresh_quietly()

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self._refresh_quietly()

    async def refresh(self) -> int:
        """Take the changes made since the last one held; how many keys changed."""
        rows = await self.store.do(self.store.changed_since, self.version)
        for row in rows:
            try:
                record = KeyRecord.from_row(row)
            except Exception:  # a row this version cannot read: skipped, the others still hold
                log.exception("key %s unreadable; skipped", row.get("id"))
                continue
            held = self._by_id.get(record.id)
            if held is None or held.version < record.version:  # a slower poll's older rows never win
                self._by_id[record.id] = self._by_digest[record.digest] = record
                self._orphans.update(self._orphaned((record,)))
            self.version = max(self.version, record.version)
        if self._orphans:
            await self._retire()
            return len(rows) + await self.refresh()
        return len(rows)

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:
            if not self._down:
                log.error("key store unreachable (%s): the runtime keys known so far stay in force", exc)
                self._down = True
            return
        if self._down:
            log.warning("key store reachable again")
            self._down = False

    async def close(self) -> None:
        """Stop honouring the keys (a restart of this service reads them all again)."""
        for sid in [s for s, service in _serving.items() if service is self]:
            _serving.pop(sid, None)
        self._by_id.clear()
        self._by_digest.clear()
        self._views.clear()
        self.version = 0
        await asyncio.to_thread(self.store.close)

    # -- admin -------------------------------------------------------------------------------------------------

    def keys(self, tenant: str | None = None) -> list[KeyRecord]:
        """Newest first."""
        found = [r for r in self._by_id.values() if tenant is None or r.tenant == tenant]
        return sorted(found, key=lambda r: (r.created_at, r.id), reverse=True)

    def page(self, tenant: str | None, after: str | None, limit: int) -> tuple[list[KeyRecord], bool]:
        """Newest first: at most ``limit`` keys after the key ``after`` (the last of the page before), and whether
        more follow."""
        found = self.keys(tenant)
        if after is not None:
            anchor = self._by_id.get(after)
            if anchor is None or (tenant is not None and anchor.tenant != tenant):
                raise InvalidRequest(f"after: no key {after[:40]!r} in this list.", "invalid_cursor", param="after")
            mark = (anchor.created_at, anchor.id)
            found = [r for r in found if (r.created_at, r.id) < mark]
        if len(found) <= limit:
            return found, False
        return found[:limit], True

    def get(self, kid: str) -> KeyRecord:
        record = self._by_id.get(kid)
        if record is None:
            raise _no_such_key(kid)
        return record

    async def create(self, snapshot: PolicySnapshot, spec: KeySpec, actor: str,
                     client: str | None) -> tuple[KeyRecord, str]:
        """A new key for the spec's tenant: (its record, the key itself, which is never stored)."""
        now = self.clock()
        problems = spec_problems(snapshot, spec, now)
        if problems:
            raise _invalid(problems)
        limits = {"budget": spec.budget.model_dump(mode="json") if spec.budget else None,
                  "rate_limit": spec.rate_limit.model_dump(mode="json") if spec.rate_limit else None,
                  "models": spec.models}
        for attempt in range(3):  # an id is 48 bits of the hash: a clash is refused by the table, and redrawn
            secret, digest = _fresh()
            row: dict[str, Any] = {
                **dict.fromkeys(("revoked_at", "revoked_by", "rotated_from", "rotated_to")),
                "id": key_id(digest), "digest": digest, "tenant": spec.tenant, "name": spec.name,
                "created_at": now, "created_by": actor, "expires_at": spec.expiry(now),
                "limits": orjson.dumps(limits).decode()}
            audit = audit_entry(now, actor, client, "key.create", row["id"], {
                "tenant": spec.tenant, "name": spec.name, "expires_at": iso(row["expires_at"]), **limits})
            try:
                await self.store.do(self.store.add, row, audit, (snapshot.policy.keys.max_per_tenant, now))
                break
            except self.store.duplicate:
                if attempt == 2:
                    raise
        await self._refresh_quietly()
        return self._by_id.get(row["id"]) or KeyRecord.from_row({**row, "version": 0}), secret

    async def revoke(self, kid: str, actor: str, client: str | None) -> KeyRecord:
        now = self.clock()

        def plan(row: dict[str, Any] | None) -> Change:
            row = _live(kid, row, now, expired_ok=True)
            return Change({"revoked_at": now, "revoked_by": actor}, audit=audit_entry(
                now, actor, client, "key.revoke", kid, {"tenant": row["tenant"], "name": row["name"]}))
        return await self._change(kid, plan)

    async def rotate(self, snapshot: PolicySnapshot, kid: str, grace_s: float, actor: str,
                     client: str | None) -> tuple[KeyRecord, str, KeyRecord]:
        """A new key with the old one's tenant, name, limits and expiry; the old one stays valid ``grace_s``
        more seconds (never past its own expiry). (the new record, its key, the old record).

        A lineage holds at most two live keys: a key whose predecessor is still in its grace is not rotated
        again (409 ``rotation_in_grace``) until that grace ends or the predecessor is revoked. So rotations add at
        most one live key per key the cap admitted, and a tenant holds at most twice ``keys.max_per_tenant``
        live keys, half of them in their grace. Read from this process's copy of the keys, refreshed first: a
        key's row and its predecessor's grace are written in one transaction, and a grace is never lengthened, so
        a copy that holds the key knows a grace at least as long as the real one (a stale read refuses, never
        admits)."""
        await self.refresh()
        now = self.clock()
        record = self._by_id.get(kid)
        before = self._by_id.get(record.rotated_from) if record is not None and record.rotated_from else None
        if before is not None and before.valid(now):
            raise Conflict(f"{kid} replaced {before.id}, which works until {iso(before.expires_at)}: rotate {kid} "
                           f"once that grace is over, or revoke {before.id} first.", "rotation_in_grace")
        clashes = 0
        while True:
            secret, digest = _fresh()
            try:
                old = await self._change(kid, self._rotation(snapshot, kid, digest, grace_s, now, actor, client))
            except self.store.duplicate:  # the new id taken (see create)
                clashes += 1
                if clashes == 3:
                    raise
                continue
            return self.get(key_id(digest)), secret, old

    @staticmethod
    def _rotation(snapshot: PolicySnapshot, kid: str, digest: str, grace_s: float, now: float, actor: str,
                  client: str | None) -> Callable[[dict[str, Any] | None], Change]:
        new_id = key_id(digest)

        def plan(row: dict[str, Any] | None) -> Change:
            row = _live(kid, row, now)
            if row["rotated_to"]:
                raise Conflict(f"{kid} was rotated already, to {row['rotated_to']}: rotate that one.", "key_rotated")
            if row["tenant"] not in snapshot.tenants:
                raise Conflict(f"{kid}'s tenant '{row['tenant']}' is no longer in the policy.", "tenant_removed")
            ends = now + grace_s
            until = min(ends, row["expires_at"]) if row["expires_at"] is not None else ends
            successor = {**row, "id": new_id, "digest": digest, "created_at": now, "created_by": actor,
                         "rotated_from": kid, "rotated_to": None}
            return Change({"expires_at": until, "rotated_to": new_id}, [successor], audit_entry(
                now, actor, client, "key.rotate", kid, {"tenant": row["tenant"], "new": new_id, "grace_s": grace_s,
                                                        "old_valid_until": iso(until)}))
        return plan

    async def expire(self, kid: str, at: float | None, actor: str, client: str | None) -> KeyRecord:
        """Set (or with None, clear) when the key stops working; a time already past stops it now."""
        now = self.clock()

        def plan(row: dict[str, Any] | None) -> Change:
            row = _live(kid, row, now, expired_ok=True)
            if row["rotated_to"] and (at is None or row["expires_at"] is None or at > row["expires_at"]):
                raise Conflict(f"{kid} was rotated to {row['rotated_to']}: its expiry can be brought forward, "
                               "never put back (use the successor).", "key_rotated")
            return Change({"expires_at": at}, audit=audit_entry(now, actor, client, "key.expire", kid, {
                "tenant": row["tenant"], "expires_at": {"old": iso(row["expires_at"]), "new": iso(at)}}))
        return await self._change(kid, plan)

    async def _change(self, kid: str, plan: Callable[[dict[str, Any] | None], Change]) -> KeyRecord:
        await self.store.do(self.store.change, kid, plan)
        await self._refresh_quietly()
        return self.get(kid)

    async def record(self, actor: str, client: str | None, action: str, target: str | None,
                     details: dict[str, Any]) -> None:
        """An admin action that changes no key (a policy applied, a cache purged) in the audit log."""
        entry = audit_entry(self.clock(), actor, client, action, target, details)
        await self.store.do(self.store.add_audit, entry)

    async def audit(self, start: str, end: str, limit: int) -> list[dict[str, Any]]:
        rows = await self.store.do(self.store.audit, start, end, limit)
        return [{**row, "details": orjson.loads(row["details"])} for row in rows]


def _fresh() -> tuple[str, str]:
    """A new key and its hash."""
    secret = new_key()
    return secret, hash_key(secret)


def _live(kid: str, row: dict[str, Any] | None, now: float, expired_ok: bool = False) -> dict[str, Any]:
    """The row of a key that can still be changed: not revoked (nor expired, unless ``expired_ok``)."""
    if row is None:
        raise _no_such_key(kid)
    if row["revoked_at"] is not None:
        raise Conflict(f"{kid} is revoked.", "key_revoked")
    if not expired_ok and row["expires_at"] is not None and row["expires_at"] <= now:
        raise Conflict(f"{kid} has expired.", "key_expired")
    return row


def _no_such_key(kid: str) -> NotFound:
    return NotFound(f"No runtime API key {kid[:40]!r} (keys listed in the policy change with the policy).",
                    "key_not_found")


def _invalid(problems: list[tuple[str, str]]) -> InvalidRequest:
    param, message = problems[0]
    error = InvalidRequest(f"{param}: {message}" if len(problems) == 1 else
                           "; ".join(f"{p}: {m}" for p, m in problems), "invalid_key_spec", param=param)
    error.details = [{"path": p, "message": m} for p, m in problems]
    return error


def open_keys(state: StatePolicy, data_dir: Path | None) -> KeyService:
    return KeyService(open_key_store(data_dir, state.postgres_dsn))

