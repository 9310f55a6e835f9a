"""The admin API in-process (the app over an in-memory ASGI transport, its gateway started): every route needs
the admin token (another role's credential is 403, an unknown one 401), a rejected policy leaves the running
one, the read-outs filter and name what they say, the live policy reads with its secrets redacted, runtime keys
are made, rotated, expired and revoked over the API, and every change is in the audit log with who, when, what
and from where."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from gateway.auth import hash_key
from gateway.http import admin, keys_api
from gateway.http.app import HotPaths, create_app
from gateway.policy.loader import PolicyError, PolicySnapshot, PolicyStore, parse_policy
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, FINANCE_TOKEN, policy_dict

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN_ID = "admin:" + hash_key(ADMIN_TOKEN)[:12]
METRICS_TOKEN = "tg-test-metrics-token"
ROUTES = [*admin.ROUTES, *keys_api.ROUTES]


@asynccontextmanager
async def admin_client(policy: dict[str, Any] | None = None, data_dir: Path | None = None,
                       peer: tuple[str, int] = ("127.0.0.1", 123),
                       ) -> AsyncIterator[tuple[httpx.AsyncClient, HotPaths]]:
    """The app on the test policy (a worker nobody listens on), its gateway running, and a client for it (calling
    from ``peer``)."""
    policy = policy or policy_dict(["http://127.0.0.1:9"])
    app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")), data_dir)
    transport = httpx.ASGITransport(app=app, client=peer)  # type: ignore[arg-type]
    async with app.gateway.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client, app


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def every_route(client: httpx.AsyncClient, headers: dict[str, str]) -> Any:
    async def calls() -> list[tuple[str, int, str]]:
        seen = []
        for route in ROUTES:
            for method in sorted(route.methods or ()):
                if method == "HEAD":
                    continue
                reply = await client.request(method, route.path, headers=headers)
                seen.append((f"{method} {route.path}", reply.status_code, reply.json()["error"]["code"]))
        return seen
    return calls()


@pytest.mark.parametrize("token", [None, "tg-nobody-knows-this", "revoked"])
def test_every_admin_route_answers_an_unknown_credential_401(token: str | None) -> None:
    async def main() -> list[tuple[str, int, str]]:
        async with admin_client() as (client, _):
            if token == "revoked":
                made = (await client.post("/admin/keys", headers=ADMIN, json={"tenant": "demo"})).json()
                await client.post(f"/admin/keys/{made['id']}/revoke", headers=ADMIN)
                return await every_route(client, bearer(made["key"]))
            return await every_route(client, bearer(token) if token else {})
    seen = asyncio.run(main())
    assert len(seen) == len(ROUTES)
    assert all(status == 401 and code == "invalid_admin_token" for _, status, code in seen), seen


@pytest.mark.parametrize("token", [DEMO_KEY, FINANCE_TOKEN, METRICS_TOKEN, "runtime"])
def test_every_admin_route_answers_another_roles_credential_403(token: str) -> None:
    """A tenant's key (the policy's or a runtime one), the finance token, the metrics token: known, but not the
    admin's. Each route says so before it reads anything the request carries."""
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["server"]["metrics_token_sha256"] = "sha256:" + hash_key(METRICS_TOKEN)

    async def main() -> list[tuple[str, int, str]]:
        async with admin_client(policy) as (client, _):
            if token == "runtime":
                made = (await client.post("/admin/keys", headers=ADMIN, json={"tenant": "prem"})).json()
                return await every_route(client, bearer(made["key"]))
            return await every_route(client, bearer(token))
    seen = asyncio.run(main())
    assert len(seen) == len(ROUTES)
    assert all(status == 403 and code == "permission_denied" for _, status, code in seen), seen


