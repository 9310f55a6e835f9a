"""Single sign-on: OpenID Connect sign-in (authorization code with PKCE, S256) for the console and the finance
page, through Authlib's Starlette client (discovery, the authorization URL, state, nonce, the code exchange and
the ID token's signature and claims). ``server.sso`` in the policy configures it; without it these routes say so.

- ``GET /auth/sso/login?next=/console|/reports``: to the provider, with a fresh state, nonce and PKCE verifier
  kept in a signed, HttpOnly, SameSite=Lax cookie scoped to ``/auth/sso`` for ``FLOW_S`` (Lax: the provider's
  redirect back is a cross-site navigation, which a Strict cookie would not come back on);
- ``GET /auth/sso/callback``: the code exchanged and the ID token checked (issuer as configured, audience this
  client, the nonce sent, unexpired), the person's role read from the claim ``server.sso.roles.claim`` names
  (gateway.policy.schema.SsoRoles), and a session begun (gateway.http.sessions). It answers a page that goes on
  by itself rather than a redirect: the session cookie is SameSite=Strict, and a browser does not send it on a
  redirect that began on the provider's site.

Every way a sign-in can fail answers a page of its own saying what happened, with a way to try again: the provider
refused (401) or is unreachable (502), the state or the ID token does not check out (400), the person's groups give no
role or two tenants (403). Nothing the provider sends is shown as HTML without escaping.
"""

from __future__ import annotations

import base64
import hmac
import html
import importlib
import logging
import re
import time
from typing import Any

import httpx
import orjson
from authlib.integrations.starlette_client import OAuth, OAuthError, StarletteOAuth2App
from joserfc.errors import JoseError
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from gateway.http.guards import gateway_of, sessions_of, start_session
from gateway.http.sessions import Principal, on_to, over_tls
from gateway.keys.model import LABEL_CHARS, unsafe_character
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Sso

log = logging.getLogger("tollgate.sso")
FLOW_COOKIE = "tollgate_sso"  # over TLS "__Secure-tollgate_sso" (it lives under /auth/sso, so not __Host-)
FLOW_S = 600  # how long a sign-in may take at the provider (why: docs/decisions/012)
BROWSER_COOKIE_BYTES = 4096  # what every browser keeps of one cookie, its name and attributes with it (RFC 6265)
TIMEOUT_S = 10.0  # for each call to the provider
_ERROR_CODE = re.compile(r"[a-z_]{1,64}")  # an OAuth error code, as the page repeats it (anything else is not)


def _http_errors() -> tuple[type[Exception], ...]:
    """What a failed call to the provider raises: Authlib calls it through httpx2 where that is installed (as the
    openai client pulls it in), else through httpx."""
    found: list[type[Exception]] = [httpx.HTTPError]
    try:
        found.append(importlib.import_module("httpx2").HTTPError)
    except ImportError:
        pass
    return tuple(found)


# what a call to the provider raises when it is unreachable or answers what is not OpenID Connect
UNREACHABLE: tuple[type[Exception], ...] = (*_http_errors(), ValueError, KeyError, RuntimeError)
UNREADABLE: tuple[type[Exception], ...] = (*UNREACHABLE, OAuthError)  # and metadata Authlib refuses


class Provider:
    """One Authlib client per ``server.sso`` as configured (a change of it makes a new one, which reads the
    provider's metadata afresh)."""

    def __init__(self) -> None:
        self._made: tuple[str, StarletteOAuth2App] | None = None

    def client(self, sso: Sso) -> StarletteOAuth2App:
        made = self._made
        config = sso.model_dump_json()
        if made is None or made[0] != config:
            oauth = OAuth()
            client = oauth.register(
                "tollgate", client_id=sso.client_id, client_secret=sso.client_secret,
                server_metadata_url=sso.issuer.rstrip("/") + "/.well-known/openid-configuration",
                client_kwargs={"scope": " ".join(sso.scopes), "code_challenge_method": "S256", "timeout": TIMEOUT_S,
                               "token_endpoint_auth_method":
                                   "client_secret_basic" if sso.client_secret else "none"})
            assert isinstance(client, StarletteOAuth2App)
            made = self._made = (config, client)
        return made[1]


