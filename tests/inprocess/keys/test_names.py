"""A runtime key's name is a label for people, shown by `tollgate keys list`, the admin API and the audit: one
holding a C0 or C1 control, DEL, a bidirectional mark, embedding, override or isolate, or a line or paragraph
separator is refused with a 400 naming the character and where it is (over the admin API as through
spec_problems); any other text, brackets and emoji included, is taken as given."""

from __future__ import annotations

import asyncio
import time
import unicodedata

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.app import create_app
from gateway.keys.model import KeySpec, spec_problems, unsafe_character
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, policy_dict

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
REFUSED = [*map(chr, range(0x00, 0x20)), "\x7f", *map(chr, range(0x80, 0xa0)), "\u061c", "\u200e", "\u200f",
           "\u2028", "\u2029", *map(chr, range(0x202a, 0x202f)), *map(chr, range(0x2066, 0x206a))]
# everything else: letters and marks of any script, spaces, punctuation (markup's brackets), symbols, emoji and
# their joiners
TAKEN = st.characters(exclude_characters="".join(REFUSED), exclude_categories=("Cs",))
SNAPSHOT = PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])), "test")


@settings(max_examples=400, deadline=None)
@given(before=st.text(TAKEN, max_size=40), bad=st.sampled_from(REFUSED), after=st.text(max_size=40))
def test_a_name_holding_any_refused_character_is_refused_naming_it(before: str, bad: str, after: str) -> None:
    name = (before + bad + after)[:128]
    problems = spec_problems(SNAPSHOT, KeySpec(tenant="demo", name=name), time.time())
    assert [p for p, _ in problems] == ["name"]
    message = problems[0][1]
    assert f"U+{ord(bad):04X}" in message and f"at character {len(before) + 1}" in message
    assert unicodedata.name(bad, "a control character") in message


@settings(max_examples=400, deadline=None)
@given(name=st.text(TAKEN, max_size=128))
def test_any_other_name_is_taken(name: str) -> None:
    assert unsafe_character(name) is None
    assert spec_problems(SNAPSHOT, KeySpec(tenant="demo", name=name), time.time()) == []


def test_a_name_is_checked_before_the_tenant_and_beside_it() -> None:
    problems = spec_problems(SNAPSHOT, KeySpec(tenant="nobody", name="ops\u202egpj.exe"), time.time())
    assert [p for p, _ in problems] == ["name", "tenant"]


def test_over_the_admin_api_a_refused_name_is_a_400_naming_the_parameter_and_no_key_is_made() -> None:
    app = create_app(PolicyStore(SNAPSHOT))

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with app.gateway.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for bad in REFUSED:
                reply = await client.post("/admin/keys", headers=ADMIN, json={"tenant": "demo", "name": f"ci{bad}"})
                assert reply.status_code == 400, (hex(ord(bad)), reply.text)
                error = reply.json()["error"]
                assert (error["param"], error["code"], error["type"]) == (
                    "name", "invalid_key_spec", "invalid_request_error")
                assert f"U+{ord(bad):04X}" in error["message"] and "at character 3" in error["message"]
            for fine in ("[/]", "[link=https://evil.example]click[/link]", "ci runner 🚀", "프로덕션", "a\u200db"):
                made = await client.post("/admin/keys", headers=ADMIN, json={"tenant": "demo", "name": fine})
                assert made.status_code == 201 and made.json()["name"] == fine
            listed = (await client.get("/admin/keys", headers=ADMIN)).json()["data"]
            assert len(listed) == 5, "no refused name was stored"
    asyncio.run(main())


def test_a_cache_purge_selector_the_audit_would_keep_is_refused_the_same_way() -> None:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["cache"] = {"enabled": True}
    app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")))

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with app.gateway.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for param in ("tenant", "model", "id"):
                reply = await client.delete("/admin/cache", headers=ADMIN, params={param: "x\u202egpj.exe"})
                assert reply.status_code == 400, reply.text
                assert reply.json()["error"]["param"] == param and "U+202E" in reply.json()["error"]["message"]
            fine = await client.delete("/admin/cache", headers=ADMIN, params={"tenant": "[/]"})
            assert fine.status_code == 200
            log = (await client.get("/admin/audit", headers=ADMIN)).json()["data"]
            assert [(e["action"], e["target"]) for e in log] == [("cache.purge", "tenant=[/]")]
    asyncio.run(main())
