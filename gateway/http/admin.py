"""The admin API (/admin/*): policy apply and status, queues, cache purge, anomalies, scale. Every route needs
the admin token (the cost reports, which a finance token also reads, are in gateway.http.reports)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.cache.store import StoreUnavailable
from gateway.errors import Conflict, InvalidRequest, Unavailable
from gateway.http.asgi import read_body, request_headers
from gateway.http.guards import gateway_of, require_admin
from gateway.http.responses import json_response
from gateway.policy.loader import MAX_POLICY_BYTES, PolicyError
from gateway.spend.alerts import public


async def put_policy(request: Request) -> Response:
    require_admin(request)
    store = gateway_of(request).store
    raw = await read_body(request.receive, request_headers(request.scope), MAX_POLICY_BYTES)
    text = raw.decode("utf-8", errors="replace")
    try:
        changes = await store.apply_text(text)
    except PolicyError as exc:
        rejected = InvalidRequest("The policy was rejected; the running one stays.", "invalid_policy")
        rejected.details = [{"path": p, "message": m} for p, m in exc.errors]
        raise rejected from None
    return json_response({"status": "applied", "digest": store.current.digest, "diff": changes})


async def policy_status(request: Request) -> Response:
    require_admin(request)
    return json_response(gateway_of(request).store.status())


async def purge_cache(request: Request) -> Response:
    require_admin(request)
    gw = gateway_of(request)
    q = request.query_params
    repeated = sorted(k for k in set(q.keys()) if len(q.getlist(k)) > 1)
    if repeated:
        raise InvalidRequest(f"Give each selector once: {', '.join(repeated)} repeated.", "repeated_parameter")
    if gw.cache is None:
        raise Conflict("The cache is not enabled in the policy.", "cache_disabled")
    if not (q.get("tenant") or q.get("model") or q.get("id") or q.get("all") == "true"):
        raise InvalidRequest("Say what to purge: tenant=, model=, id= or all=true.", "missing_selector")
    try:
        purged = await gw.cache.purge(q.get("tenant"), q.get("model"), q.get("id"))
    except StoreUnavailable:
        raise Unavailable("The cache store is unreachable.", "cache_store_down") from None
    return json_response({"purged": purged})


async def cache_status(request: Request) -> Response:
    """The cache on this replica: its embedder, entries, and per audited scope its audits, disagreements, the
    upper confidence bound of its false-hit rate and the threshold it has earned (``?tenant=`` filters)."""
    require_admin(request)
    gw = gateway_of(request)
    if gw.cache is None:
        raise Conflict("The cache is not enabled in the policy.", "cache_disabled")
    spec = gw.store.current.policy.cache
    tenant = request.query_params.get("tenant")
    scopes = [s for s in gw.cache.audits.report(spec.audit, spec.threshold) if tenant is None or s["tenant"] == tenant]
    audited = sum(s["audited"] for s in scopes)
    wrong = sum(s["disagreed"] for s in scopes)
    return json_response({
        "embedder": gw.cache.embedder.name if gw.cache.embedder is not None else None,
        "entries": len(gw.cache.index) if gw.cache.index is not None else 0, "threshold": spec.threshold,
        "audit": {"enabled": spec.audit.enabled, "every": spec.audit.every, "pending": len(gw.cache.audits.pending),
                  "audited": audited, "disagreed": wrong,
                  "false_hit_rate": round(wrong / audited, 6) if audited else None,
                  "max_false_hit_rate": spec.audit.max_false_hit_rate},
        "scopes": scopes})


async def queues(request: Request) -> Response:
    """Per pool: its workers admitted for routing, requests started, drain rate, and per class the depth, oldest
    wait and depth by tenant; and the prompt blocks the prefix index places on each worker (what routing believes
    each engine caches). Per model: its pool and whether that pool can serve it now."""
    require_admin(request)
    gw = gateway_of(request)
    upstreams = gw.upstreams.pools
    pools = gw.scheduler.snapshot(upstreams)
    for name, view in pools.items():
        view["healthy_workers"] = upstreams[name].healthy_workers()
        footprint = upstreams[name].router.index.footprint
        view["prefix_blocks"] = {w.url: footprint[w.url] for w in upstreams[name].workers}
    policy = gw.store.current.policy
    models = {name: {"pool": policy.models[name].pool, "ready": ok} for name, ok in gw.servable().items()}
    return json_response({"mode": policy.scheduling.mode, "pools": pools, "models": models})


async def anomalies(request: Request) -> Response:
    """Recent alerts (cost anomalies, spend rate, budget thresholds), newest first; ?tenant= &kind= filter."""
    require_admin(request)
    q = request.query_params
    found = [public(a) for a in reversed(gateway_of(request).alerts.recent)
             if (not q.get("tenant") or a.get("tenant") == q["tenant"])
             and (not q.get("kind") or a["kind"] == q["kind"])]
    return json_response({"object": "list", "data": found})


async def scale(request: Request) -> Response:
    """Per pool: the desired worker count by the scaling rules, why, and the signals behind it."""
    require_admin(request)
    return json_response({"pools": gateway_of(request).autoscaler.last})


ROUTES = [
    Route("/admin/scale", scale, methods=["GET"]),
    Route("/admin/anomalies", anomalies, methods=["GET"]),
    Route("/admin/queues", queues, methods=["GET"]),
    Route("/admin/policy", put_policy, methods=["PUT"]),
    Route("/admin/policy/status", policy_status, methods=["GET"]),
    Route("/admin/cache", purge_cache, methods=["DELETE"]),
    Route("/admin/cache", cache_status, methods=["GET"]),
]
