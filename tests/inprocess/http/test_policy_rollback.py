"""A rollback undoes exactly one applied change, in-process over the admin API: for any change of tenants
(names with dots among them, added, removed, their fields changed) and tier limits, applying it and then rolling
its audit entry back gives the policy of before; a later edit of the same path is not overwritten; a change that
held a secret is refused, never half done; and a policy replaced while a rollback was prepared is not reverted."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.auth import hash_key
from gateway.http.admin import redacted
from gateway.http.app import create_app
from gateway.policy.loader import PolicyChanged, PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, policy_dict

pytestmark = pytest.mark.inprocess
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
NAMES = st.sampled_from(["acme", "acme.eu", "acme.eu.west", "b", "b.c"])


def base() -> dict[str, Any]:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["tenants"]["acme"] = {"tier": "standard", "keys": []}
    policy["tenants"]["acme.eu"] = {"tier": "premium", "keys": [], "max_tokens_cap": 300}
    return policy


@st.composite
def edits(draw: st.DrawFn) -> dict[str, Any]:
    policy = base()
    tenants = policy["tenants"]
    for _ in range(draw(st.integers(1, 4))):
        name = draw(NAMES)
        what = draw(st.sampled_from(["add", "remove", "cap", "weight", "tier"]))
        if what == "add":
            tenants[name] = {"tier": draw(st.sampled_from(["standard", "premium"])), "keys": []}
        elif what == "remove" and name in tenants and name != "demo":
            tenants.pop(name)
        elif name in tenants:
            field, value = {"cap": ("max_tokens_cap", draw(st.one_of(st.none(), st.integers(1, 4096)))),
                            "weight": ("weight", draw(st.sampled_from([0.5, 1.0, 2.0]))),
                            "tier": ("tier", draw(st.sampled_from(["standard", "premium", "batch"])))}[what]
            tenants[name][field] = value
    policy["tiers"]["standard"]["max_tokens_default"] = draw(st.integers(1, 1024))
    return policy


def shown(store: PolicyStore) -> bytes:
    return orjson.dumps(redacted(store.current.policy), option=orjson.OPT_SORT_KEYS)


async def apply_and_undo(edited: dict[str, Any]) -> tuple[bytes, bytes, bytes, httpx.Response]:
    store = PolicyStore(PolicySnapshot.build(Policy.model_validate(base()), "test"))
    transport = httpx.ASGITransport(app=create_app(store))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        before = shown(store)
        put = await client.put("/admin/policy", headers=ADMIN, content=orjson.dumps(edited))
        assert put.status_code == 200, put.text
        after = shown(store)
        entry = (await client.get("/admin/audit", params={"action": "policy"}, headers=ADMIN)).json()["data"][0]
        undone = await client.post("/admin/policy/rollback", headers=ADMIN, json={"entry": entry["id"]})
        return before, after, shown(store), undone


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited=edits())
@example(edited={**base(), "tenants": {**base()["tenants"], "acme.eu": {"tier": "batch", "keys": []}}})
@example(edited={**base(), "tenants": {k: v for k, v in base()["tenants"].items() if k != "acme.eu"}})
def test_applying_a_change_and_rolling_it_back_gives_the_policy_of_before(edited: dict[str, Any]) -> None:
    before, after, undone, answer = asyncio.run(apply_and_undo(edited))
    if after == before:
        assert answer.status_code in (200, 409), answer.text  # nothing changed: nothing (or nothing new) to undo
        return
    assert answer.status_code == 200, answer.text
    assert undone == before, "the rollback gave back the policy the change was made to"


def test_a_path_changed_again_or_a_secret_is_not_undone_and_nothing_is_half_done() -> None:
    async def main() -> None:
        store = PolicyStore(PolicySnapshot.build(Policy.model_validate(base()), "test"))
        transport = httpx.ASGITransport(app=create_app(store))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            async def put(policy: dict[str, Any]) -> str:
                answer = await client.put("/admin/policy", headers=ADMIN, content=orjson.dumps(policy))
                assert answer.status_code == 200, answer.text
                return str((await client.get("/admin/audit", params={"action": "policy"}, headers=ADMIN)
                            ).json()["data"][0]["id"])

            first = copy.deepcopy(base())
            first["tenants"]["acme.eu"]["max_tokens_cap"] = 100
            entry = await put(first)
            second = copy.deepcopy(first)
            second["tenants"]["acme.eu"]["max_tokens_cap"] = 200
            await put(second)
            refused = await client.post("/admin/policy/rollback", headers=ADMIN, json={"entry": entry})
            assert refused.status_code == 409 and "tenants.acme.eu.max_tokens_cap: changed again since" in \
                refused.json()["error"]["message"]
            assert store.current.policy.tenants["acme.eu"].max_tokens_cap == 200

            secret = copy.deepcopy(second)
            secret["server"]["finance_token_sha256"] = "sha256:" + hash_key("tg-someone-elses")
            secret["tenants"]["acme"]["tier"] = "premium"
            entry = await put(secret)
            before = shown(store)
            refused = await client.post("/admin/policy/rollback", headers=ADMIN, json={"entry": entry})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "rollback_secret"
            assert "server.finance_token_sha256" in refused.json()["error"]["message"]
            assert shown(store) == before, "not the tier alone: nothing"
            for body in ({"entry": 5}, [], None, {"entry": "nope"}):
                answer = await client.post("/admin/policy/rollback", headers=ADMIN, json=body)
                assert answer.status_code in (400, 404), (body, answer.text)
    asyncio.run(main())


def test_a_policy_replaced_meanwhile_is_not_reverted() -> None:
    async def main() -> None:
        start = PolicySnapshot.build(Policy.model_validate(base()), "test")
        store = PolicyStore(start)
        other = copy.deepcopy(base())
        other["tenants"]["b"] = {"tier": "standard", "keys": []}
        await store.apply(PolicySnapshot.build(Policy.model_validate(other), "test"))
        with pytest.raises(PolicyChanged):
            await store.apply(start, expected=start.digest)
        assert "b" in store.current.policy.tenants
    asyncio.run(main())
