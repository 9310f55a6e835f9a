"""What a runtime key may do, under hostile use: the app with a data directory over an in-memory ASGI transport, a
scripted worker on loopback that counts what reaches it, and the ledger read back from its SQLite file.

Each test states what must hold whatever the key's holder does: a key's limits bind its batches too, a revoked
key's batch runs nothing more, a rotation hands its successor what was spent and sent, a rotated key stays dead,
a tenant's keys die with it, and a tenant holds at most the policy's number of live keys."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import RateLimited
from gateway.http.app import create_app
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import MAX_USD, Policy
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, policy_dict
from tests.fakes import MODEL, FakeWorker, completion_json, json_of

BUDGET_USD = 0.001
COMPLETION = 200  # tokens each answer of the worker says it generated


class App:
    """The app started over ``tmp_path``, with an admin client and a way to call it with any key."""

    def __init__(self, store: PolicyStore, asgi: Any, admin: httpx.AsyncClient) -> None:
        self.store, self.asgi, self.admin = store, asgi, admin

    def client(self, key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.asgi),  # type: ignore[arg-type]
                                 base_url="http://gateway", headers={"authorization": f"Bearer {key}"})

    async def new_key(self, **spec: Any) -> dict[str, Any]:
        made = await self.admin.post("/admin/keys", json={"tenant": "demo", **spec})
        assert made.status_code == 201, made.text
        return dict(made.json())

    async def batch(self, key: str, lines: int, **body: Any) -> dict[str, Any]:
        """Submit a batch of ``lines`` chat lines under ``key``; the batch object."""
        content = b"".join(orjson.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
                                         "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": COMPLETION, **body}}) + b"\n"
                           for i in range(lines))
        async with self.client(key) as client:
            uploaded = (await client.post("/v1/files", files={"file": ("in.jsonl", content)},
                                          data={"purpose": "batch"})).json()
            made = await client.post("/v1/batches", json={"input_file_id": uploaded["id"],
                                                          "endpoint": "/v1/chat/completions",
                                                          "completion_window": "24h"})
            assert made.status_code == 200, made.text
            return dict(made.json())

    async def finished(self, key: str, batch: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Wait for the runner's task of the batch; the batch object and its output and error lines."""
        driver = self.asgi.app.state.batches._drivers.get(batch["id"])
        if driver is not None:
            await asyncio.wait_for(asyncio.shield(driver), 60)
        async with self.client(key) as client:
            done = (await client.get(f"/v1/batches/{batch['id']}")).json()
            found = []
            for name in ("output_file_id", "error_file_id"):
                if done.get(name):
                    text = (await client.get(f"/v1/files/{done[name]}/content")).content
                    found += [orjson.loads(line) for line in text.splitlines()]
        return done, found


@contextlib.asynccontextmanager
async def started(tmp_path: Path, workers: list[str], **policy: Any) -> AsyncIterator[App]:
    raw = policy_dict(workers)
    raw["pools"]["main"]["cooldown_s"] = 0.0
    for section, values in policy.items():
        raw[section] = {**raw.get(section, {}), **values}
    store = PolicyStore(PolicySnapshot.build(Policy.model_validate(raw), "test"))
    asgi = create_app(store, tmp_path)
    async with asgi.app.router.lifespan_context(asgi.app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi), base_url="http://gateway",  # type: ignore[arg-type]
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
        yield App(store, asgi, admin)


