"""Who called, as the admin audit keeps it: no proxy is trusted by default, so X-Forwarded-For (and
X-Forwarded-Proto) from any peer, loopback too (a port-forward, a sidecar), is that peer's word and changes
nothing; behind a proxy listed in ``server.trusted_proxies`` the address it names is kept beside the peer's."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.app import create_app
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, FINANCE_TOKEN, policy_dict

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=80)
ADDRESSES = st.ip_addresses().map(str)


def audited_from(peer: tuple[str, int], forwarded: list[str | None], trusted: list[str] | None = None,
                 ) -> list[dict[str, Any]]:
    """An audited action (a key made) per X-Forwarded-For value (None: no header), from ``peer``; the entries,
    oldest first."""
    policy = policy_dict(["http://127.0.0.1:9"])
    if trusted is not None:
        policy["server"]["trusted_proxies"] = trusted
    app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")))

    async def main() -> list[dict[str, Any]]:
        transport = httpx.ASGITransport(app=app, client=peer)  # type: ignore[arg-type]
        async with app.gateway.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for value in forwarded:
                headers = {**ADMIN, **({"x-forwarded-for": value} if value is not None else {})}
                made = await client.post("/admin/keys", headers=headers, json={"tenant": "demo"})
                assert made.status_code == 201, made.text
            log = await client.get("/admin/audit", headers=ADMIN, params={"limit": "1000"})
            return list(reversed(log.json()["data"]))
    return asyncio.run(main())


@settings(max_examples=15, deadline=None)
@given(peer=st.sampled_from(["127.0.0.1", "::1", "10.0.0.3", "192.0.2.44"]),
       forwarded=st.lists(st.one_of(HEADER_TEXT, ADDRESSES, st.lists(ADDRESSES, min_size=1, max_size=4).map(
           ", ".join)), min_size=1, max_size=6))
def test_by_default_no_peer_is_believed_whatever_it_forwards(peer: str, forwarded: list[str]) -> None:
    entries = audited_from((peer, 4000), forwarded)
    assert [(e["action"], e["client"], e["peer"]) for e in entries] == [("key.create", peer, peer)] * len(forwarded)


def test_behind_trusted_proxies_the_caller_is_kept_beside_the_peer() -> None:
    cases: list[tuple[str | None, str]] = [
        (None, "10.9.0.1"),  # no header: the peer alone
        ("203.0.113.7", "203.0.113.7"),
        ("203.0.113.7, 10.9.0.2", "203.0.113.7"),  # 10.9.0.2 is a trusted hop: past it
        ("203.0.113.7, 198.51.100.1", "198.51.100.1"),  # the nearest untrusted hop, not the client's own claim
        ("not-an-address", "10.9.0.1"),  # a value that is no address stops the walk at the proxy
        ("10.9.0.5", "10.9.0.5"),  # a trusted hop alone: the last one named
    ]
    entries = audited_from(("10.9.0.1", 4000), [value for value, _ in cases], trusted=["10.9.0.0/24"])
    assert [(e["client"], e["peer"]) for e in entries] == [(client, "10.9.0.1") for _, client in cases]
    untrusted = audited_from(("10.8.0.1", 4000), ["203.0.113.7"], trusted=["10.9.0.0/24"])
    assert [(e["client"], e["peer"]) for e in untrusted] == [("10.8.0.1", "10.8.0.1")], "another peer: its word"


def test_the_sign_in_cookie_is_secure_only_behind_a_trusted_proxy_that_says_tls() -> None:
    def cookie(trusted: list[str] | None) -> str:
        policy = policy_dict(["http://127.0.0.1:9"])
        if trusted is not None:
            policy["server"]["trusted_proxies"] = trusted
        app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")))

        async def main() -> str:
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 4000))  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                signed = await client.post("/reports/login", data={"token": FINANCE_TOKEN},
                                           headers={"x-forwarded-proto": "https"})
                assert signed.status_code == 303
                return signed.headers["set-cookie"]
        return asyncio.run(main())
    assert "Secure" not in cookie(None), "loopback is not trusted by default"
    assert "Secure" in cookie(["127.0.0.1/32"])
    assert "Secure" not in cookie(["10.0.0.0/8"])


def test_over_tls_only_the_host_prefixed_session_cookie_signs_in() -> None:
    """Over TLS the session cookie is ``__Host-`` (Secure, Path=/, no Domain), and a cookie of the plain name is
    not read there: a sibling subdomain can set that one in an admin's browser, with its own valid session in it.
    Over plain HTTP (a local demo, where Secure cannot be set) the plain name is the only one."""
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["server"]["trusted_proxies"] = ["127.0.0.1/32"]
    app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")))
    tls = {"x-forwarded-proto": "https"}

    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 4000))  # type: ignore[arg-type]
        async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(transport=transport,
                                                                      base_url="http://gw") as client:
            secure = await client.post("/reports/login", data={"token": FINANCE_TOKEN}, headers=tls)
            header = secure.headers["set-cookie"]
            assert header.startswith("__Host-tollgate_session=") and "Secure" in header and "Path=/" in header
            assert "domain" not in header.lower()
            value = secure.cookies["__Host-tollgate_session"]
            plain = await client.post("/reports/login", data={"token": FINANCE_TOKEN})
            assert plain.headers["set-cookie"].startswith("tollgate_session=") and "Secure" not in plain.headers[
                "set-cookie"]
            client.cookies.clear()

            async def costs(cookie: str, headers: dict[str, str]) -> int:
                """401 signed out; signed in, this gateway without a ledger answers its 409."""
                reply = await client.get("/admin/reports/costs", headers={"cookie": cookie, **headers})
                return reply.status_code
            assert await costs(f"__Host-tollgate_session={value}", tls) == 409
            assert await costs(f"tollgate_session={value}", tls) == 401, "the plain name, planted: not read over TLS"
            assert await costs(f"tollgate_session={plain.cookies['tollgate_session']}", {}) == 409
            out = await client.post("/reports/logout", headers={"cookie": f"__Host-tollgate_session={value}",
                                                                  "origin": "http://gw", **tls})
            assert out.status_code == 303 and out.headers["set-cookie"].startswith("__Host-tollgate_session=")
            assert await costs(f"__Host-tollgate_session={value}", tls) == 401, "signed out"
    asyncio.run(main())