def test_a_rejected_policy_names_each_error_and_the_running_one_stays() -> None:
    async def main() -> None:
        async with admin_client() as (client, app):
            before = app.gateway.store.current.digest
            bad = policy_dict(["http://127.0.0.1:9"])
            bad["tenants"]["demo"]["tier"] = "platinum"
            bad["tiers"]["batch"]["max_tokens_cap"] = 0
            reply = await client.put("/admin/policy", content=orjson.dumps(bad), headers=ADMIN)
            assert reply.status_code == 400
            error = reply.json()["error"]
            assert error["code"] == "invalid_policy"
            paths = {d["path"] for d in error["details"]}
            assert paths == {"tenants.demo.tier", "tiers.batch.max_tokens_cap"}, "each error, by its path"
            assert app.gateway.store.current.digest == before
            status = (await client.get("/admin/policy/status", headers=ADMIN)).json()
            assert status["digest"] == before and status["reloads_failed"] == 1
            for moment in (status["loaded_at"], status["last_error_at"]):  # for a person to read
                assert datetime.fromisoformat(moment.replace("Z", "+00:00")).tzinfo is not None, moment

            good = policy_dict(["http://127.0.0.1:9"])
            good["tiers"]["standard"]["max_tokens_cap"] = 2048
            reply = await client.put("/admin/policy", content=orjson.dumps(good), headers=ADMIN)
            assert reply.status_code == 200, reply.text
            applied = reply.json()
            assert applied["status"] == "applied" and applied["digest"] != before
            assert "tiers.standard.max_tokens_cap" in orjson.dumps(applied["diff"]).decode()
            assert app.gateway.store.current.tenants["demo"].max_tokens_cap == 2048
    asyncio.run(main())


def test_a_purge_says_what_it_needs_before_it_touches_anything() -> None:
    async def main() -> None:
        async with admin_client() as (client, _):
            twice = await client.delete("/admin/cache?tenant=a&tenant=b&model=m", headers=ADMIN)
            assert twice.status_code == 400 and twice.json()["error"]["code"] == "repeated_parameter"
            assert "tenant" in twice.json()["error"]["message"]
            off = await client.delete("/admin/cache?all=true", headers=ADMIN)
            assert off.status_code == 409 and off.json()["error"]["code"] == "cache_disabled"
    asyncio.run(main())


def test_anomalies_are_newest_first_and_filter_by_tenant_and_kind() -> None:
    async def main() -> None:
        async with admin_client() as (client, app):
            alerts = app.gateway.alerts
            alerts.raise_alert("cost_anomaly", "alert", None, tenant="demo", worst_case_usd=1.0)
            alerts.raise_alert("spend_rate", "alert", None, tenant="demo", hour_usd=2.0)
            alerts.raise_alert("cost_anomaly", "reject", None, tenant="prem", worst_case_usd=3.0)
            every = (await client.get("/admin/anomalies", headers=ADMIN)).json()["data"]
            assert [(a["tenant"], a["kind"]) for a in every] == [
                ("prem", "cost_anomaly"), ("demo", "spend_rate"), ("demo", "cost_anomaly")]
            assert all("_seq" not in a for a in every), "the order it is kept in stays inside"
            demo = (await client.get("/admin/anomalies?tenant=demo&kind=cost_anomaly", headers=ADMIN)).json()
            assert [a["worst_case_usd"] for a in demo["data"]] == [1.0]
    asyncio.run(main())


def test_queues_name_each_model_its_pool_and_whether_it_can_be_served() -> None:
    async def main() -> None:
        async with admin_client() as (client, _):
            reply = await client.get("/admin/queues", headers=ADMIN)
            assert reply.status_code == 200
            seen = reply.json()
            assert seen["models"] == {"sim-llama-8b": {"pool": "main", "ready": False},
                                      "other-model": {"pool": "main", "ready": False}}, "nobody answers on :9"
            assert seen["pools"]["main"]["healthy_workers"] == 0
            assert seen["pools"]["main"]["prefix_blocks"] == {"http://127.0.0.1:9": 0}
            scale = await client.get("/admin/scale", headers=ADMIN)
            assert scale.status_code == 200 and "pools" in scale.json()
    asyncio.run(main())


SECRETS = {"dsn_password": "pg-s3cret", "redis_password": "r3dis-s3cret", "webhook_token": "T0K3N/B0T/xyz",
           "webhook_password": "hookpw", "tracing_password": "otelpw", "worker_password": "workerpw",
           "query_token": "q-s3cret"}


def secret_policy() -> dict[str, Any]:
    policy = policy_dict([f"http://gw:{SECRETS['worker_password']}@127.0.0.1:9"])
    policy["server"]["metrics_token_sha256"] = "sha256:" + hash_key(METRICS_TOKEN)
    policy["spend"] = {"webhook_url": f"https://bot:{SECRETS['webhook_password']}@hooks.example.com/services/"
                                      f"{SECRETS['webhook_token']}?token={SECRETS['query_token']}"}
    policy["tracing"] = {"endpoint": f"http://otel:{SECRETS['tracing_password']}@collector:4318"}
    policy["server"]["trusted_proxies"] = ["127.0.0.1/32"]  # the test client's peer: a proxy in front
    return policy


