"""Who is calling a route, and may they: one guard per role, each raising an outcome the app's exception handler
answers. Routes are module-level functions; they find the gateway through ``request.app.state``.

A caller is known by a bearer token (a key, or the admin, finance or metrics token), or else by a sign-in session
cookie (gateway.http.sessions): the console and the finance page call the same routes as automation does. A
request sent with a session cookie that changes something (any method but GET and HEAD) must also carry
``X-Tollgate-Console`` and, when the browser names one, this site's ``Origin``: the cookie is SameSite=Strict
already, and a header no HTML form can send keeps another site's page from using it all the same."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.auth import admin_actor, identify, is_admin, token_matches
from gateway.errors import NotAuthenticated, NotPermitted
from gateway.http.asgi import request_headers
from gateway.http.sessions import Principal, Sessions, over_tls, same_origin, session_cookie
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


def sessions_of(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


async def signed_in(request: Request, snapshot: PolicySnapshot) -> Principal | None:
    """Who the request's session cookie holds, when it carries no Authorization (a bearer always speaks first).
    A session's request that changes something without the console's header and this site's origin is 403."""
    cookie = request.cookies.get(session_cookie(over_tls(request, snapshot.policy.server.trusted_proxies)))
    if cookie is None or authorization(request) is not None:
        return None
    principal = await sessions_of(request).principal(snapshot, cookie)
    if principal is not None and request.method not in ("GET", "HEAD") and not (
            request.headers.get("x-tollgate-console") and same_origin(request)):
        raise NotPermitted("A signed-in change must come from this gateway's console (X-Tollgate-Console, same "
                           "origin).", "cross_origin")
    return principal


async def require_admin(request: Request) -> str:
    """The admin token or an admin's session; who the caller is, for the audit. An unknown credential is 401, a
    known one of another role (finance, a tenant, their sessions) 403."""
    snapshot = gateway_of(request).store.current
    principal = await signed_in(request, snapshot)
    if principal is not None:
        if principal.role == "admin":
            return principal.actor(snapshot)
        raise NotPermitted(f"This route needs an admin; you are signed in as {_described(principal)}.",
                           "permission_denied")
    return admin_actor(authorization(request), snapshot)


def start_session(request: Request, response: Response, snapshot: PolicySnapshot, principal: Principal) -> None:
    """Give ``response`` a new session cookie for ``principal`` (HttpOnly, SameSite=Strict, Secure over TLS)."""
    policy = snapshot.policy.server
    secure = over_tls(request, policy.trusted_proxies)
    response.set_cookie(session_cookie(secure), sessions_of(request).issue(snapshot, principal),
                        max_age=int(policy.session_s), httponly=True, samesite="strict", path="/", secure=secure)


def _described(principal: Principal) -> str:
    return f"tenant {principal.tenant}'s user" if principal.role == "tenant" else principal.role


def holds_report_token(authorization: bytes | None, snapshot: PolicySnapshot) -> bool:
    """The finance or the admin token, as a bearer."""
    return token_matches(authorization, snapshot.policy.server.finance_token_sha256) or \
        is_admin(authorization, snapshot)


async def reads_reports(request: Request, snapshot: PolicySnapshot) -> bool:
    """Does the caller hold the finance or admin token, as a bearer or through a sign-in session? A tenant's
    session is refused (403) here: it reads its own usage only."""
    if holds_report_token(authorization(request), snapshot):
        return True
    principal = await signed_in(request, snapshot)
    if principal is not None and principal.role == "tenant":
        raise NotPermitted("Cost reports are for finance and admins; your own usage is on the console.",
                           "permission_denied")
    return principal is not None


async def require_reader(request: Request) -> None:
    """The finance or admin token or session; a tenant's own key is told where its totals are."""
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
