"""OpenAI's object routes the gateway answers from its own state, with no worker: one model (GET
/v1/models/{id}) and the deletion of a response (DELETE /v1/responses/{id}).

A tenant sees only what is its own: a model it may not use, and another tenant's response, are answered as
unknown ones are (404), so neither says that it exists.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.endpoints.checks import echo
from gateway.errors import NotFound
from gateway.http.guards import gateway_of, tenant_of
from gateway.http.responses import json_response
from gateway.policy.loader import PolicySnapshot


def model_object(name: str, snapshot: PolicySnapshot) -> dict[str, Any]:
    """A model of the policy as OpenAI's model object (GET /v1/models lists the same)."""
    return {"id": name, "object": "model", "created": int(snapshot.loaded_at), "owned_by": "tollgate"}


async def model(request: Request) -> Response:
    snapshot = gateway_of(request).store.current
    tenant = tenant_of(request)
    name = request.path_params["model_id"]
    if name not in snapshot.policy.models or not tenant.may_use(name):
        raise NotFound(f"The model '{echo(name)}' does not exist or you do not have access to it.",
                       "model_not_found")
    return json_response(model_object(name, snapshot))


async def delete_response(request: Request) -> Response:
    """Forget a response of the caller's tenant (gateway.endpoints.responses: the worker keeps its copy, which
    the gateway never relays again)."""
    tenant = tenant_of(request)
    rid = request.path_params["response_id"]
    if not gateway_of(request).responses.forget(rid, tenant.name):
        raise NotFound("No such response for this tenant.", "response_not_found")
    return json_response({"id": rid, "object": "response", "deleted": True})


ROUTES = [
    Route("/v1/models/{model_id:path}", model, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
]
