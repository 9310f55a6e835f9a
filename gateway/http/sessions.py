"""Sign-in sessions for the finance page: a signed, expiring, revocable cookie, never the token itself.

A session is ``<role>.<token id>.<expires>.<nonce>.<signature>``: the role (finance or admin), the first hex
digits of that role's token hash in the policy (rotating the token ends every session made with the old one),
a Unix expiry (``server.session_s``), a random nonce (what a sign-out revokes) and an HMAC over the rest. The
key is a secret of the gateway's own, never derived from the policy (which anyone who reads it could then
use): kept in Redis when replicas share state, else in the data directory (so the processes of one host
agree), else made per process. A sign-out revokes only a session this gateway signed and that still holds: its
nonce is remembered until the cookie's own (signed) expiry, in Redis and in this process (at most
``REVOKED_MAX`` of them here). Anything else, forged or expired, only has its cookie cleared: a sign-out
that needs no session must not be a way to fill memory or Redis.

The cookie is HttpOnly, SameSite=Strict, and Secure when the request came over TLS, directly or through a
proxy in ``server.trusted_proxies`` that says so in ``X-Forwarded-Proto``. A sign-in POST whose ``Origin``
names another site is refused (a login form on another site cannot sign a browser in).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import ipaddress
import logging
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.requests import Request

from gateway.policy.loader import PolicySnapshot
from gateway.state.secret import Secret

if TYPE_CHECKING:
    from gateway.state import SharedState

log = logging.getLogger("tollgate.sessions")
COOKIE = "tollgate_session"
ROLES = ("finance", "admin")
REVOKED_MAX = 10_000  # sign-outs this process remembers (1.8 MB measured); past it, the one ending soonest is let go


def role_hash(snapshot: PolicySnapshot, role: str) -> str | None:
    server = snapshot.policy.server
    return server.finance_token_sha256 if role == "finance" else server.admin_token_sha256


class Sessions:
    def __init__(self, data_dir: Path | None, state: SharedState | None) -> None:
        self._state = state
        self._secret = Secret("session.key", "session-key")  # signs the cookies (gateway.state.secret)
        self._secret.load(data_dir)
        self._revoked: dict[str, int] = {}  # nonce -> when its session expires
        self._ending: list[tuple[int, str]] = []  # the same, as a heap: what to let go first
        self.let_go = 0  # sign-outs dropped at REVOKED_MAX before their sessions expired

    async def start(self) -> None:
        """With shared state: every replica takes the one key in Redis (the first to start makes it)."""
        await self._secret.share(self._state)

    def issue(self, snapshot: PolicySnapshot, role: str, now: float | None = None) -> str:
        expected = role_hash(snapshot, role)
        assert expected is not None
        expires = int((time.time() if now is None else now) + snapshot.policy.server.session_s)
        payload = f"{role}.{_token_id(expected)}.{expires}.{secrets.token_urlsafe(12)}"
        return f"{payload}.{self._sign(payload)}"

    async def role(self, snapshot: PolicySnapshot, cookie: str | None, now: float | None = None) -> str | None:
        """The role a session cookie holds now, or None (forged, expired, signed out, or its token rotated)."""
        session = self._session(snapshot, cookie, time.time() if now is None else now)
        if session is None:
            return None
        role, _, nonce = session
        return None if await self._is_revoked(nonce) else role

    def _session(self, snapshot: PolicySnapshot, cookie: str | None, now: float) -> tuple[str, int, str] | None:
        """(role, expiry, nonce) of a cookie this gateway signed, not yet expired, made with the current token."""
        if not cookie or len(cookie) > 256:
            return None
        payload, _, signature = cookie.rpartition(".")
        parts = payload.split(".")
        if len(parts) != 4 or not hmac.compare_digest(signature, self._sign(payload)):
            return None
        role, token_id, expires, nonce = parts
        expected = role_hash(snapshot, role) if role in ROLES else None
        if expected is None or not hmac.compare_digest(token_id, _token_id(expected)):
            return None
        if not (expires.isascii() and expires.isdigit()) or int(expires) <= now:
            return None
        return role, int(expires), nonce

    async def revoke(self, snapshot: PolicySnapshot, cookie: str | None, now: float | None = None) -> bool:
        """Sign-out: a live session's nonce stays refused until the cookie expires (its expiry is signed, so at
        most the ``server.session_s`` it was issued with). Anything else stores nothing; False then."""
        now = time.time() if now is None else now
        session = self._session(snapshot, cookie, now)
        if session is None:
            return False
        _, expires, nonce = session
        self._remember(nonce, expires, now)
        state = self._state
        if state is not None and state.redis is not None:
            try:  # gone from Redis when the cookie expires: not a second later
                await state.redis.set(state.prefix + "revoked:" + nonce, 1, exat=expires)
            except Exception as exc:
                log.error("sign-out not shared through Redis (%s): it holds on this process only", exc)
        return True

    def _remember(self, nonce: str, expires: int, now: float) -> None:
        """Keep a sign-out here: expired ones are dropped first, then, at REVOKED_MAX, the one ending soonest."""
        if nonce in self._revoked:
            return
        ending = self._ending
        while ending and (ending[0][0] <= now or len(ending) >= REVOKED_MAX):
            gone, old = heapq.heappop(ending)
            del self._revoked[old]
            if gone > now:
                self.let_go += 1
                if self.let_go % 1000 == 1:
                    log.warning("over %d sign-outs held: %d let go before their sessions expired", REVOKED_MAX,
                                self.let_go)
        self._revoked[nonce] = expires
        heapq.heappush(ending, (expires, nonce))

    @property
    def revocations(self) -> int:
        """Sign-outs this process holds."""
        return len(self._revoked)

    async def _is_revoked(self, nonce: str) -> bool:
        if nonce in self._revoked:
            return True
        state = self._state
        if state is None or state.redis is None:
            return False
        try:
            return bool(await state.redis.exists(state.prefix + "revoked:" + nonce))
        except Exception:  # Redis down: this process's own sign-outs still hold
            return False

    def _sign(self, payload: str) -> str:
        return hmac.new(self._secret.key, payload.encode(), hashlib.sha256).hexdigest()[:32]


def _token_id(token_hash: str) -> str:
    return token_hash.removeprefix("sha256:")[:12]


def over_tls(request: Request, trusted: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """Did the client reach us over TLS? Directly, or through a trusted proxy that says so."""
    if request.url.scheme == "https":
        return True
    client = request.client.host if request.client else None
    if client is None or request.headers.get("x-forwarded-proto", "").lower() != "https":
        return False
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(address in network for network in trusted)


def same_origin(request: Request) -> bool:
    """A POST's Origin (when the browser sends one) names this site."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin.lower().split("://", 1)[-1].rstrip("/") == host.lower()
