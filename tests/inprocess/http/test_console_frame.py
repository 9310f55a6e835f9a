"""The console's frame in-process: a sign-in form for a browser with no session, single sign-on offered when it is
configured; for a session, the frame naming its role (the script shows that role's tabs; the routes decide) under
a policy that allows only this site's own script; the script itself served as JavaScript."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from gateway.http import console
from gateway.http.app import create_app
from gateway.http.sessions import COOKIE, Principal
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import policy_dict

pytestmark = pytest.mark.inprocess


def test_the_frame_for_each_role_and_none() -> None:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["server"]["sso"] = {"issuer": "https://id.example.com", "client_id": "c",
                               "roles": {"tenants": {"team": "demo"}}}
    store = PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test"))
    app = create_app(store)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            sessions = app.app.state.sessions
            bare = await client.get("/console")
            assert bare.status_code == 200 and 'name="token"' in bare.text
            assert 'name="next" value="/console"' in bare.text, "a token sign-in comes back here"
            assert 'href="/auth/sso/login?next=/console"' in bare.text, "single sign-on is offered"
            korean = await client.get("/console", headers={"accept-language": "ko-KR,ko;q=0.9"})
            assert '<html lang="ko">' in korean.text and "SSO로 로그인" in korean.text
            for principal, role in ((Principal("admin"), "admin"), (Principal("finance"), "finance"),
                                    (Principal("tenant", "demo", "carol <x>"), "tenant")):
                cookie = sessions.issue(store.current, principal)
                frame = await client.get("/console", headers={"cookie": f"{COOKIE}={cookie}"})
                assert f'data-role="{role}"' in frame.text
                assert "script-src 'self'" in frame.headers["content-security-policy"]
                assert not re.search(r"<script>", frame.text), "no inline script"
                assert "<x>" not in frame.text, "a person's name is escaped"
            script = await client.get(f"/console/{console.SCRIPT}")
            assert script.headers["content-type"].startswith("text/javascript") and b"textContent" in script.content
    asyncio.run(main())