def test_redaction_takes_every_secret_out_and_keeps_what_says_where() -> None:
    policy = secret_policy()
    policy["state"] = {"postgres_dsn": f"postgresql://tollgate:{SECRETS['dsn_password']}@db:5432/tollgate",
                       "redis_url": f"redis://:{SECRETS['redis_password']}@cache:6379/0"}
    shown = admin.redacted(Policy.model_validate(policy))
    text = orjson.dumps(shown).decode()
    hashes = [hash_key(t) for t in (ADMIN_TOKEN, FINANCE_TOKEN, METRICS_TOKEN, DEMO_KEY)]
    assert [s for s in (*SECRETS.values(), *hashes) if s in text] == []
    assert shown["state"]["postgres_dsn"] == "postgresql://tollgate:<redacted>@db:5432/tollgate", "the user stays"
    assert shown["state"]["redis_url"] == "redis://:<redacted>@cache:6379/0"
    assert shown["spend"]["webhook_url"] == "https://<redacted>@hooks.example.com/<redacted>"
    assert shown["tracing"]["endpoint"] == "http://<redacted>@collector:4318"
    assert shown["pools"]["main"]["workers"] == ["http://gw:<redacted>@127.0.0.1:9/"]
    assert shown["server"]["admin_token_sha256"] == "<redacted>" and shown["server"]["max_body_bytes"] == 65536
    assert shown["tenants"]["demo"]["keys"] == ["key-" + hash_key(DEMO_KEY)[:12]], "as the ledger names the key"
    assert admin.redact_dsn("host=db user=t password='a b' dbname=x") == "host=db user=t password=<redacted> dbname=x"
    assert admin.redact_url("https://tok3n@api.example.com/x?sig=abc&page=2") == \
        "https://<redacted>@api.example.com/x?sig=<redacted>&page=2"


def test_the_live_policy_reads_as_json_or_yaml_with_its_secrets_redacted() -> None:
    async def main() -> None:
        async with admin_client(secret_policy()) as (client, app):
            as_json = await client.get("/admin/policy", headers=ADMIN)
            assert as_json.status_code == 200 and as_json.headers["content-type"] == "application/json"
            assert as_json.headers["x-tollgate-policy-digest"] == app.gateway.store.current.digest
            as_yaml = await client.get("/admin/policy?format=yaml", headers=ADMIN)
            assert as_yaml.status_code == 200 and as_yaml.headers["content-type"].startswith("application/yaml")
            assert yaml.safe_load(as_yaml.text) == as_json.json() == admin.redacted(app.gateway.store.current.policy)
            for text in (as_json.text, as_yaml.text):
                assert [s for s in (*SECRETS.values(), hash_key(ADMIN_TOKEN), hash_key(DEMO_KEY)) if s in text] == []
            assert as_json.json()["tiers"]["standard"]["max_tokens_cap"] == 1024
            bad = await client.get("/admin/policy?format=xml", headers=ADMIN)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "format"
    asyncio.run(main())


