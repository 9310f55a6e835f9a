"""The admin API in-process (the app over an in-memory ASGI transport, its gateway started): every route needs
the admin token, a rejected policy leaves the running one, and the read-outs filter and name what they say."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest

from gateway.http import admin
from gateway.http.app import HotPaths, create_app
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, FINANCE_TOKEN, policy_dict

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@asynccontextmanager
async def admin_client(policy: dict[str, Any] | None = None) -> AsyncIterator[tuple[httpx.AsyncClient, HotPaths]]:
    """The app on the test policy (a worker nobody listens on), its gateway running, and a client for it."""
    policy = policy or policy_dict(["http://127.0.0.1:9"])
    app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")))
    async with app.gateway.lifespan(), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                                         base_url="http://gateway") as client:
        yield client, app


@pytest.mark.parametrize("token", [None, DEMO_KEY, FINANCE_TOKEN])
def test_every_admin_route_needs_the_admin_token(token: str | None) -> None:
    async def main() -> list[tuple[str, int, str]]:
        async with admin_client() as (client, _):
            headers = {"authorization": f"Bearer {token}"} if token else {}
            seen = []
            for route in admin.ROUTES:
                for method in sorted(route.methods or ()):
                    if method == "HEAD":
                        continue
                    reply = await client.request(method, route.path, headers=headers)
                    seen.append((f"{method} {route.path}", reply.status_code, reply.json()["error"]["code"]))
            return seen
    seen = asyncio.run(main())
    assert len(seen) == len(admin.ROUTES)
    assert all(status == 401 and code == "invalid_admin_token" for _, status, code in seen), seen


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
