"""The application: routes and lifespan. The completions endpoints are thin callers of gateway.pipeline."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway import pipeline
from gateway.auth import identify, token_matches
from gateway.batches.audit import CacheAuditor
from gateway.batches.runner import BatchRunner
from gateway.batches.store import open_batch_store
from gateway.context import RequestContext
from gateway.endpoints import BY_PATH, RETRIEVE, Endpoint
from gateway.errors import ClientGone, GatewayError, InvalidRequest, NotFound
from gateway.http import (
    admin,
    batch_api,
    console,
    errors,
    gpu_reports,
    keys_api,
    objects,
    reports,
    reports_page,
    sso,
    statements,
)
from gateway.http.asgi import AsgiSink, Receive, Scope, Send, departure, read_body, request_headers, until_disconnect
from gateway.http.guards import gateway_of, require_metrics_reader, tenant_of
from gateway.http.responses import json_response
from gateway.http.sessions import Sessions
from gateway.ledger import open_ledger
from gateway.policy.loader import PolicyStore
from gateway.runtime import Gateway
from gateway.state.replicas import ALONE, Share

log = logging.getLogger("tollgate.app")
# A client's X-Request-Id is kept if it is plain: it lands in logs, the ledger and its CSV, where a cell that
# starts with '-', '=', '+' or '@' is a spreadsheet formula.
_REQUEST_ID = re.compile(rb"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# A random per-process prefix and a counter: unique ids without a urandom syscall per request.
_ID_PREFIX = os.urandom(8).hex()
_id_counter = itertools.count()


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


class EndpointApp:
    """POST to one API (chat, completions, embeddings, responses) as a pure ASGI app (no buffering middleware)."""

    def __init__(self, gateway: Gateway, endpoint: Endpoint) -> None:
        self.gw = gateway
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        sink = AsgiSink(send)
        ctx = context(gw, scope, self.endpoint)
        async with pipeline.Lifecycle(gw, ctx, sink):
            headers = authenticate(gw, ctx, scope)
            raw = await read_body(receive, headers, ctx.snapshot.policy.server.max_body_bytes)
            asked = headers.get(b"x-tollgate-class")
            session = headers.get(b"x-session-id")
            if await until_disconnect(pipeline.run(gw, ctx, raw, sink, headers.get(b"cache-control", b""),
                                                   asked.decode("latin-1").strip().lower() if asked else None,
                                                   session.decode("latin-1")[:256] if session else None,
                                                   headers.get(b"x-tollgate-tags")),
                                      departure(scope)):
                raise ClientGone("The client disconnected.")


class Retrieve:
    """GET /v1/responses/{id} as a pure ASGI app (a route's endpoint): a request like the POSTs, in the lifecycle
    (counted, limited, leased, in the ledger), not a side door to the worker."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        sink = AsgiSink(send)
        ctx = context(gw, scope, RETRIEVE)
        async with pipeline.Lifecycle(gw, ctx, sink):
            authenticate(gw, ctx, scope)
            if await until_disconnect(pipeline.retrieve(gw, ctx, scope["path_params"]["response_id"], sink),
                                      departure(scope)):
                raise ClientGone("The client disconnected.")


def context(gw: Gateway, scope: Scope, endpoint: Endpoint) -> RequestContext:
    """A new request's context, under the client's X-Request-Id if it is a plain one."""
    rid = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
    return RequestContext(rid.decode() if _REQUEST_ID.match(rid) else new_request_id(), gw.store.current, endpoint)


def authenticate(gw: Gateway, ctx: RequestContext, scope: Scope) -> dict[bytes, bytes]:
    """The request's headers, once its trace is begun and its tenant known (raises NotAuthenticated: run it
    inside the lifecycle, which answers that)."""
    headers = request_headers(scope)
    if gw.tracer is not None:
        ctx.trace = gw.tracer.start(headers.get(b"traceparent"), headers.get(b"tracestate"))
    ctx.tenant, ctx.key_id = identify(headers.get(b"authorization"), ctx.snapshot)
    probe = headers.get(b"x-tollgate-probe")
    if probe is not None:  # only an operator's token marks a probe: a tenant cannot opt out of the anomaly rule
        server = ctx.snapshot.policy.server
        ctx.probe = any(token_matches(b"Bearer " + probe, expected) for expected in
                        (server.metrics_token_sha256, server.admin_token_sha256))
    return headers


async def models(request: Request) -> Response:
    snapshot = gateway_of(request).store.current
    tenant = tenant_of(request)
    data = [objects.model_object(name, snapshot) for name in snapshot.policy.models if tenant.may_use(name)]
    return json_response({"object": "list", "data": data})


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready while any model can be served; the models that cannot are named (and each answers its own 503)."""
    gw = gateway_of(request)
    reason = gw.unready()
    if reason:
        return json_response({"status": "unready", "reason": reason}, 503)
    return json_response({"status": "ready",
                          "unavailable_models": sorted(m for m, ok in gw.servable().items() if not ok)})


async def metrics(request: Request) -> Response:
    require_metrics_reader(request)
    gw = gateway_of(request)
    for pool in gw.upstreams.pools.values():
        pool.publish()
    gw.publish_health()
    return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def no_route(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405, in OpenAI's error shape."""
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return errors.response(InvalidRequest(f"{request.method} is not allowed here.", "bad_method"),
                               status=405)
    return errors.response(NotFound("No such route."))


def create_app(store: PolicyStore, data_dir: Path | None = None, share: Share = ALONE) -> HotPaths:
    """The gateway app. ``data_dir`` holds what must survive a restart (batch files and state, the SQLite ledger
    and its spool); without one the Batch API is not served and requests are not recorded in a ledger.
    ``share`` is this process's place among the gateway processes on this host (`tollgate serve --workers N`)."""
    policy = store.current.policy
    gw = Gateway(store, open_ledger(policy.ledger, policy.state, data_dir) if data_dir is not None else None,
                 data_dir, share)
    runner = (BatchRunner(gw, open_batch_store(data_dir, policy.state.postgres_dsn),
                          owner=f"{socket.gethostname()}:{data_dir.resolve()}:{share.index}")
              if data_dir is not None else None)

    sessions = Sessions(data_dir, gw.state)
    auditor = CacheAuditor(gw)

    # a reload of the policy file is audited once per host: by the first of this host's processes
    watcher = functools.partial(admin.audit_file_reload, gw.keys) if share.index == 0 else None

    @contextlib.asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[None]:
        async with gw.lifespan():
            if watcher is not None:
                store.file_watchers.append(watcher)
            await sessions.start()
            await auditor.start()
            try:
                if runner is None:
                    yield
                    return
                await runner.start()
                try:
                    yield
                finally:
                    await runner.close()
                    runner.store.close()
            finally:
                await auditor.close()
                if watcher is not None:
                    store.file_watchers.remove(watcher)

    endpoints = {path: EndpointApp(gw, endpoint) for path, endpoint in BY_PATH.items()}
    app = Starlette(
        routes=[
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in endpoints.items()),
            Route("/v1/models", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route(RETRIEVE.path, Retrieve(gw), methods=["GET"]),
            *objects.ROUTES,
            *admin.ROUTES,
            *keys_api.ROUTES,
            *reports.ROUTES,
            *gpu_reports.ROUTES,
            *statements.ROUTES,
            *reports_page.ROUTES,
            *console.ROUTES,
            *sso.ROUTES,
            *(batch_api.ROUTES if runner is not None else []),
        ],
        exception_handlers={GatewayError: errors.handle, 404: no_route, 405: no_route},
        lifespan=lifespan,
    )
    app.state.gateway = gw
    app.state.batches = runner
    app.state.sessions = sessions
    app.state.sso = sso.Provider()
    return HotPaths(app, endpoints, gw)


class HotPaths:
    """Send POSTs to the API endpoints (chat, completions, embeddings, responses) straight to their ASGI apps.

    Starlette's middleware stack wraps every `send`, which a stream calls once per chunk; profiled,
    that and its routing were ~15% of the gateway's CPU. Everything else goes through Starlette.
    """

    def __init__(self, app: Starlette, hot: dict[str, EndpointApp], gateway: Gateway) -> None:
        self.app = app
        self.hot = hot
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.hot.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)