def test_a_policy_change_is_audited_path_by_path_with_old_and_new_values_and_no_secret() -> None:
    async def main() -> None:
        async with admin_client(secret_policy()) as (client, app):
            before = app.gateway.store.current.digest
            changed = secret_policy()
            changed["tiers"]["standard"]["max_tokens_cap"] = 2048
            changed["tenants"]["demo"]["keys"].append("sha256:" + hash_key("tg-another-demo-key"))
            changed["spend"]["webhook_url"] = "https://hooks.example.com/services/NEW-S3CRET"
            del changed["tenants"]["bulk"]
            from_proxy = {**ADMIN, "x-forwarded-for": "203.0.113.7"}  # the peer, 127.0.0.1, is a trusted proxy
            reply = await client.put("/admin/policy", content=orjson.dumps(changed), headers=from_proxy)
            assert reply.status_code == 200, reply.text
            bad = secret_policy()
            bad["tenants"]["demo"]["tier"] = "platinum"
            refused = await client.put("/admin/policy", content=orjson.dumps(bad), headers=ADMIN)
            assert refused.status_code == 400

            log = (await client.get("/admin/audit", headers=ADMIN)).json()["data"]
            assert [e["action"] for e in log] == ["policy.reject", "policy.apply"], "newest first"
            rejected, applied = log
            assert rejected["details"]["errors"] == ["tenants.demo.tier"] and rejected["client"] == "127.0.0.1"
            assert applied["actor"] == ADMIN_ID and (applied["client"], applied["peer"]) == ("203.0.113.7", "127.0.0.1")
            assert applied["details"]["digest"] == {"old": before, "new": app.gateway.store.current.digest}
            by_path = {c["path"]: c for c in applied["details"]["changes"]}
            assert by_path["tiers.standard.max_tokens_cap"] == {
                "path": "tiers.standard.max_tokens_cap", "keys": ["tiers", "standard", "max_tokens_cap"],
                "change": "changed", "old": 1024, "new": 2048}
            assert by_path["tenants.demo.keys"] == {
                "path": "tenants.demo.keys", "keys": ["tenants", "demo", "keys"], "change": "changed",
                "old": ["key-" + hash_key(DEMO_KEY)[:12]],
                "new": ["key-" + hash_key(DEMO_KEY)[:12], "key-" + hash_key("tg-another-demo-key")[:12]]}
            assert by_path["spend.webhook_url"]["old"] == "https://<redacted>@hooks.example.com/<redacted>"
            assert by_path["spend.webhook_url"]["new"] == "https://hooks.example.com/<redacted>"
            assert by_path["tenants.bulk"]["change"] == "removed" and by_path["tenants.bulk"]["old"]["tier"] == "batch"
            assert applied["details"]["changes_total"] == len(by_path) == 4
            assert parse_policy(orjson.dumps(changed).decode()) == app.gateway.store.current.policy
            text = orjson.dumps(log).decode()
            assert [s for s in ("NEW-S3CRET", *SECRETS.values(), hash_key("tg-another-demo-key")) if s in text] == []
    asyncio.run(main())


def test_the_audit_names_the_caller_behind_trusted_proxies_only() -> None:
    """From a trusted peer, X-Forwarded-For is read from its right end past each trusted hop; from any other
    peer it is the peer's word only and not believed (tests/inprocess/http/test_forwarded.py: the peer beside)."""
    async def purge(peer: tuple[str, int], forwarded: str) -> str:
        policy = policy_dict(["http://127.0.0.1:9"])
        policy["cache"] = {"enabled": True}
        policy["server"]["trusted_proxies"] = ["127.0.0.0/8"]
        async with admin_client(policy, peer=peer) as (client, _):
            reply = await client.delete("/admin/cache?tenant=demo", headers={**ADMIN, "x-forwarded-for": forwarded})
            assert reply.status_code == 200
            entry, = (await client.get("/admin/audit", headers=ADMIN)).json()["data"]
            assert (entry["action"], entry["target"], entry["details"]) == (
                "cache.purge", "tenant=demo", {"tenant": "demo", "purged": 0})
            return str(entry["client"])
    assert asyncio.run(purge(("127.0.0.1", 5), "203.0.113.7, 10.0.0.2")) == "10.0.0.2", "10.0.0.2 is not trusted"
    assert asyncio.run(purge(("127.0.0.1", 5), "203.0.113.7, 127.0.0.5")) == "203.0.113.7"
    assert asyncio.run(purge(("198.51.100.4", 5), "203.0.113.7")) == "198.51.100.4"
    assert asyncio.run(purge(("127.0.0.1", 5), "not-an-address")) == "127.0.0.1"


