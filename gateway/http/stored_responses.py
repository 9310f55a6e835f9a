"""GET /v1/responses/{id}: a stored Responses API answer, read from the worker that made it (vLLM keeps it in
that server's memory), and only by the tenant that made it."""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import NotFound, Unavailable, UpstreamFailed
from gateway.fleet.observe import describe
from gateway.http.guards import gateway_of, tenant_of
from gateway.http.responses import NOSNIFF
from gateway.upstream.errors import TRANSPORT_ERRORS


async def retrieve(request: Request) -> Response:
    tenant = tenant_of(request)
    gw = gateway_of(request)
    rid = request.path_params["response_id"]
    home = gw.responses.find(rid, tenant.name)
    if home is None:
        raise NotFound("No such response for this tenant.", "response_not_found")
    pool = gw.upstreams.pools.get(home.pool)
    if pool is None:
        raise Unavailable("The worker holding this response is not available now.", "previous_response_unavailable")
    try:
        reply = await pool.client.request(b"GET", home.worker, f"/v1/responses/{quote(rid, safe='')}")
        try:
            body, status = await reply.read(), reply.status
        finally:
            reply.release()
    except TRANSPORT_ERRORS as exc:
        raise UpstreamFailed("connect", describe(exc)) from None
    if status == 404:
        raise NotFound("The worker that made this response no longer holds it (it restarted).", "response_not_found")
    if status >= 400:
        raise UpstreamFailed("head", f"HTTP {status}")
    return Response(body, 200, media_type="application/json", headers=NOSNIFF)


ROUTES = [Route("/v1/responses/{response_id}", retrieve, methods=["GET"])]