def ledger(tmp_path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows from the ledger the app flushed at its stop."""
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        return db.execute(sql, args).fetchall()


def answering() -> FakeWorker:
    return FakeWorker(json_of(completion_json(prompt=7, completion=COMPLETION)))


def test_a_keys_batch_is_held_to_the_keys_own_budget_and_models(tmp_path: Path) -> None:
    """A key with $0.001 a day submits 60 lines of 200 tokens: the lines that run cost at most its budget, the
    rest end insufficient_quota, and the worker saw exactly the lines that ran. A key narrowed to another model
    has every line refused as that key's request would be (model_not_allowed), none sent to a worker."""
    async def main() -> None:
        async with answering() as worker, started(tmp_path, [worker.url]) as app:
            key = await app.new_key(name="tight", budget={"period": "day", "limit_usd": BUDGET_USD})
            done, lines = await app.finished(key["key"], await app.batch(key["key"], 60))
            ran = [line for line in lines if line["response"] and line["response"]["status_code"] == 200]
            refused = [line for line in lines if line["response"] and line["response"]["status_code"] == 429]
            assert done["request_counts"]["total"] == 60 and len(ran) + len(refused) == 60, done
            assert 0 < len(ran) < 60 and len(worker.requests) == len(ran), (len(ran), len(worker.requests))
            assert {line["response"]["body"]["error"]["code"] for line in refused} == {"insufficient_quota"}

            narrow = await app.new_key(name="other model only", models=["other-model"])
            before = len(worker.requests)
            done, lines = await app.finished(narrow["key"], await app.batch(narrow["key"], 5))
            codes = {line["response"]["body"]["error"]["code"] for line in lines}
            assert codes == {"model_not_allowed"} and len(worker.requests) == before, codes
        spent = ledger(tmp_path, "SELECT sum(cost_usd) FROM ledger WHERE key_id = ?", key["id"])[0][0]
        assert 0 < spent <= BUDGET_USD, spent
    asyncio.run(main())


@pytest.mark.parametrize("end", ["revoke", "expire"])
def test_a_revoked_keys_batch_runs_no_line_past_the_revocation(tmp_path: Path, end: str) -> None:
    """One line at a time; the first line is held in the worker while the key is revoked (or its expiry set to
    now). That line (sent before) is answered; the other 59 end key_revoked and never reach a worker."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.json_response(completion_json(completion=COMPLETION))

    async def main() -> None:
        async with FakeWorker(handler) as worker, started(tmp_path, [worker.url],
                                                          batches={"max_inflight_lines": 1}) as app:
            key = await app.new_key(name="to revoke")
            batch = await app.batch(key["key"], 60)
            await arrived.wait()
            if end == "revoke":
                ended = await app.admin.post(f"/admin/keys/{key['id']}/revoke")
            else:
                ended = await app.admin.patch(f"/admin/keys/{key['id']}", json={"expires_in_s": 0})
            assert ended.status_code == 200, ended.text
            release.set()
            async with app.client(key["key"]) as client:  # the key itself is refused at once
                assert (await client.get("/v1/models")).status_code == 401
            done = await app.admin.get("/admin/keys/" + key["id"])
            assert done.json()["status"] == {"revoke": "revoked", "expire": "expired"}[end]
            batches = app.asgi.app.state.batches
            driver = batches._drivers.get(batch["id"])
            if driver is not None:
                await asyncio.wait_for(asyncio.shield(driver), 60)
            record = await batches.store.do(batches.store.get_batch, batch["id"])
            assert (record.status, record.completed, record.failed) == ("completed", 1, 59), record
            failed = [orjson.loads(r) for r in await asyncio.to_thread(
                lambda: list(batches.store.results(batch["id"], False)))]
            assert {line["error"]["code"] for line in failed} == {"key_revoked"}, failed[:2]
            assert len(worker.requests) == 1, "only the line sent before the revocation ran"
        rows = ledger(tmp_path, "SELECT count(*) FROM ledger WHERE batch = ?", batch["id"])
        assert rows == [(1,)], rows
    asyncio.run(main())


def test_a_keys_batch_lines_wait_for_the_keys_own_rate_limit(tmp_path: Path) -> None:
    """A key allowed 3 requests a minute (its tenant unlimited) submits 8 lines: 3 reach the worker, the fourth is
    refused by the key's own limit (a line waits its retry time, it does not fail) and none past the third is
    sent while the minute lasts."""
    async def main() -> None:
        async with answering() as worker, started(tmp_path, [worker.url],
                                                  batches={"max_inflight_lines": 1}) as app:
            key = await app.new_key(name="paced", rate_limit={"requests_per_minute": 3})
            gw = app.asgi.app.state.batches.gw
            limited, check = asyncio.Event(), gw.ratelimit.check

            async def observed(tenant: Any, *args: Any, **kw: Any) -> Any:
                try:
                    return await check(tenant, *args, **kw)
                except RateLimited:
                    if getattr(tenant, "key_id", None) == key["id"]:
                        limited.set()
                    raise
            gw.ratelimit.check = observed
            batch = await app.batch(key["key"], 8)
            await asyncio.wait_for(limited.wait(), 30)
            assert len(worker.requests) == 3, len(worker.requests)
            async with app.client(key["key"]) as client:
                state = (await client.get(f"/v1/batches/{batch['id']}")).json()
                assert state["status"] == "in_progress" and state["request_counts"]["completed"] == 3, state
                assert (await client.post(f"/v1/batches/{batch['id']}/cancel")).status_code == 200
    asyncio.run(main())


def test_four_rotations_in_a_day_give_no_fresh_budget_nor_rate_window(tmp_path: Path) -> None:
    """A key spent to its 429 and rotated four times: each successor is refused at once (its lineage's spend is
    its own), and the lineage's spend in the ledger stays within the one budget. Its requests per minute carry over
    the same way."""
    async def main() -> None:
        async with answering() as worker, started(tmp_path, [worker.url]) as app:
            key = await app.new_key(name="rotating", budget={"period": "day", "limit_usd": BUDGET_USD},
                                    rate_limit={"requests_per_minute": 1000})
            lineage, secret = [key["id"]], key["key"]
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": COMPLETION}
            for rotation in range(5):
                async with app.client(secret) as client:
                    answered = 0
                    while (got := await client.post("/v1/chat/completions", json=body)).status_code == 200:
                        answered += 1
                        assert answered < 100, "a budget of $0.001 stops 200-token answers well before this"
                    assert got.status_code == 429 and got.json()["error"]["code"] == "insufficient_quota", got.text
                    if rotation:
                        assert answered == 0, f"rotation {rotation}: a successor starts where its lineage stopped"
                if rotation < 4:
                    rotated = await app.admin.post(f"/admin/keys/{lineage[-1]}/rotate", json={"grace_s": 0})
                    assert rotated.status_code == 201, rotated.text
                    lineage.append(rotated.json()["id"])
                    secret = rotated.json()["key"]

            paced = await app.new_key(name="paced", rate_limit={"requests_per_minute": 3})
            async with app.client(paced["key"]) as client:
                for _ in range(3):
                    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            rotated = (await app.admin.post(f"/admin/keys/{paced['id']}/rotate", json={"grace_s": 0})).json()
            async with app.client(rotated["key"]) as client:
                refused = await client.post("/v1/chat/completions", json=body)
                assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded", \
                    refused.text
        marks = ",".join("?" * len(lineage))
        spent = ledger(tmp_path, f"SELECT sum(cost_usd) FROM ledger WHERE key_id IN ({marks})", *lineage)[0][0]
        assert 0 < spent <= BUDGET_USD, spent
    asyncio.run(main())


def test_a_rotated_key_can_be_cut_short_but_never_revived(tmp_path: Path) -> None:
    async def main() -> None:
        async with answering() as worker, started(tmp_path, [worker.url]) as app:
            key = await app.new_key(name="old")
            rotated = await app.admin.post(f"/admin/keys/{key['id']}/rotate", json={"grace_s": 3600})
            assert rotated.status_code == 201
            for expiry in ({"expires_at": None}, {"expires_in_s": 7200}, {"expires_in_s": 10 * 86400}):
                refused = await app.admin.patch(f"/admin/keys/{key['id']}", json=expiry)
                assert refused.status_code == 409 and refused.json()["error"]["code"] == "key_rotated", expiry
            cut = await app.admin.patch(f"/admin/keys/{key['id']}", json={"expires_in_s": 0})
            assert cut.status_code == 200 and cut.json()["status"] == "expired", cut.text
            revived = await app.admin.patch(f"/admin/keys/{key['id']}", json={"expires_at": None})
            assert revived.status_code == 409, "an expired rotated key stays expired"
            async with app.client(key["key"]) as client:
                assert (await client.get("/v1/models")).status_code == 401
            async with app.client(rotated.json()["key"]) as client:
                assert (await client.get("/v1/models")).status_code == 200
    asyncio.run(main())


def test_a_tenant_holds_at_most_its_cap_of_live_keys_and_the_list_pages(tmp_path: Path) -> None:
    """With keys.max_per_tenant 5, the sixth live key is refused (409 too_many_keys) until one is revoked. A key
    whose predecessor is in its grace is not rotated again (a lineage holds at most two live keys). The list
    pages newest first: every page size walks every key exactly once, in order."""
    async def main() -> None:
        async with answering() as worker, started(tmp_path, [worker.url], keys={"max_per_tenant": 5}) as app:
            made = [await app.new_key(name=f"k{i}") for i in range(5)]
            refused = await app.admin.post("/admin/keys", json={"tenant": "demo", "name": "sixth"})
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "too_many_keys", refused.text
            await app.admin.post(f"/admin/keys/{made[0]['id']}/revoke")
            made.append(await app.new_key(name="sixth"))
            rotated = await app.admin.post(f"/admin/keys/{made[1]['id']}/rotate", json={"grace_s": 3600})
            assert rotated.status_code == 201, rotated.text
            again = await app.admin.post(f"/admin/keys/{rotated.json()['id']}/rotate", json={"grace_s": 3600})
            assert again.status_code == 409 and again.json()["error"]["code"] == "rotation_in_grace", again.text
            await app.admin.post(f"/admin/keys/{made[1]['id']}/revoke")
            again = await app.admin.post(f"/admin/keys/{rotated.json()['id']}/rotate", json={"grace_s": 3600})
            assert again.status_code == 201, "once the predecessor is revoked its successor rotates"
            made += [rotated.json(), again.json()]
            whole = (await app.admin.get("/admin/keys", params={"limit": 1000})).json()
            assert [k["id"] for k in whole["data"]] == [k["id"] for k in reversed(made)]
            status = collections.Counter(k["status"] for k in whole["data"])
            assert (status["active"], status["rotated"]) == (5, 1), "one key in its grace beside the cap's five"
            assert whole["has_more"] is False
            for size in (1, 2, 4, 5, 6):
                seen, after = [], None
                while True:
                    params: dict[str, Any] = {"limit": size, **({"after": after} if after else {})}
                    page = (await app.admin.get("/admin/keys", params=params)).json()
                    seen += [k["id"] for k in page["data"]]
                    if not page["has_more"]:
                        break
                    assert len(page["data"]) == size
                    after = page["last_id"]
                assert seen == [k["id"] for k in whole["data"]], size
            for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"after": "key-nope"}):
                assert (await app.admin.get("/admin/keys", params=bad)).status_code == 400, bad
    asyncio.run(main())


def test_a_key_whose_tenant_left_the_policy_is_dead_for_good(tmp_path: Path) -> None:
    """The tenant is removed and added back under the same name: its old keys stay refused (revoked by the
    policy, in the audit log); a key made after it is back works."""
    async def main() -> None:
        async with answering() as worker, started(tmp_path, [worker.url]) as app:
            key = await app.new_key(name="orphan")
            whole = app.store.current.policy
            without = whole.model_copy(update={"tenants": {n: t for n, t in whole.tenants.items() if n != "demo"}})
            await app.store.apply(PolicySnapshot.build(without, "test: demo removed"))
            async with app.client(key["key"]) as client:
                assert (await client.get("/v1/models")).status_code == 401
            await app.store.apply(PolicySnapshot.build(whole, "test: demo back"))
            keys = app.asgi.app.state.gateway.keys
            await keys.refresh()
            async with app.client(key["key"]) as client:
                refused = await client.get("/v1/models")
                assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"], refused.text
            shown = (await app.admin.get(f"/admin/keys/{key['id']}")).json()
            assert (shown["status"], shown["revoked_by"]) == ("revoked", "policy"), shown
            audit = (await app.admin.get("/admin/audit")).json()["data"]
            assert any(e["action"] == "key.revoke" and e["target"] == key["id"] and
                       e["details"].get("reason") == "tenant_removed" for e in audit), audit
            fresh = await app.new_key(name="after")
            async with app.client(fresh["key"]) as client:
                assert (await client.get("/v1/models")).status_code == 200
    asyncio.run(main())


money = st.floats(min_value=1e-9, max_value=MAX_USD, allow_nan=False, allow_infinity=False)


@settings(max_examples=25, deadline=None)
@given(limit=money, price=st.floats(min_value=0, max_value=1e6, allow_nan=False), tokens=st.integers(1, 10_000_000))
def test_no_amount_the_policy_accepts_makes_a_request_fail_in_the_gateway(limit: float, price: float,
                                                                          tokens: int) -> None:
    """Any budget, price and max_tokens cap the policy accepts gives an answer or a refusal, never a 5xx from the
    budget arithmetic; an amount past the bounds ("unlimited" as 1e308) is refused when the policy loads."""
    raw = policy_dict(["http://127.0.0.1:9"])
    raw["tenants"]["demo"]["budget"] = {"period": "day", "limit_usd": limit}
    raw["tiers"]["standard"]["max_tokens_cap"] = tokens
    raw["prices"]["models"][MODEL] = [{"effective": "2026-01-01", "input_per_m": price, "output_per_m": price}]

    async def main() -> int:
        store = PolicyStore(PolicySnapshot.build(Policy.model_validate(raw), "test"))
        asgi = create_app(store, None)
        async with asgi.app.router.lifespan_context(asgi.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=asgi), base_url="http://gateway",  # type: ignore[arg-type]
                headers={"authorization": "Bearer " + DEMO_KEY}) as client:
            got = await client.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens})
            return got.status_code
    assert asyncio.run(main()) in (400, 429, 503)  # 503: no worker answers on port 9


def test_an_unbounded_amount_is_refused_at_load() -> None:
    import pytest
    from pydantic import ValidationError

    for section, path, value in (("tenants", ("demo", "budget"), {"period": "day", "limit_usd": 1e308}),
                                 ("tenants", ("demo", "rate_limit"), {"requests_per_minute": 10**30})):
        raw = policy_dict(["http://127.0.0.1:9"])
        raw[section][path[0]][path[1]] = value
        with pytest.raises(ValidationError) as refused:
            Policy.model_validate(raw)
        assert path[1] in str(refused.value), refused.value



def test_odd_digits_and_far_moments_are_400s_never_500s(tmp_path: Path) -> None:
    """str.isdigit() takes "²" and "٣" as digits that int() refuses; a zone offset at year 9999 overflows a
    timestamp: each is a clear 400 on the admin API, and nothing is stored."""
    async def main() -> None:
        async with answering() as worker, started(tmp_path, [worker.url]) as app:
            for path in ("/admin/keys", "/admin/audit"):
                for odd in ("²", "٣", "1²"):
                    got = await app.admin.get(path, params={"limit": odd})
                    assert got.status_code == 400, (path, odd, got.status_code, got.text)
            key = await app.new_key(name="far")
            for moment in ("9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"):
                made = await app.admin.post("/admin/keys", json={"tenant": "demo", "expires_at": moment})
                moved = await app.admin.patch(f"/admin/keys/{key['id']}", json={"expires_at": moment})
                assert (made.status_code, moved.status_code) == (400, 400), (moment, made.text, moved.text)
            listed = (await app.admin.get("/admin/keys")).json()["data"]
            assert [k["id"] for k in listed] == [key["id"]] and listed[0]["expires_at"] is None
    asyncio.run(main())
