"""OpenAI's object routes answered from the gateway's own state: one model, and a response's deletion; a tenant
sees only its own, and what is not its own is answered as what does not exist."""

from __future__ import annotations

import asyncio

import httpx

from gateway.endpoints.responses import Home
from gateway.http.app import create_app
from gateway.http.objects import model_object
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from gateway.runtime import Gateway
from tests.conftest import DEMO_KEY, PREMIUM_KEY, policy_dict

STORE = PolicyStore(PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])), "test"))


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def app_and_client() -> tuple[Gateway, httpx.AsyncClient]:
    app = create_app(STORE)
    return app.app.state.gateway, httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                                     base_url="http://gateway")


def test_a_model_is_the_listed_object_and_one_not_the_tenants_is_unknown() -> None:
    async def main() -> None:
        _, client = app_and_client()
        async with client:
            listed = (await client.get("/v1/models", headers=bearer(DEMO_KEY))).json()["data"]
            assert listed == [model_object(name, STORE.current) for name in STORE.current.policy.models]
            for model in listed:
                one = await client.get(f"/v1/models/{model['id']}", headers=bearer(DEMO_KEY))
                assert one.status_code == 200 and one.json() == model
            for key, name in ((PREMIUM_KEY, "other-model"), (DEMO_KEY, "no-such-model")):
                refused = await client.get(f"/v1/models/{name}", headers=bearer(key))
                assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
                assert name in refused.json()["error"]["message"]
            assert (await client.get("/v1/models/sim-llama-8b")).status_code == 401
    asyncio.run(main())


def test_a_response_is_deleted_only_by_its_own_tenant_and_once() -> None:
    async def main() -> None:
        gw, client = app_and_client()
        gw.responses.remember(b'{"id":"resp_0123456789abcdef","object":"response"',
                              Home("demo", "main", "http://127.0.0.1:9"))
        path = "/v1/responses/resp_0123456789abcdef"
        async with client:
            other = await client.delete(path, headers=bearer(PREMIUM_KEY))
            assert other.status_code == 404 and other.json()["error"]["code"] == "response_not_found"
            deleted = await client.delete(path, headers=bearer(DEMO_KEY))
            assert deleted.status_code == 200
            assert deleted.json() == {"id": "resp_0123456789abcdef", "object": "response", "deleted": True}
            assert gw.responses.find("resp_0123456789abcdef", "demo") is None
            again = await client.delete(path, headers=bearer(DEMO_KEY))
            assert again.status_code == 404
    asyncio.run(main())
