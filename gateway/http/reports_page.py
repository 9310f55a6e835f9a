"""The finance page's routes (GET /reports; ``?days=`` | ``?month=YYYY-MM``, ``?tenant=`` to drill into one
tenant, ``?lang=en|ko`` or else ``Accept-Language`` for its language): sign-in and sign-out, the period, tenant
and language asked for, and the answer; what the page shows, and how it is
drawn, is gateway.finance.page.

A parameter the page cannot honour (days outside 1-366 or not a number, a month not YYYY-MM, both days and a
month, a tenant neither the policy nor the ledger knows) is answered 400 with the page's form and a message
saying what was wrong and what is accepted, never replaced by another period or tenant: finance must not close
a month on figures for a period it did not ask for.

Sign-in takes the finance or admin token once and keeps it in an HttpOnly, SameSite=Strict cookie, which the
report API also accepts, so the CSV links work from the page (gateway.http.sessions). The page is read and drawn
on the report thread, one build at a time (gateway.finance.heavy): while another statement or report is being
built it answers 503 with Retry-After and a line saying so.
"""

from __future__ import annotations

import time
import urllib.parse

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.auth import is_admin
from gateway.errors import InvalidRequest, NotPermitted, Unavailable
from gateway.finance import heavy, labels, words
from gateway.finance import page as finance_page
from gateway.http.asgi import read_body, request_headers
from gateway.http.guards import gateway_of, holds_report_token, reads_reports, sessions_of, start_session
from gateway.http.reports import parse_tenant
from gateway.http.responses import spooled
from gateway.http.sessions import Principal, Role, on_to, over_tls, same_origin, session_cookie
from gateway.spend.alerts import public

LOGIN_BYTES = 4096


async def page(request: Request) -> Response:
    gw = gateway_of(request)
    if not await reads_reports(request, gw.store.current):
        return _sign_in(lang=_lang_or_english(request), sso=gw.store.current.policy.server.sso is not None)
    if gw.ledger is None:
        return HTMLResponse(finance_page.page_html("Tollgate costs", "<p>The ledger is not enabled: start the "
                                                   "gateway with a data directory.</p>"), 409)
    problems: list[str] = []
    try:
        lang = words.choose(request.query_params.get("lang"), request.headers.get("accept-language"))
    except InvalidRequest as exc:
        lang = "en"
        problems.append(exc.message)
    try:
        shown = finance_page.Range.of(request.query_params, time.time())
    except InvalidRequest as exc:
        shown, problems = finance_page.Range.of({}, time.time()), [exc.message]
    try:
        tenant = await parse_tenant(request, gw.ledger.store)
    except InvalidRequest as exc:
        tenant = None
        problems.append(exc.message)
    if problems:
        with words.speaking(lang):
            return HTMLResponse(finance_page.refused(problems, shown, tenant), 400)
    live = gw.presence.live(time.time()) if gw.presence is not None else []
    alerts = [public(a) for a in gw.alerts.recent[-20:][::-1]]
    try:
        body = await heavy.build(f"finance page {shown.query}{' ' + tenant if tenant else ''}", finance_page.draw,
                                 gw.ledger.store, gw.store.current, shown, tenant, live, alerts,
                                 labels.keys_of(gw.keys.keys(tenant), time.time()), lang)
    except Unavailable as exc:
        if exc.code != "reports_busy":
            raise
        return HTMLResponse(finance_page.busy(shown, tenant), 503, {"retry-after": str(heavy.RETRY_AFTER_S)})
    return spooled(body, "text/html; charset=utf-8")


async def login(request: Request) -> Response:
    """Trade the finance or admin token for a session. The form is read from at most LOGIN_BYTES (no one signs
    in with more), and a POST from another site's page is refused."""
    if not same_origin(request):
        raise NotPermitted("Sign in from this gateway's own page.", "cross_origin")
    raw = await read_body(request.receive, request_headers(request.scope), LOGIN_BYTES)
    try:
        form = urllib.parse.parse_qs(raw.decode("latin-1"), max_num_fields=4)
    except ValueError:
        raise InvalidRequest("The sign-in form has too many fields.", "invalid_form") from None
    token = (form.get("token") or [""])[0]
    back = on_to((form.get("next") or [""])[0])
    snapshot = gateway_of(request).store.current
    authorization = b"Bearer " + token.encode("latin-1", "replace")
    role: Role | None = "admin" if is_admin(authorization, snapshot) else "finance" if holds_report_token(
        authorization, snapshot) else None
    if role is None:
        return _sign_in("That token does not open the reports.", 401, _lang_or_english(request))
    response = RedirectResponse(back, 303)
    start_session(request, response, snapshot, Principal(role))
    return response


async def logout(request: Request) -> Response:
    """End the caller's session; a cookie that holds none (forged, expired) is only cleared."""
    if not same_origin(request):
        raise NotPermitted("Sign out from this gateway's own page.", "cross_origin")
    snapshot = gateway_of(request).store.current
    secure = over_tls(request, snapshot.policy.server.trusted_proxies)
    await sessions_of(request).revoke(snapshot, request.cookies.get(session_cookie(secure)))
    response = RedirectResponse(on_to(request.query_params.get("next", "")), 303)
    response.delete_cookie(session_cookie(secure), path="/", secure=secure)
    return response


ROUTES = [Route("/reports", page, methods=["GET"]), Route("/reports/login", login, methods=["POST"]),
          Route("/reports/logout", logout, methods=["POST"])]


def _sign_in(message: str = "", status: int = 200, lang: str = "en", sso: bool = False) -> HTMLResponse:
    with words.speaking(lang):
        return HTMLResponse(finance_page.sign_in(message, sso), status)


def _lang_or_english(request: Request) -> str:
    """The language asked for (gateway.finance.words.choose), English when the ask is not one it speaks: the
    sign-in form is no place to refuse it."""
    try:
        return words.choose(request.query_params.get("lang"), request.headers.get("accept-language"))
    except InvalidRequest:
        return "en"