def test_runtime_keys_over_the_api_and_every_operation_in_the_audit(tmp_path: Path) -> None:
    async def main() -> None:
        async with admin_client(data_dir=tmp_path) as (client, _):
            made = await client.post("/admin/keys", headers=ADMIN, json={
                "tenant": "demo", "name": "ci runner", "models": ["other-model"],
                "rate_limit": {"requests_per_minute": 100}})
            assert made.status_code == 201, made.text
            key, kid = made.json()["key"], made.json()["id"]
            assert kid == "key-" + hash_key(key)[:12] and made.json()["created_by"] == ADMIN_ID
            models = await client.get("/v1/models", headers=bearer(key))
            assert [m["id"] for m in models.json()["data"]] == ["other-model"], "the key narrows its tenant"

            listed = await client.get("/admin/keys?tenant=demo", headers=ADMIN)
            assert [k["id"] for k in listed.json()["data"]] == [kid]
            assert key not in listed.text and hash_key(key) not in listed.text, "never the key, nor its hash"
            assert (await client.get("/admin/keys?tenant=prem", headers=ADMIN)).json()["data"] == []
            one = await client.get(f"/admin/keys/{kid}", headers=ADMIN)
            assert one.json()["status"] == "active" and one.json()["rate_limit"] == {"requests_per_minute": 100}

            for body, param in (({"tenant": "demo", "colour": "red"}, "colour"),
                                ({"tenant": "demo", "models": ["sim-llama-8b", "nope"]}, "models.1"),
                                ({"tenant": "demo", "expires_in_s": -5}, "expires_in_s"),
                                ({"name": "no tenant"}, "tenant")):
                wrong = await client.post("/admin/keys", headers=ADMIN, json=body)
                assert wrong.status_code == 400 and wrong.json()["error"]["param"] == param, (body, wrong.text)
            not_json = await client.post("/admin/keys", headers=ADMIN, content=b"[1, 2")
            assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"

            rotated = await client.post(f"/admin/keys/{kid}/rotate", headers=ADMIN, json={"grace_s": 600})
            assert rotated.status_code == 201, rotated.text
            new_key, new_id = rotated.json()["key"], rotated.json()["id"]
            assert rotated.json()["previous"]["status"] == "rotated" and rotated.json()["models"] == ["other-model"]
            for either in (key, new_key):
                assert (await client.get("/v1/models", headers=bearer(either))).status_code == 200
            too_long = await client.post(f"/admin/keys/{new_id}/rotate", headers=ADMIN, json={"grace_s": 10**9})
            assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "grace_s"

            ended = await client.patch(f"/admin/keys/{kid}", headers=ADMIN, json={"expires_in_s": 0})
            assert ended.status_code == 200 and ended.json()["status"] == "expired"
            gone = await client.get("/v1/models", headers=bearer(key))
            assert gone.status_code == 401 and "expired" in gone.json()["error"]["message"]
            later = await client.patch(f"/admin/keys/{new_id}", headers=ADMIN,
                                       json={"expires_at": "2999-01-01T00:00:00"})
            assert later.json()["expires_at"] == "2999-01-01T00:00:00Z"
            both = await client.patch(f"/admin/keys/{new_id}", headers=ADMIN, json={"expires_at": None,
                                                                                    "expires_in_s": 5})
            assert both.status_code == 400

            revoked = await client.post(f"/admin/keys/{new_id}/revoke", headers=ADMIN)
            assert revoked.status_code == 200 and revoked.json()["revoked_by"] == ADMIN_ID
            refused = await client.get("/v1/models", headers=bearer(new_key))
            assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
            again = await client.post(f"/admin/keys/{new_id}/revoke", headers=ADMIN)
            assert again.status_code == 409 and again.json()["error"]["code"] == "key_revoked"
            missing = await client.post("/admin/keys/key-000000000000/revoke", headers=ADMIN)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "key_not_found"

            log = (await client.get("/admin/audit", headers=ADMIN)).json()["data"]
            assert [(e["action"], e["target"]) for e in log] == [
                ("key.revoke", new_id), ("key.expire", new_id), ("key.expire", kid), ("key.rotate", kid),
                ("key.create", kid)], "refused operations change nothing and are not there"
            assert all(e["actor"] == ADMIN_ID and e["client"] == "127.0.0.1" for e in log)
            assert key not in orjson.dumps(log).decode() and new_key not in orjson.dumps(log).decode()
            two = (await client.get("/admin/audit?limit=2", headers=ADMIN)).json()["data"]
            assert [e["action"] for e in two] == ["key.revoke", "key.expire"]
            today = time.strftime("%Y-%m-%d", time.gmtime())
            assert len((await client.get(f"/admin/audit?from={today}&to={today}", headers=ADMIN)).json()["data"]) == 5
            assert (await client.get("/admin/audit?to=2001-01-01", headers=ADMIN)).json()["data"] == []
            for query, param in (("limit=0", "limit"), ("limit=lots", "limit"), ("from=yesterday", "from")):
                wrong = await client.get(f"/admin/audit?{query}", headers=ADMIN)
                assert wrong.status_code == 400 and wrong.json()["error"]["param"] == param, query
        assert (tmp_path / "admin.sqlite3").exists(), "kept in the data directory"
    asyncio.run(main())