def provider_of(request: Request) -> Provider:
    provider: Provider = request.app.state.sso
    return provider


async def login(request: Request) -> Response:
    snapshot = gateway_of(request).store.current
    sso = snapshot.policy.server.sso
    if sso is None:
        return _page("Single sign-on is not configured", "<p>Set <code>server.sso</code> in the policy, or sign in "
                     "with a token.</p>", 404)
    next_page = on_to(request.query_params.get("next", ""), "/console")
    flows = _read_flows(request)
    before, kept = set(flows), dict(flows)  # Authlib drops the sign-ins begun before: another tab's, kept here
    request.scope["session"] = flows
    try:
        response: Response = await provider_of(request).client(sso).authorize_redirect(
            request, _callback_url(request, snapshot))
    except UNREADABLE as exc:
        log.warning("single sign-on: the provider's metadata could not be read: %s", exc)
        return _failed("The sign-in provider could not be reached", f"{sso.issuer} did not answer its OpenID "
                       "configuration.", 502, next_page)
    for begun in set(flows) - before:  # the page to go on to, beside Authlib's state, nonce and verifier
        flows[begun]["data"]["next"] = next_page
    _write_flows(request, response, {**kept, **flows})
    return response


async def callback(request: Request) -> Response:
    gw = gateway_of(request)
    snapshot = gw.store.current
    sso = snapshot.policy.server.sso
    if sso is None:
        return _page("Single sign-on is not configured", "<p>Sign in with a token.</p>", 404)
    flows = _read_flows(request)
    state = request.query_params.get("state", "")
    next_page = str(((flows.get(f"_state_tollgate_{state}") or {}).get("data") or {}).get("next") or "/console")
    request.scope["session"] = flows
    try:
        token: dict[str, Any] = await provider_of(request).client(sso).authorize_access_token(  # type: ignore[no-untyped-call]  # untyped in its stubs
            request, claims_options={"iss": {"essential": True, "values": [sso.issuer]},
                                     "aud": {"essential": True, "values": [sso.client_id]}})
    except OAuthError as exc:
        refused = exc.error not in ("mismatching_state", "missing_state")
        code = exc.error if isinstance(exc.error, str) and _ERROR_CODE.fullmatch(exc.error) else "an error"
        what = (f"The provider refused the sign-in ({code})." if refused else
                "This sign-in was not begun here, or took longer than ten minutes.")
        return _failed("Sign-in did not complete", what, 401 if refused else 400, next_page)
    except JoseError as exc:
        log.warning("single sign-on: an ID token did not check out: %s", exc)
        return _failed("Sign-in did not complete", "The provider's ID token did not check out "
                       f"({type(exc).__name__}).", 400, next_page)
    except UNREACHABLE as exc:
        log.warning("single sign-on: the code exchange failed: %s", exc)
        return _failed("The sign-in provider could not be reached", "The code could not be exchanged for a token.",
                       502, next_page)
    claims: dict[str, Any] = dict(token.get("userinfo") or {})
    if not claims:
        return _failed("Sign-in did not complete", "The provider sent no ID token (is 'openid' among its scopes?).",
                       400, next_page)
    who = _name(claims, sso)
    principal, problem = role_of(claims, sso, who)
    if principal is None:
        log.info("single sign-on: %s refused: %s", who, problem)
        return _failed("You are signed in at the provider, but not here", problem, 403, next_page)
    response = _page("Signed in", f'<p>Signed in as {html.escape(who)}; on to <a href="{next_page}">{next_page}'
                     f'</a>.</p>', 200, f'<meta http-equiv="refresh" content="0;url={next_page}">')
    start_session(request, response, snapshot, principal)
    _write_flows(request, response, flows)
    return response


def role_of(claims: dict[str, Any], sso: Sso, who: str) -> tuple[Principal | None, str]:
    """The person's role from their groups: admin, then finance, then one tenant; or None and why not."""
    held = claims.get(sso.roles.claim)
    groups = {held} if isinstance(held, str) else {g for g in held if isinstance(g, str)} if isinstance(
        held, list) else set()
    if groups & set(sso.roles.admin):
        return Principal("admin", None, who), ""
    if groups & set(sso.roles.finance):
        return Principal("finance", None, who), ""
    tenants = sorted({sso.roles.tenants[g] for g in groups if g in sso.roles.tenants})
    if len(tenants) == 1:
        return Principal("tenant", tenants[0], who), ""
    if tenants:
        return None, f"Your groups name {len(tenants)} tenants ({', '.join(tenants)}); ask an admin to keep one."
    return None, (f"None of your groups (claim '{sso.roles.claim}') is given a role in this gateway's policy; "
                  "ask an admin to add one under server.sso.roles.")


