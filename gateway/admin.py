"""The admin API (/admin/*): policy apply and status, queues, cache purge, anomalies. Every route needs the admin
token (the cost reports, which a finance token also reads, are in gateway.reports)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.asgi import request_headers
from gateway.auth import is_admin
from gateway.cache.store import StoreUnavailable
from gateway.openai_api import ApiError
from gateway.policy.loader import PolicyError
from gateway.responses import api_error_response, error_response, json_response
from gateway.runtime import Gateway


def routes(gw: Gateway) -> list[Route]:
    store = gw.store

    def guard(request: Request) -> Response | None:
        snapshot = store.current
        if snapshot.policy.server.admin_token_sha256 is None:
            return error_response(403, "The admin API is disabled: set server.admin_token_sha256.", "admin_disabled")
        try:
            authorization = request_headers(request.scope).get(b"authorization")
        except ApiError as exc:
            return api_error_response(exc)
        if not is_admin(authorization, snapshot):
            return error_response(401, "A valid admin token is required.", "invalid_admin_token")
        return None

    async def put_policy(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        text = (await request.body()).decode("utf-8", errors="replace")
        try:
            changes = await store.apply_text(text)
        except PolicyError as exc:
            return json_response({"error": {"message": "The policy was rejected; the running one stays.",
                                            "type": "invalid_request_error", "param": None, "code": "invalid_policy",
                                            "details": [{"path": p, "message": m} for p, m in exc.errors]}}, 400)
        return json_response({"status": "applied", "digest": store.current.digest, "diff": changes})

    async def policy_status(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        return json_response(store.status())

    async def purge_cache(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        q = request.query_params
        repeated = sorted(k for k in set(q.keys()) if len(q.getlist(k)) > 1)
        if repeated:
            return error_response(400, f"Give each selector once: {', '.join(repeated)} repeated.",
                                  "repeated_parameter")
        if gw.cache is None:
            return error_response(409, "The cache is not enabled in the policy.", "cache_disabled")
        if not (q.get("tenant") or q.get("model") or q.get("id") or q.get("all") == "true"):
            return error_response(400, "Say what to purge: tenant=, model=, id= or all=true.", "missing_selector")
        try:
            purged = await gw.cache.purge(q.get("tenant"), q.get("model"), q.get("id"))
        except StoreUnavailable:
            return error_response(503, "The cache store is unreachable.", "cache_store_down", "server_error")
        return json_response({"purged": purged})

    async def queues(request: Request) -> Response:
        """Per pool: requests started, drain rate, and per class the depth, oldest wait and depth by tenant."""
        if (denied := guard(request)) is not None:
            return denied
        return json_response({"mode": store.current.policy.scheduling.mode, "pools": gw.scheduler.snapshot()})

    async def anomalies(request: Request) -> Response:
        """Recent alerts (cost anomalies, spend rate, budget thresholds), newest first; ?tenant= &kind= filter."""
        if (denied := guard(request)) is not None:
            return denied
        q = request.query_params
        found = [a for a in reversed(gw.alerts.recent) if (not q.get("tenant") or a.get("tenant") == q["tenant"])
                 and (not q.get("kind") or a["kind"] == q["kind"])]
        return json_response({"object": "list", "data": found})

    async def scale(request: Request) -> Response:
        """Per pool: the desired worker count by the scaling rules, why, and the signals behind it."""
        if (denied := guard(request)) is not None:
            return denied
        return json_response({"pools": gw.autoscaler.last})

    return [
        Route("/admin/scale", scale, methods=["GET"]),
        Route("/admin/anomalies", anomalies, methods=["GET"]),
        Route("/admin/queues", queues, methods=["GET"]),
        Route("/admin/policy", put_policy, methods=["PUT"]),
        Route("/admin/policy/status", policy_status, methods=["GET"]),
        Route("/admin/cache", purge_cache, methods=["DELETE"]),
    ]
