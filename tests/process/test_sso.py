"""Single sign-on end to end: a gateway process signs people in through a local OpenID provider
(oidc-provider-mock, started here on loopback) by the authorization code with PKCE, and each person gets what the
role their groups map to allows and a 403 for the rest: an admin, a finance reader, a tenant's user; a person in
no mapped group is refused a session. Tokens keep working beside it."""

from __future__ import annotations

import html
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import oidc_provider_mock
import pytest

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, FINANCE_TOKEN, Proc, policy_dict, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CONSOLE = {"X-Tollgate-Console": "1"}
# the provider mock's own use of Authlib's older interfaces, not the gateway's
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                        "ignore::authlib.deprecate.AuthlibDeprecationWarning")
PEOPLE = {"alice@example.com": ["ops", "staff"], "bob@example.com": ["finance"],
          "carol@example.com": ["team-demo"], "dave@example.com": ["visitors"],
          "erin@example.com": ["team-demo", "team-prem"]}


@pytest.fixture
def provider() -> Iterator[str]:
    with oidc_provider_mock.run_server_in_thread() as server:
        issuer = f"http://localhost:{server.server_port}"
        for sub, groups in PEOPLE.items():
            answer = httpx.put(f"{issuer}/users/{urllib.parse.quote(sub)}", json={"email": sub, "groups": groups})
            assert answer.status_code == 204
        yield issuer


def sso_policy(issuer: str, workers: list[str]) -> dict[str, Any]:
    policy = policy_dict(workers)
    policy["server"]["sso"] = {"issuer": issuer, "client_id": "tollgate-console", "client_secret": "not-in-clear",
                               "roles": {"admin": ["ops"], "finance": ["finance"],
                                         "tenants": {"team-demo": "demo", "team-prem": "prem"}}}
    return policy


def sign_in(gateway: Proc, sub: str, next_page: str = "/console", deny: bool = False) -> tuple[httpx.Client,
                                                                                                 httpx.Response]:
    """A browser's cookie jar, taken through the provider's form as ``sub``; the callback's answer."""
    browser = httpx.Client(base_url=gateway.url, timeout=30)
    begun = browser.get("/auth/sso/login", params={"next": next_page})
    assert begun.status_code == 302, begun.text
    at_provider = begun.headers["location"]
    asked = urllib.parse.parse_qs(urllib.parse.urlsplit(at_provider).query)
    assert asked["code_challenge_method"] == ["S256"] and len(asked["code_challenge"][0]) == 43, "PKCE, S256"
    assert asked["nonce"] and asked["state"] and asked["redirect_uri"] == [f"{gateway.url}/auth/sso/callback"]
    assert "openid" in asked["scope"][0].split()
    authorized = httpx.post(at_provider, data={"action": "deny"} if deny else {"sub": sub})
    assert authorized.status_code == 302, authorized.text
    back = authorized.headers["location"]
    assert back.startswith(f"{gateway.url}/auth/sso/callback?")
    return browser, browser.get(back.removeprefix(gateway.url))