def _name(claims: dict[str, Any], sso: Sso) -> str:
    """What the audit log calls the person: the configured claim, else the subject; printable, bounded."""
    value = claims.get(sso.name_claim)
    text = value if isinstance(value, str) and value else str(claims.get("sub", "unknown"))
    text = text[:LABEL_CHARS]
    return text if unsafe_character(text) is None else \
        text.encode("ascii", "backslashreplace").decode()[:LABEL_CHARS]


def _callback_url(request: Request, snapshot: PolicySnapshot) -> str:
    scheme = "https" if over_tls(request, snapshot.policy.server.trusted_proxies) else "http"
    return f"{scheme}://{request.headers.get('host', 'localhost')}/auth/sso/callback"


def _read_flows(request: Request) -> dict[str, Any]:
    """The sign-ins begun in this browser (Authlib's state data), from the flow cookie if it is ours and fresh."""
    raw = request.cookies.get(_flow_cookie(request), "")
    body, _, signature = raw.rpartition(".")
    if not body or not raw.isascii() or not hmac.compare_digest(signature, _sign(request, body)):
        return {}
    try:
        flows = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return {}
    now = time.time()
    return {k: v for k, v in flows.items() if isinstance(v, dict) and isinstance(v.get("exp"), (int, float))
            and v["exp"] > now} if isinstance(flows, dict) else {}


def _write_flows(request: Request, response: Response, flows: dict[str, Any]) -> None:
    """Keep the newest sign-ins, each for FLOW_S, as many as a browser keeps in one cookie (about four; the newest
    always); none left: the cookie goes."""
    for entry in flows.values():
        entry["exp"] = min(entry["exp"], time.time() + FLOW_S)
    kept = dict(sorted(flows.items(), key=lambda kv: kv[1]["exp"]))
    secure = over_tls(request, gateway_of(request).store.current.policy.server.trusted_proxies)
    name = _flow_cookie(request)
    room = BROWSER_COOKIE_BYTES - len(name) - 200  # its name, signature and attributes
    body = ""
    while kept:
        body = base64.urlsafe_b64encode(orjson.dumps(kept)).decode().rstrip("=")
        if len(body) <= room or len(kept) == 1:
            break
        kept.pop(next(iter(kept)))  # the oldest
    if not kept:
        response.delete_cookie(name, path="/auth/sso", secure=secure)
        return
    response.set_cookie(name, f"{body}.{_sign(request, body)}", max_age=FLOW_S, path="/auth/sso",
                        httponly=True, samesite="lax", secure=secure)


def _flow_cookie(request: Request) -> str:
    """The flow cookie's name: over TLS with the __Secure- prefix, which a page over plain HTTP cannot set."""
    secure = over_tls(request, gateway_of(request).store.current.policy.server.trusted_proxies)
    return "__Secure-" + FLOW_COOKIE if secure else FLOW_COOKIE


def _sign(request: Request, body: str) -> str:
    return sessions_of(request).sign("sso-flow", body)


def _failed(title: str, what: str, status: int, next_page: str) -> HTMLResponse:
    return _page(title, f"<p>{html.escape(what)}</p><p><a href=\"/auth/sso/login?next={next_page}\">Try again"
                 f"</a> · <a href=\"{next_page}\">Sign in with a token</a></p>", status)


def _page(title: str, body: str, status: int, head: str = "") -> HTMLResponse:
    return HTMLResponse(f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
                        f'</title>{head}<style>body{{font-family:system-ui,"Noto Sans KR",sans-serif;margin:3em}}'
                        f'</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>', status)


ROUTES = [Route("/auth/sso/login", login, methods=["GET"]), Route("/auth/sso/callback", callback, methods=["GET"])]
