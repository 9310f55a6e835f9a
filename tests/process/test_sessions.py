"""Sign-out stores only what a real session needs: a forged or expired cookie's sign-out clears the cookie and
stores nothing (here or in Redis); a real one is refused until its own expiry, and no longer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from gateway.http import sessions as sessions_
from gateway.http.sessions import COOKIE, Principal, Sessions
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy, StatePolicy
from gateway.state import SharedState
from tests.conftest import FINANCE_TOKEN, REDIS_URL, Proc, on_shared_state, policy_dict


def snapshot() -> PolicySnapshot:
    return PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])), "test")


def forgeries(real: str) -> list[str]:
    """Cookies a caller can make without the key: from nothing, and from a real one with a part changed."""
    role, token_id, expires, nonce, who, signature = real.split(".")
    return ["", "x", "a.b.c.d.e.f", f"finance.{token_id}.99999999999.{'n' * 16}.-.{'0' * 32}",
            f"{role}.{token_id}.{int(expires) + 10**9}.{nonce}.{who}.{signature}",  # a later expiry, the old signature
            f"{role}.{token_id}.{expires}.other-nonce.{who}.{signature}",
            f"admin.{token_id}.{expires}.{nonce}.{who}.{signature}",  # another role, the old signature
            f"{role}.{token_id}.{expires}.{nonce}.{who}.{'f' * 32}", real + "x", "." * 255]


def test_a_forged_or_expired_cookie_signs_out_nothing() -> None:
    async def main() -> None:
        snap, sessions = snapshot(), Sessions(None, None)
        real = sessions.issue(snap, Principal("finance"), now=1_000.0)
        for cookie in forgeries(real) * 100 + [None]:
            assert await sessions.revoke(snap, cookie, now=1_000.0) is False
        assert await sessions.revoke(snap, real, now=1_000.0 + 8 * 3600) is False, "expired: nothing to end"
        assert await Sessions(None, None).revoke(snap, real, now=1_000.0) is False, "another gateway's key"
        assert sessions.revocations == 0
        assert await sessions.principal(snap, real, now=1_001.0) == Principal("finance"), "the real session still holds"
    asyncio.run(main())


def test_a_sign_out_holds_until_the_session_expires_then_is_dropped() -> None:
    async def main() -> None:
        snap, sessions = snapshot(), Sessions(None, None)
        ended = sessions.issue(snap, Principal("finance"), now=1_000.0)
        assert await sessions.revoke(snap, ended, now=1_010.0) is True
        assert await sessions.revoke(snap, ended, now=1_020.0) is True and sessions.revocations == 1, "once"
        assert await sessions.principal(snap, ended, now=1_011.0) is None, "signed out"
        assert await sessions.principal(snap, ended, now=1_000.0 + 8 * 3600 - 1) is None, "until its expiry"
        later = sessions.issue(snap, Principal("admin"), now=1_000.0 + 8 * 3600)
        assert await sessions.revoke(snap, later, now=1_000.0 + 8 * 3600) is True
        assert sessions.revocations == 1, "the first one's session is over: its sign-out is dropped"
    asyncio.run(main())


def test_the_sign_outs_held_here_are_capped() -> None:
    async def main() -> None:
        snap, sessions = snapshot(), Sessions(None, None)
        cookies = [sessions.issue(snap, Principal("finance"), now=1_000.0 + i)
                   for i in range(sessions_.REVOKED_MAX + 5)]
        for cookie in cookies:
            assert await sessions.revoke(snap, cookie, now=1_000.0)
        assert sessions.revocations == sessions_.REVOKED_MAX and sessions.let_go == 5
        assert await sessions.principal(snap, cookies[-1], now=1_000.0) is None, "the latest sign-outs are kept"
        assert await sessions.principal(snap, cookies[0], now=1_000.0) == Principal("finance"), \
            "the one ending soonest went"
    asyncio.run(main())


def test_a_sign_out_in_redis_lasts_the_cookies_remaining_life(start_gateway: Callable[..., Proc],
                                                               tmp_path: Path) -> None:
    """Over HTTP, against a gateway process sharing state through this machine's Redis."""
    policy = on_shared_state(policy_dict(["http://127.0.0.1:9"]))
    namespace = policy["state"]["namespace"]
    gw = start_gateway(policy, ready="/healthz")
    db = redis.Redis.from_url(REDIS_URL)

    def revoked() -> list[bytes]:
        return list(db.scan_iter(f"{namespace}:revoked:*"))

    with httpx.Client(base_url=gw.url, timeout=10) as client:
        signed = client.post("/reports/login", data={"token": FINANCE_TOKEN})
        assert signed.status_code == 303
        real = signed.cookies[COOKIE]
        client.cookies.clear()

        def reports_with(cookie: str) -> int:
            return client.get("/admin/reports/costs", headers={"cookie": f"{COOKIE}={cookie}"}).status_code

        assert reports_with(real) == 200, "the session opens the reports"

        async def expired_but_signed() -> str:
            state = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=namespace))
            mine = Sessions(None, state)
            await mine.start()  # the gateway's key, from Redis
            await state.close()
            return mine.issue(snapshot(), Principal("finance"), now=time.time() - 9 * 3600)

        for cookie in [*forgeries(real), asyncio.run(expired_but_signed())]:
            out = client.post("/reports/logout", headers={"cookie": f"{COOKIE}={cookie}"})
            assert out.status_code == 303 and 'tollgate_session=""' in out.headers["set-cookie"], "cleared"
        assert revoked() == [], "nothing was stored for a cookie that holds no session"

        expires = int(real.split(".")[2])
        assert client.post("/reports/logout", headers={"cookie": f"{COOKIE}={real}"}).status_code == 303
        [key] = revoked()
        before = time.time()
        left_ms = db.pttl(key)
        assert 0 < left_ms <= (expires - before) * 1000 + 1, "gone from Redis when the cookie expires"
        assert reports_with(real) == 401, "signed out"
    db.close()