def test_each_role_sees_what_it_may_and_is_refused_the_rest(provider: str, start_gateway: Callable[..., Proc],
                                                             start_sim: Callable[..., Proc]) -> None:
    sim = start_sim()
    gateway = start_gateway(sso_policy(provider, [sim.url]))
    used = httpx.post(gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {DEMO_KEY}"},
                      json={"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert used.status_code == 200

    # an admin: the console, every admin route, the cost reports; its changes are audited under its name
    admin, done = sign_in(gateway, "alice@example.com")
    assert done.status_code == 200 and 'http-equiv="refresh" content="0;url=/console"' in done.text
    assert "tollgate_session" in admin.cookies
    console = admin.get("/console")
    assert 'data-role="admin"' in console.text and "alice@example.com" in console.text
    for path in ("/admin/policy", "/admin/keys", "/admin/queues", "/admin/audit", "/reports",
                 "/admin/reports/costs", "/admin/statements"):
        assert admin.get(path).status_code == 200, path
    shown = admin.get("/admin/policy").json()["server"]["sso"]
    assert shown["client_secret"] == "<redacted>", "the client's secret is never shown"
    made = admin.post("/admin/keys", json={"tenant": "demo", "name": "made by alice"}, headers=CONSOLE)
    assert made.status_code == 201, made.text
    refused = admin.post("/admin/keys", json={"tenant": "demo", "name": "no header"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_origin"
    elsewhere = admin.post("/admin/keys", json={"tenant": "demo", "name": "x"},
                           headers={**CONSOLE, "Origin": "https://evil.example"})
    assert elsewhere.status_code == 403, "another site's page cannot use the session"
    entry = httpx.get(gateway.url + "/admin/audit", params={"action": "key"}, headers=ADMIN).json()["data"][0]
    assert entry["actor"] == "sso:alice@example.com" and entry["action"] == "key.create"

    # finance: the money, and nothing of the admin's
    finance, done = sign_in(gateway, "bob@example.com", "/reports")
    assert done.status_code == 200 and "url=/reports" in done.text
    for path in ("/reports", "/admin/reports/costs", "/admin/statements", "/admin/reports/gpu"):
        assert finance.get(path).status_code == 200, path
    for method, path in (("GET", "/admin/policy"), ("GET", "/admin/keys"), ("GET", "/admin/audit"),
                         ("GET", "/admin/queues"), ("POST", "/admin/keys"), ("POST", "/admin/statements/close")):
        answer = finance.request(method, path, headers=CONSOLE, json={})
        assert answer.status_code == 403, (method, path, answer.text)
    assert 'data-role="finance"' in finance.get("/console").text

    # a tenant's user: its own usage, and nothing else
    carol, done = sign_in(gateway, "carol@example.com")
    assert done.status_code == 200
    usage = carol.get("/v1/usage")
    assert usage.status_code == 200 and usage.json()["tenant"] == "demo"
    assert wait_for(lambda: carol.get("/v1/usage").json()["total"]["requests"] >= 1, timeout=20)
    for path in ("/reports", "/admin/reports/costs", "/admin/statements", "/admin/policy", "/admin/keys",
                 "/admin/ledger"):
        assert carol.get(path).status_code == 403, path
    frame = carol.get("/console").text
    assert 'data-role="tenant"' in frame and 'data-tenant="demo"' in frame

    # refused a session: in no mapped group, in two tenants' groups, or turned down at the provider
    for sub, says in (("dave@example.com", "None of your groups"), ("erin@example.com", "name 2 tenants")):
        nobody, done = sign_in(gateway, sub)
        assert done.status_code == 403 and says in html.unescape(done.text), done.text
        assert "tollgate_session" not in nobody.cookies
        assert nobody.get("/admin/policy").status_code == 401
    _, denied = sign_in(gateway, "alice@example.com", deny=True)
    assert denied.status_code == 401 and "refused the sign-in (access_denied)" in denied.text

    # tokens keep working for automation; and a change to the role mapping signs every SSO session out
    policy = sso_policy(provider, [sim.url])
    policy["server"]["sso"]["roles"]["finance"] = ["finance", "auditors"]
    put = httpx.put(gateway.url + "/admin/policy", headers=ADMIN, json=policy)
    assert put.status_code == 200, put.text
    assert admin.get("/admin/policy").status_code == 401
    assert 'name="token"' in finance.get("/reports").text, "signed out: the page asks to sign in again"
    assert httpx.get(gateway.url + "/admin/reports/costs", headers={"Authorization": f"Bearer {FINANCE_TOKEN}"}
                     ).status_code == 200


def test_a_callback_this_browser_did_not_begin_is_refused(provider: str, start_gateway: Callable[..., Proc],
                                                          start_sim: Callable[..., Proc]) -> None:
    gateway = start_gateway(sso_policy(provider, [start_sim().url]))
    browser, done = sign_in(gateway, "alice@example.com")
    assert done.status_code == 200
    assert browser.get("/admin/policy").status_code == 200
    # a code sent to another browser (no flow cookie), or a state altered on the way back
    stranger = httpx.Client(base_url=gateway.url)
    begun = stranger.get("/auth/sso/login")
    code_url = httpx.post(begun.headers["location"], data={"sub": "alice@example.com"}).headers["location"]
    other = httpx.get(code_url, timeout=30)
    assert other.status_code == 400 and "not begun here" in other.text
    altered = re.sub(r"state=[^&]+", "state=forged", code_url).removeprefix(gateway.url)
    assert stranger.get(altered).status_code == 400
    assert "tollgate_session" not in stranger.cookies

    # two sign-ins begun in one browser (two tabs): the first one's callback still completes
    tabs = httpx.Client(base_url=gateway.url, timeout=30)
    first = tabs.get("/auth/sso/login").headers["location"]
    tabs.get("/auth/sso/login", params={"next": "/reports"})
    code_url = httpx.post(first, data={"sub": "alice@example.com"}).headers["location"]
    done = tabs.get(code_url.removeprefix(gateway.url))
    assert done.status_code == 200 and "url=/console" in done.text and "tollgate_session" in tabs.cookies


def test_without_sso_its_routes_say_so_and_an_unreachable_provider_is_a_clear_502(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc]) -> None:
    sim = start_sim()
    plain = start_gateway(policy_dict([sim.url]))
    answer = httpx.get(plain.url + "/auth/sso/login")
    assert answer.status_code == 404 and "not configured" in answer.text
    gone = start_gateway(sso_policy("http://127.0.0.1:9", [sim.url]))
    answer = httpx.get(gone.url + "/auth/sso/login", timeout=30)
    assert answer.status_code == 502 and "could not be reached" in answer.text


def test_a_tenants_user_signs_in_through_the_provider_in_chromium_and_sees_its_own_usage(
        provider: str, start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    """In a real browser: the console's single sign-on link, the provider's form, back to the console with a
    SameSite=Strict session (the callback's page goes on by itself), the tenant's own usage and nothing more."""
    from playwright.sync_api import sync_playwright

    policy = sso_policy(provider, [start_sim().url])
    policy["prices"]["models"]["sim-llama-8b"] = [{"effective": "2026-01-01", "input_per_m": 300, "output_per_m": 900}]
    gateway = start_gateway(policy)  # priced so that two answers come to cents
    for _ in range(2):
        used = httpx.post(gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {DEMO_KEY}"},
                          json={"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
        assert used.status_code == 200
    assert wait_for(lambda: httpx.get(gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {DEMO_KEY}"}
                                      ).json()["total"]["requests"] == 2, timeout=20)
    shots = Path(os.environ.get("TOLLGATE_SCREENSHOT_DIR", tmp_path))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 500})
        page.goto(f"{gateway.url}/console")
        page.click("[data-testid=sso]")
        page.fill("input[name=sub]", "carol@example.com")
        page.click("button:has-text('Authorize')")
        page.wait_for_selector("[data-testid=usage-table]")
        assert page.url == f"{gateway.url}/console#usage"
        assert "carol@example.com" in page.inner_text("[data-testid=who]")
        total = httpx.get(gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {DEMO_KEY}"}).json()["total"]
        assert page.inner_text("[data-testid=usage-total]") == f"Requests: 2 · Spend (USD): {total['cost_usd']:.2f}"
        assert page.locator("[data-testid=tab-keys]").count() == 0, "a tenant's user has no admin tabs"
        refused = page.evaluate("async () => (await fetch('/admin/keys')).status")
        assert refused == 403, "and the routes refuse it, whatever the page shows"
        page.screenshot(path=str(shots / "console-tenant-usage.png"))
        browser.close()