def test_the_policy_read_as_yaml_and_put_back_unchanged_changes_nothing() -> None:
    """GET /admin/policy?format=yaml, PUT back as it came: accepted, the same digest, an empty diff and no secret
    lost. Edited in one place (a cap) and with one key left out, only those change; the secrets still hold."""
    async def main() -> None:
        async with admin_client(secret_policy()) as (client, app):
            live = app.gateway.store.current
            shown = (await client.get("/admin/policy?format=yaml", headers=ADMIN)).text
            back = await client.put("/admin/policy", content=shown, headers=ADMIN)
            assert back.status_code == 200, back.text
            assert back.json()["digest"] == live.digest and back.json()["diff"] == {
                "added": [], "removed": [], "changed": []}
            assert app.gateway.store.current.policy == live.policy

            edited = yaml.safe_load(shown)
            edited["tiers"]["standard"]["max_tokens_cap"] = 2048
            edited["tenants"]["demo"]["keys"] = []
            reply = await client.put("/admin/policy", content=yaml.safe_dump(edited), headers=ADMIN)
            assert reply.status_code == 200, reply.text
            assert sorted(reply.json()["diff"]["changed"]) == ["tenants.demo.keys", "tiers.standard.max_tokens_cap"]
            now = app.gateway.store.current.policy
            assert now.server.admin_token_sha256 == live.policy.server.admin_token_sha256
            assert now.spend.webhook_url == live.policy.spend.webhook_url and now.pools == live.policy.pools
            assert now.tenants["bulk"].keys == live.policy.tenants["bulk"].keys and now.tenants["demo"].keys == []
    asyncio.run(main())


def test_every_redacted_value_comes_back_and_a_value_written_anew_is_taken_as_written() -> None:
    policy = secret_policy()
    policy["state"] = {"postgres_dsn": f"postgresql://tollgate:{SECRETS['dsn_password']}@db:5432/tollgate",
                       "redis_url": f"redis://:{SECRETS['redis_password']}@cache:6379/0"}
    policy["tenants"]["demo"]["keys"].append("sha256:" + hash_key("tg-second-demo-key"))
    live = Policy.model_validate(policy)
    shown = admin.redacted(live)
    text = yaml.safe_dump(shown)
    assert parse_policy(admin.with_live_values(text, live)) == live
    keys = shown["tenants"]["demo"]["keys"]
    shown["tenants"]["demo"]["keys"] = [keys[1], keys[0]]  # reordered: still the tenant's keys
    shown["tracing"]["endpoint"] = "http://collector-2:4318"  # written anew
    restored = parse_policy(admin.with_live_values(yaml.safe_dump(shown), live))
    assert restored.tenants["demo"].keys == [live.tenants["demo"].keys[1], live.tenants["demo"].keys[0]]
    assert restored.tracing.endpoint == "http://collector-2:4318"
    assert restored.state == live.state and restored.server == live.server
    plain = "# a comment the file keeps\n" + yaml.safe_dump(policy_dict(["http://127.0.0.1:9"]))
    assert admin.with_live_values(plain, live) == plain, "nothing to put back: the text as it came"
    assert admin.with_live_values("tiers: [", live) == "tiers: [", "what does not parse is the loader's to refuse"


