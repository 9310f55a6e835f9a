"""Sign-in sessions for the console and the finance page: a signed, expiring, revocable cookie, never a token.

A session is ``<role>.<binding>.<expires>.<nonce>.<who>.<signature>``: the role (``admin``, ``finance``, or
``tenant-`` and the tenant's name in base64url), what it is bound to, a Unix expiry (``server.session_s``), a
random nonce (what a sign-out revokes), the person (base64url of the name single sign-on gave; ``-`` for a token
sign-in) and an HMAC over the rest. A token sign-in is bound to the first hex digits of that role's token hash
in the policy (rotating the token ends every session made with the old one); a single sign-on one to a digest
of ``server.sso``'s issuer, client and role mapping (changing any of them, or removing single sign-on, ends
them), and a tenant's session to its tenant still being in the policy. The key is a secret of the gateway's
own, never derived from the policy (which anyone who reads it could then use): kept in Redis when replicas share
state, else in the data directory (so the processes of one host agree), else made per process. A sign-out
revokes only a session this gateway signed and that still holds: its nonce is remembered until the cookie's own
(signed) expiry, in Redis and in this process (at most ``REVOKED_MAX`` of them here). Anything else, forged or
expired, only has its cookie cleared: a sign-out that needs no session must not be a way to fill memory or Redis.

The cookie is HttpOnly, SameSite=Strict, and Secure when the request came over TLS, directly or through a
proxy in ``server.trusted_proxies`` that says so in ``X-Forwarded-Proto``; over TLS it is named with the
``__Host-`` prefix and only that name is read (``session_cookie``). A sign-in POST whose ``Origin``
names another site is refused (a login form on another site cannot sign a browser in).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import ipaddress
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import orjson
from starlette.requests import Request

from gateway.policy.loader import PolicySnapshot
from gateway.state.secret import Secret

if TYPE_CHECKING:
    from gateway.state import SharedState

log = logging.getLogger("tollgate.sessions")
COOKIE = "tollgate_session"  # over plain HTTP (a local demo): Secure cannot be set there
# Over TLS: a __Host- cookie is Secure, Path=/ and has no Domain, so no other site can set it, a sibling subdomain
# included (it could otherwise plant its own signed-in session in an admin's browser: session fixation)
SECURE_COOKIE = "__Host-tollgate_session"
Role = Literal["admin", "finance", "tenant"]
SIGN_IN_PAGES = ("/console", "/reports")  # where a sign-in or a sign-out goes on to: these, and nowhere else
REVOKED_MAX = 10_000  # sign-outs this process remembers (1.8 MB measured); past it, the one ending soonest is let go


@dataclass(frozen=True, slots=True)
class Principal:
    """Who holds a session: a role, the tenant of a tenant's session, and the person when single sign-on made it
    (None for a token sign-in)."""

    role: Role
    tenant: str | None = None
    who: str | None = None

    def actor(self, snapshot: PolicySnapshot) -> str:
        """The audit log's name for this caller: ``sso:<person>``, or as the role's token is named."""
        if self.who is not None:
            return f"sso:{self.who}"
        return f"{self.role}:{_token_id(role_hash(snapshot, self.role) or '')}"


def role_hash(snapshot: PolicySnapshot, role: str) -> str | None:
    server = snapshot.policy.server
    return {"finance": server.finance_token_sha256, "admin": server.admin_token_sha256}.get(role)


def sso_binding(snapshot: PolicySnapshot) -> str | None:
    """What a single sign-on session is bound to: the provider, the client and the role mapping (None: off)."""
    sso = snapshot.policy.server.sso
    if sso is None:
        return None
    bound = orjson.dumps([sso.issuer, sso.client_id, sso.roles.model_dump(mode="json")], option=orjson.OPT_SORT_KEYS)
    return "sso" + hashlib.sha256(bound).hexdigest()[:12]


def _binding(snapshot: PolicySnapshot, principal: Principal) -> str | None:
    if principal.who is not None:
        return sso_binding(snapshot)
    expected = role_hash(snapshot, principal.role)
    return _token_id(expected) if expected is not None else None


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

    def issue(self, snapshot: PolicySnapshot, principal: Principal, now: float | None = None) -> str:
        """A session for ``principal``, which the policy must allow now (its role's token, or single sign-on)."""
        binding = _binding(snapshot, principal)
        assert binding is not None
        role = principal.role if principal.tenant is None else "tenant-" + _b64(principal.tenant)
        expires = int((time.time() if now is None else now) + snapshot.policy.server.session_s)
        who = _b64(principal.who) if principal.who is not None else "-"
        payload = f"{role}.{binding}.{expires}.{secrets.token_urlsafe(12)}.{who}"
        return f"{payload}.{self._sign(payload)}"

    async def principal(self, snapshot: PolicySnapshot, cookie: str | None,
                        now: float | None = None) -> Principal | None:
        """Who a session cookie holds now, or None (forged, expired, signed out, or what it was bound to changed)."""
        session = self._session(snapshot, cookie, time.time() if now is None else now)
        if session is None:
            return None
        principal, _, nonce = session
        return None if await self._is_revoked(nonce) else principal

    def _session(self, snapshot: PolicySnapshot, cookie: str | None,
                 now: float) -> tuple[Principal, int, str] | None:
        """(who, expiry, nonce) of a cookie this gateway signed, not yet expired, bound to what still holds."""
        if not cookie or not cookie.isascii():  # (its size: the request head's bound) a forged byte must not be a 500
            return None
        payload, _, signature = cookie.rpartition(".")
        parts = payload.split(".")
        if len(parts) != 5 or not hmac.compare_digest(signature, self._sign(payload)):
            return None
        role, binding, expires, nonce, who = parts
        if not (expires.isascii() and expires.isdigit()) or int(expires) <= now:
            return None
        principal = _principal(role, who)
        if principal is None or (principal.tenant is not None and principal.tenant not in snapshot.tenants):
            return None
        expected = _binding(snapshot, principal)
        if expected is None or not hmac.compare_digest(binding, expected):
            return None
        return principal, int(expires), nonce

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

    def sign(self, purpose: str, payload: str) -> str:
        """An HMAC of ``payload`` under a key of its own for ``purpose`` (derived from the sessions' key): what
        else this gateway hands a browser to give back unchanged (the single sign-on flow)."""
        key = hmac.new(self._secret.key, purpose.encode(), hashlib.sha256).digest()
        return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()[:32]


def on_to(asked: str, default: str = "/reports") -> str:
    """The page a sign-in or sign-out goes on to: the one asked for if it is one of ours, else ``default``."""
    return asked if asked in SIGN_IN_PAGES else default


def _token_id(token_hash: str) -> str:
    return token_hash.removeprefix("sha256:")[:12]


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def _principal(role: str, who: str) -> Principal | None:
    """A signed cookie's role and person, read back (None for what this gateway does not write)."""
    person = None if who == "-" else _unb64(who)
    if who != "-" and person is None:
        return None
    if role in ("admin", "finance"):
        return Principal("admin" if role == "admin" else "finance", None, person)
    if role.startswith("tenant-"):
        tenant = _unb64(role.removeprefix("tenant-"))
        return Principal("tenant", tenant, person) if tenant and person is not None else None
    return None


def session_cookie(secure: bool) -> str:
    """The session cookie's name: only the __Host- one is read or written over TLS."""
    return SECURE_COOKIE if secure else COOKIE


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
