"""The HTTP edge in-process: how each outcome renders, and the routes' guards, over an in-memory ASGI transport
(no server, no worker: the app is called as uvicorn would call it)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from gateway import errors
from gateway.http.app import create_app
from gateway.outcomes import render
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, FINANCE_TOKEN, policy_dict


@pytest.mark.parametrize(("outcome", "status", "kind"), [
    (errors.InvalidRequest("bad", "invalid_value", param="x"), 400, "invalid_request_error"),
    (errors.TooLarge("big"), 413, "invalid_request_error"),
    (errors.NotAuthenticated("who"), 401, "invalid_request_error"),
    (errors.NotPermitted("no"), 403, "invalid_request_error"),
    (errors.NotFound("none"), 404, "invalid_request_error"),
    (errors.Conflict("state"), 409, "invalid_request_error"),
    (errors.ClientGone("gone"), 499, "invalid_request_error"),
    (errors.Shed("busy", "standard", "deadline", 2.2), 429, "rate_limit_error"),
    (errors.RateLimited("rpm", retry_after_s=30), 429, "rate_limit_error"),
    (errors.TenantBusy("many"), 429, "rate_limit_error"),
    (errors.OverBudget("spent"), 429, "insufficient_quota"),
    (errors.Unavailable("down", retry_after_s=5), 503, "server_error"),
    (errors.UpstreamFailed("stream", "ClientPayloadError at 10.0.0.7:8000"), 502, "server_error"),
    (errors.WorkerRejected("context too long", 422), 422, "invalid_request_error"),
    (errors.GatewayError("bug"), 500, "server_error"),
])
def test_each_outcome_renders_as_openai_does(outcome: errors.GatewayError, status: int, kind: str) -> None:
    got, headers, body = render(outcome)
    error = orjson.loads(body)["error"]
    assert (got, error["type"], error["code"]) == (status, kind, outcome.code)
    assert set(error) == {"message", "type", "param", "code"}
    retry = dict(headers).get(b"retry-after")
    assert (retry is not None) == isinstance(outcome, errors.TryLater)
    if isinstance(outcome, errors.UpstreamFailed):
        assert "10.0.0.7" not in error["message"] and "ClientPayloadError" not in error["message"]


def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one() -> None:
    for seconds, header in ((0.0, b"1"), (0.3, b"1"), (2.2, b"3"), (30, b"30")):
        assert dict(render(errors.RateLimited("x", retry_after_s=seconds))[1])[b"retry-after"] == header


def test_itemised_details_ride_along() -> None:
    rejected = errors.InvalidRequest("The policy was rejected.", "invalid_policy")
    rejected.details = [{"path": "tenants.a.tier", "message": "unknown tier"}]
    assert orjson.loads(render(rejected)[2])["error"]["details"] == rejected.details


def app_client() -> httpx.AsyncClient:
    store = PolicyStore(PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])), "test"))
    transport = httpx.ASGITransport(app=create_app(store))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_every_guarded_route_answers_in_the_openai_shape() -> None:
    async def main() -> list[tuple[str, int, Any]]:
        async with app_client() as client:
            seen = []
            for method, path, headers in [
                ("GET", "/admin/queues", {}),
                ("GET", "/admin/queues", bearer(DEMO_KEY)),
                ("GET", "/admin/queues", bearer(FINANCE_TOKEN)),
                ("GET", "/admin/policy/status", bearer(ADMIN_TOKEN)),
                ("GET", "/admin/reports/costs", bearer(DEMO_KEY)),
                ("GET", "/admin/reports/costs", {}),
                ("GET", "/admin/reports/costs", bearer(FINANCE_TOKEN)),  # no data dir: no ledger
                ("GET", "/v1/models", {}),
                ("GET", "/v1/models", bearer(DEMO_KEY)),
                ("GET", "/v1/usage", bearer(DEMO_KEY)),
                ("GET", "/v1/nowhere", {}),
                ("DELETE", "/v1/models", bearer(DEMO_KEY)),
            ]:
                reply = await client.request(method, path, headers=headers)
                seen.append((f"{method} {path} {sorted(headers)}", reply.status_code, reply.json()))
            two_keys = await client.get("/admin/queues", headers=[("authorization", f"Bearer {ADMIN_TOKEN}"),
                                                                  ("authorization", f"Bearer {DEMO_KEY}")])
            seen.append(("two keys", two_keys.status_code, two_keys.json()))
            page = await client.get("/reports", headers=[("authorization", f"Bearer {FINANCE_TOKEN}"),
                                                         ("authorization", f"Bearer {DEMO_KEY}")])
            seen.append(("two keys on the finance page", page.status_code, page.json()))
            return seen
    seen = asyncio.run(main())
    statuses = [status for _, status, _ in seen]
    assert statuses == [401, 403, 403, 200, 403, 401, 409, 401, 200, 409, 404, 405, 400, 400], seen
    codes = {what: body["error"]["code"] for what, status, body in seen if status >= 400}
    assert codes["GET /admin/queues []"] == "invalid_admin_token"
    assert codes["GET /admin/reports/costs ['authorization']"] in ("forbidden", "ledger_disabled")
    assert codes["two keys"] == codes["two keys on the finance page"] == "duplicate_header"
    assert all(set(body["error"]) >= {"message", "type", "param", "code"} for _, s, body in seen if s >= 400)


def test_the_finance_sign_in_is_a_session_not_the_token() -> None:
    """The cookie is signed, expiring and revocable; not Secure on an untrusted peer's say-so; the form is small; a
    sign-in from another site's page is refused."""
    from gateway.http.sessions import COOKIE

    async def main() -> None:
        async with app_client() as client:
            big = await client.post("/reports/login", content=b"token=" + b"x" * 5_000_000,
                                    headers={"content-type": "application/x-www-form-urlencoded"})
            assert big.status_code == 413
            foreign = await client.post("/reports/login", data={"token": FINANCE_TOKEN},
                                        headers={"origin": "https://evil.example"})
            assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "cross_origin"
            wrong = await client.post("/reports/login", data={"token": "tg-guess"})
            assert wrong.status_code == 401 and COOKIE not in wrong.cookies

            signed = await client.post("/reports/login", data={"token": FINANCE_TOKEN},
                                       headers={"origin": "http://gateway"})
            assert signed.status_code == 303
            header = signed.headers["set-cookie"]
            session = signed.cookies[COOKIE]
            assert FINANCE_TOKEN not in header and session.startswith("finance.")
            assert "HttpOnly" in header and "SameSite=strict" in header and "Secure" not in header
            assert "Max-Age=28800" in header
            behind_tls = await client.post("/reports/login", data={"token": ADMIN_TOKEN},
                                           headers={"x-forwarded-proto": "https"})
            assert "Secure" not in behind_tls.headers["set-cookie"], "no proxy is trusted by default: its word only"

            client.cookies.clear()

            async def reports_with(cookie: str) -> int:
                reply = await client.get("/admin/reports/costs", headers={"cookie": f"{COOKIE}={cookie}"})
                return reply.status_code
            assert await reports_with(session) == 409, "the session reads reports (this app has no ledger)"
            forged = session[:-4] + ("0000" if not session.endswith("0000") else "1111")
            assert await reports_with(forged) == 401
            assert await reports_with(FINANCE_TOKEN) == 401, "the raw token is no session"
            out = await client.post("/reports/logout", headers={"cookie": f"{COOKIE}={session}"})
            assert out.status_code == 303
            client.cookies.clear()
            assert await reports_with(session) == 401, "signed out"
    asyncio.run(main())


def test_a_session_ends_when_it_expires_or_its_token_is_rotated() -> None:
    from gateway.auth import hash_key
    from gateway.http.sessions import Principal, Sessions

    async def main() -> None:
        policy = policy_dict(["http://127.0.0.1:9"])
        snapshot = PolicySnapshot.build(Policy.model_validate(policy), "test")
        sessions = Sessions(None, None)
        cookie = sessions.issue(snapshot, Principal("finance"), now=1_000.0)
        assert await sessions.principal(snapshot, cookie, now=1_000.0 + 3600) == Principal("finance")
        assert await sessions.principal(snapshot, cookie, now=1_000.0 + 8 * 3600 + 1) is None, "expired"
        policy["server"]["finance_token_sha256"] = "sha256:" + hash_key("tg-rotated")
        rotated = PolicySnapshot.build(Policy.model_validate(policy), "test")
        assert await sessions.principal(rotated, cookie, now=1_000.0) is None, "the token it was made with is gone"
        assert await Sessions(None, None).principal(snapshot, cookie, now=1_000.0) is None, "another key: not ours"
    asyncio.run(main())