def test_a_value_still_redacted_after_the_put_back_is_refused_by_its_path() -> None:
    """An edit next to a redaction (a worker URL's port changed, its password still <redacted>) cannot be put back
    from the live value: it is a 400 naming the path, never the literal text; a key id under a tenant that has no
    such key likewise. The running policy stays; an error's line is the line in the document sent."""
    async def main() -> None:
        async with admin_client(secret_policy()) as (client, app):
            live = app.gateway.store.current
            shown = yaml.safe_load((await client.get("/admin/policy?format=yaml", headers=ADMIN)).text)
            edited = yaml.safe_load(yaml.safe_dump(shown))
            edited["pools"]["main"]["workers"] = ["http://gw:<redacted>@127.0.0.1:10/"]
            edited["tenants"]["prem"]["keys"] = shown["tenants"]["demo"]["keys"]
            reply = await client.put("/admin/policy", content=yaml.safe_dump(edited), headers=ADMIN)
            assert reply.status_code == 400, reply.text
            paths = {d["path"] for d in reply.json()["error"]["details"]}
            assert paths == {"pools.main.workers.0", "tenants.prem.keys.0"}, paths
            assert app.gateway.store.current.digest == live.digest
            escaped = orjson.dumps(edited).decode().replace("<", "\\u003c").replace(">", "\\u003e")
            reply = await client.put("/admin/policy", content=escaped, headers=ADMIN)
            assert reply.status_code == 400 and "pools.main.workers.0" in reply.text, "escaped as JSON may escape it"

            typo = "# two lines of the admin's own\n# above the document\n" + yaml.safe_dump(shown, sort_keys=False)
            typo = typo.replace("max_tokens_cap: 1024", "max_token_cap: 1024", 1)
            line = 1 + typo.splitlines().index(next(li for li in typo.splitlines() if "max_token_cap:" in li))
            reply = await client.put("/admin/policy", content=typo, headers=ADMIN)
            (detail,) = [d for d in reply.json()["error"]["details"] if d["path"].endswith("max_token_cap")]
            assert f"(line {line})" in detail["message"], (line, detail)
    asyncio.run(main())


def test_a_mistake_in_the_policy_is_named_with_its_line_and_the_name_meant() -> None:
    async def main() -> None:
        async with admin_client() as (client, _):
            text = yaml.safe_dump(policy_dict(["http://127.0.0.1:9"]), sort_keys=False)
            bad = text.replace("max_tokens_cap:", "max_token_cap:", 1)
            line = 1 + bad.splitlines().index(next(li for li in bad.splitlines() if "max_token_cap:" in li))
            reply = await client.put("/admin/policy", content=bad, headers=ADMIN)
            assert reply.status_code == 400
            (detail,) = [d for d in reply.json()["error"]["details"] if d["path"].endswith("max_token_cap")]
            assert "did you mean 'max_tokens_cap'?" in detail["message"], detail
            assert f"(line {line})" in detail["message"], (line, detail)
    asyncio.run(main())


def test_an_edit_of_the_policy_file_is_in_the_audit_log(tmp_path: Path) -> None:
    """The file edited under a running gateway: its reload is an audit entry by "file", path by path, as a PUT's;
    a broken edit is a policy.reject entry naming the path at fault."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_dict(["http://127.0.0.1:9"])))
    store = PolicyStore.from_file(path)
    app = create_app(store, tmp_path)

    async def main() -> list[dict[str, Any]]:
        async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:  # type: ignore[arg-type]
            edited = policy_dict(["http://127.0.0.1:9"])
            edited["tiers"]["standard"]["max_tokens_cap"] = 2048
            path.write_text(yaml.safe_dump(edited))
            await store.reload_file()
            edited["tenants"]["demo"]["tier"] = "platinum"
            path.write_text(yaml.safe_dump(edited))
            with pytest.raises(PolicyError):
                await store.reload_file()
            # a PUT, then the file it wrote read back (as another process of the host reads it): one entry, the PUT's
            put = policy_dict(["http://127.0.0.1:9"])
            put["tiers"]["standard"]["max_tokens_cap"] = 512
            before_put = store.current
            assert (await client.put("/admin/policy", content=yaml.safe_dump(put), headers=ADMIN)).status_code == 200
            store.current = before_put  # this process had not applied it: its watcher reads the file
            await store.reload_file()
            return list((await client.get("/admin/audit", headers=ADMIN)).json()["data"])
    log = asyncio.run(main())
    assert [e["action"] for e in log if e["actor"] == "file"].count("policy.apply") == 1, "the PUT's file: not again"
    by_action = {e["action"]: e for e in log if e["actor"] == "file"}
    applied, refused = by_action["policy.apply"], by_action["policy.reject"]
    assert applied["details"]["source"] == str(path)
    assert [c["path"] for c in applied["details"]["changes"]] == ["tiers.standard.max_tokens_cap"]
    assert refused["details"]["errors"] == ["tenants.demo.tier"]
