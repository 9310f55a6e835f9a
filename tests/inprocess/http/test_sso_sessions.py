"""Sign-in sessions as single sign-on makes them, in-process: who a cookie names comes back exactly, whatever the
tenant's or the person's name holds; a cookie altered anywhere names nobody; a session made under one role
mapping, or for a tenant since removed, no longer holds. And the role a person's groups give."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.sessions import Principal, Sessions
from gateway.http.sso import role_of
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy, Sso
from tests.conftest import policy_dict

pytestmark = pytest.mark.inprocess
TENANT_NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,40}", fullmatch=True)
PEOPLE = st.text(min_size=1, max_size=128)


def snapshot_with(tenants: list[str], roles: dict[str, Any] | None = None) -> PolicySnapshot:
    policy = policy_dict(["http://127.0.0.1:9"])
    for name in tenants:
        policy["tenants"].setdefault(name, {"tier": "standard", "keys": []})
    policy["server"]["sso"] = {"issuer": "https://id.example.com", "client_id": "tollgate",
                               "roles": roles or {"admin": ["ops"]}}
    return PolicySnapshot.build(Policy.model_validate(policy), "test")


@settings(max_examples=150, deadline=None)
@given(tenant=TENANT_NAMES, who=PEOPLE, role=st.sampled_from(["admin", "finance", "tenant"]),
       where=st.integers(min_value=0), to=st.characters())
def test_a_cookie_names_its_holder_exactly_and_an_altered_one_nobody(tenant: str, who: str, role: str,
                                                                     where: int, to: str) -> None:
    snap = snapshot_with([tenant])
    sessions = Sessions(None, None)
    principal = Principal(role, tenant if role == "tenant" else None, who)  # type: ignore[arg-type]
    cookie = sessions.issue(snap, principal, now=1_000.0)
    assert asyncio.run(sessions.principal(snap, cookie, now=1_001.0)) == principal
    at = where % len(cookie)
    altered = cookie[:at] + to + cookie[at + 1:]
    if altered != cookie:
        assert asyncio.run(sessions.principal(snap, altered, now=1_001.0)) is None, (cookie, altered)


def test_a_session_ends_with_its_role_mapping_or_its_tenant() -> None:
    snap = snapshot_with(["acme.eu"], {"admin": ["ops"], "tenants": {"team": "acme.eu"}})
    sessions = Sessions(None, None)
    admin = sessions.issue(snap, Principal("admin", None, "alice"), now=1_000.0)
    tenant = sessions.issue(snap, Principal("tenant", "acme.eu", "carol"), now=1_000.0)
    token = sessions.issue(snap, Principal("finance"), now=1_000.0)
    remapped = snapshot_with(["acme.eu"], {"admin": ["ops", "sre"], "tenants": {"team": "acme.eu"}})
    assert asyncio.run(sessions.principal(remapped, admin, now=1_001.0)) is None, "the mapping changed"
    assert asyncio.run(sessions.principal(remapped, token, now=1_001.0)) == Principal("finance"), \
        "a token's session is bound to its token, not to single sign-on"
    data = snap.policy.model_dump(mode="json")
    data["tenants"].pop("acme.eu")
    data["server"]["sso"]["roles"]["tenants"] = {}
    gone = PolicySnapshot.build(Policy.model_validate(data), "test")
    assert asyncio.run(sessions.principal(gone, tenant, now=1_001.0)) is None, "its tenant is gone"
    without = copy.deepcopy(data)
    without["server"]["sso"] = None
    off = PolicySnapshot.build(Policy.model_validate(without), "test")
    assert asyncio.run(sessions.principal(off, admin, now=1_001.0)) is None, "single sign-on is off"


@given(groups=st.lists(st.sampled_from(["ops", "fin", "t1", "t2", "x", "y"]), max_size=6))
def test_the_role_is_the_first_that_applies_and_never_two_tenants(groups: list[str]) -> None:
    sso = Sso.model_validate({"issuer": "https://id.example.com", "client_id": "c", "roles": {
        "admin": ["ops"], "finance": ["fin"], "tenants": {"t1": "one", "t2": "two"}}})
    principal, why = role_of({"groups": groups}, sso, "p")
    tenants = {g for g in groups if g in ("t1", "t2")}
    if "ops" in groups:
        assert principal == Principal("admin", None, "p")
    elif "fin" in groups:
        assert principal == Principal("finance", None, "p")
    elif len(tenants) == 1:
        assert principal == Principal("tenant", {"t1": "one", "t2": "two"}[tenants.pop()], "p")
    else:
        assert principal is None and why
    as_text = role_of({"groups": "ops"}, sso, "p")[0]
    assert as_text is not None and as_text.role == "admin", "a claim of one group as a string"
    assert role_of({"groups": [{"ops": 1}]}, sso, "p")[0] is None, "what is not a name names no group"


@pytest.mark.parametrize(("issuer", "ok"), [
    ("https://id.example.com", True), ("http://localhost:9400", True), ("http://127.0.0.1:9400/", True),
    ("http://id.example.com", False), ("https://u:p@id.example.com", False), ("https://id.example.com/?a=1", False),
    ("ftp://id.example.com", False)])
def test_an_issuer_is_https_or_this_host(issuer: str, ok: bool) -> None:
    try:
        Sso.model_validate({"issuer": issuer, "client_id": "c"})
    except ValueError:
        assert not ok
    else:
        assert ok
