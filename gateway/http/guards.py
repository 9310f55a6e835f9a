"""Who is calling a route, and may they: one guard per role, each raising an outcome the app's exception handler
answers. Routes are module-level functions; they find the gateway through ``request.app.state``."""

from __future__ import annotations

from starlette.requests import Request

from gateway.auth import admin_actor, identify, is_admin, token_matches
from gateway.errors import NotAuthenticated, NotPermitted
from gateway.http.asgi import request_headers
from gateway.http.sessions import COOKIE, Sessions
from gateway.policy.loader import PolicySnapshot, TenantView
from gateway.runtime import Gateway


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway  # starlette's app.state holds anything (Any)
    return gateway


def authorization(request: Request) -> bytes | None:
    """The Authorization header (refused with 400 when sent twice: which credential is the caller's?)."""
    return request_headers(request.scope).get(b"authorization")


def tenant_of(request: Request) -> TenantView:
    """The tenant whose key the request carries."""
    return identify(authorization(request), gateway_of(request).store.current)[0]


def require_admin(request: Request) -> None:
    """The admin token: an unknown credential is 401, a known one of another role (finance, a tenant) 403."""
    admin_actor(authorization(request), gateway_of(request).store.current)


def sessions_of(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def holds_report_token(authorization: bytes | None, snapshot: PolicySnapshot) -> bool:
    """The finance or the admin token, as a bearer."""
    return token_matches(authorization, snapshot.policy.server.finance_token_sha256) or \
        is_admin(authorization, snapshot)


async def reads_reports(request: Request, snapshot: PolicySnapshot) -> bool:
    """Does the caller hold the finance or admin token, as a bearer or through a sign-in session?"""
    if holds_report_token(authorization(request), snapshot):
        return True
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and await sessions_of(request).role(snapshot, cookie) is not None


async def require_reader(request: Request) -> None:
    """The finance or admin token; a tenant's own key is told where its totals are."""
    snapshot = gateway_of(request).store.current
    if await reads_reports(request, snapshot):
        return
    try:
        identify(authorization(request), snapshot)
    except NotAuthenticated:
        raise NotAuthenticated("A finance or admin token is required.", "invalid_finance_token") from None
    raise NotPermitted("Cost reports need a finance or admin token; a tenant reads /v1/usage.", "forbidden")


def require_metrics_reader(request: Request) -> None:
    expected = gateway_of(request).store.current.policy.server.metrics_token_sha256
    if expected is not None and not token_matches(authorization(request), expected):
        raise NotAuthenticated("A valid metrics token is required.", "invalid_metrics_token")
