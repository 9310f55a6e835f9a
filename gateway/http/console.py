"""The console (GET /console): a page for admins (keys, tenants, the policy with its history and rollback,
queues, the cache, the audit log, alerts), finance (each tenant's spend, and the finance page) and a tenant's
users (their own usage), in English or Korean (``?lang=`` or ``Accept-Language``).

The page is a frame and one script (``static/console.js``) that calls the gateway's own JSON API, the routes
automation calls, with the session cookie a sign-in set (gateway.http.guards): the console is no second way
into the house, and what a role may do is what those routes let it. Sign-in is by single sign-on when
``server.sso`` is set (gateway.http.sso), or with the admin or finance token (the finance page's sign-in). The
frame names the role so the script shows that role's tabs; the routes decide, not the frame.

The frame's Content-Security-Policy allows this site's own script and nothing inline: nothing the API answers
is read as HTML.
"""

from __future__ import annotations

import html
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from gateway.errors import InvalidRequest
from gateway.finance import words
from gateway.http.guards import gateway_of, signed_in

STATIC = Path(__file__).parent / "static"
SCRIPT = "console.js"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "frame-ancestors 'none'; form-action 'self'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "cache-control": "no-store",
           "referrer-policy": "same-origin"}
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI","Noto Sans KR","Apple SD Gothic Neo","Malgun Gothic",
"NanumGothic",sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{display:flex;gap:1em;align-items:center;padding:.6em 1.2em;background:#1d2430;color:#fff}
header b{font-size:1.1em}header nav{display:flex;gap:.3em;flex:1}header a{color:#cfe0ff}
header nav button{background:none;border:0;color:#cfe0ff;padding:.4em .7em;cursor:pointer;font:inherit}
header nav button.active{background:#3b6ea5;color:#fff;border-radius:4px}header nav a{padding:.4em .7em}
header form{margin:0}main{padding:1em 1.5em}
table{border-collapse:collapse;background:#fff;margin:.5em 0}th,td{border:1px solid #dde1e7;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.changes td,table.changes th{font-size:.9em}td.old{color:#a33}td.new{color:#276b3a}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:.8em 1em;margin:.5em 0;
display:flex;flex-wrap:wrap;gap:.8em;align-items:flex-end}.card h2{width:100%;margin:0;font-size:1.05em}
.card.ok{display:block;border-color:#4f9d69}label{display:flex;flex-direction:column;font-size:.85em;gap:.2em}
input,select,button{font:inherit;padding:.3em .5em}button.link{background:none;border:0;color:#3b6ea5;
text-decoration:underline;cursor:pointer;padding:0}
.editor{display:flex;font-family:ui-monospace,"D2Coding","NanumGothicCoding",monospace;font-size:13px}
.editor textarea{flex:1;font:inherit;line-height:1.4;border:1px solid #c5ccd6;padding:.3em;white-space:pre;
overflow:auto;height:32em}.editor .gutter{margin:0;padding:.3em .4em;line-height:1.4;text-align:right;
color:#8a94a3;background:#eef1f5;border:1px solid #c5ccd6;border-right:0;overflow:hidden;height:32em}
#notice.error,.error{color:#a33}#notice.ok,.ok{color:#276b3a}.muted{color:#6b7584}
.status-revoked,.status-expired{color:#a33}.status-active{color:#276b3a}
.sign-in{max-width:28em;margin:4em auto;background:#fff;padding:1.5em 2em;border:1px solid #dde1e7;border-radius:8px}
.sign-in a.sso{display:inline-block;background:#3b6ea5;color:#fff;padding:.5em 1em;border-radius:4px;
text-decoration:none}
"""
WORDS = {
    "en": {"title": "Tollgate console", "sign_in": "Sign in", "sso": "Sign in with single sign-on",
           "token": "Or with the admin or finance token", "out": "Sign out", "as": "Signed in as"},
    "ko": {"title": "Tollgate 콘솔", "sign_in": "로그인", "sso": "SSO로 로그인", "token": "또는 관리자·재무 토큰으로",
           "out": "로그아웃", "as": "로그인:"},
}


async def console(request: Request) -> Response:
    snapshot = gateway_of(request).store.current
    lang = _lang(request)
    say = WORDS[lang]
    principal = await signed_in(request, snapshot)
    if principal is None:
        sso = (f'<p><a class="sso" data-testid="sso" href="/auth/sso/login?next=/console">{say["sso"]}</a></p>'
               if snapshot.policy.server.sso is not None else "")
        body = (f'<div class="sign-in"><h1>{say["title"]}</h1>{sso}<form method="post" action="/reports/login">'
                f'<input type="hidden" name="next" value="/console"><label>{say["token"]}<input type="password" '
                f'name="token" data-testid="token" autocomplete="off"></label> <button type="submit">'
                f'{say["sign_in"]}</button></form></div>')
        return _frame(lang, say["title"], body, {})
    who = principal.who or principal.actor(snapshot)
    role = principal.role if principal.tenant is None else f"{principal.role} {principal.tenant}"
    body = (f'<header><b>Tollgate</b><nav id="tabs"></nav><span data-testid="who">{say["as"]} '
            f'{html.escape(who)} ({html.escape(role)})</span><form method="post" '
            f'action="/reports/logout?next=/console"><button type="submit" data-testid="sign-out">{say["out"]}'
            f'</button></form></header><p id="notice" role="status"></p><main id="main"></main>'
            f'<script src="/console/{SCRIPT}"></script>')
    return _frame(lang, say["title"], body, {"role": principal.role, "tenant": principal.tenant or "",
                                             "lang": lang})


_SCRIPT_BYTES = (STATIC / SCRIPT).read_bytes()


async def script(request: Request) -> Response:
    return Response(_SCRIPT_BYTES, media_type="text/javascript; charset=utf-8",
                    headers={"x-content-type-options": "nosniff", "cache-control": "no-cache"})


def _frame(lang: str, title: str, body: str, data: dict[str, str]) -> HTMLResponse:
    attrs = "".join(f' data-{k}="{html.escape(v)}"' for k, v in data.items())
    return HTMLResponse(f'<!doctype html><html lang="{lang}"><head><meta charset="utf-8"><meta name="viewport" '
                        f'content="width=device-width,initial-scale=1"><title>{title}</title><style>{STYLE}</style>'
                        f'</head><body{attrs}>{body}</body></html>', headers=HEADERS)


def _lang(request: Request) -> str:
    try:
        return words.choose(request.query_params.get("lang"), request.headers.get("accept-language"))
    except InvalidRequest:
        return "en"


ROUTES = [Route("/console", console, methods=["GET"]), Route(f"/console/{SCRIPT}", script, methods=["GET"])]
