"""Runtime API keys over the admin API (admin token; `tollgate keys ...` calls these):

- ``POST /admin/keys`` {tenant, name, expires_at | expires_in_s, budget, rate_limit, models}: a new key, shown
  once in the answer (``key``) and stored only as its sha256;
- ``GET /admin/keys`` (?tenant=; paged by ?limit= and ?after=) and ``GET /admin/keys/{id}``: what a key is and its
  status, never the key;
- ``POST /admin/keys/{id}/revoke``: refused from now on, on every replica within a poll (gateway.keys.service);
- ``POST /admin/keys/{id}/rotate`` {grace_s}: a new key like it; the old one works ``grace_s`` more (24 h);
- ``PATCH /admin/keys/{id}`` {expires_at | expires_in_s}: when the key stops working (null: never).

Each operation is in the audit log, written in the transaction that makes the change.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import InvalidRequest
from gateway.http.admin import client_address
from gateway.http.asgi import read_body, request_headers
from gateway.http.guards import gateway_of, require_admin
from gateway.http.responses import json_response
from gateway.keys.model import DEFAULT_GRACE_S, MAX_GRACE_S, KeySpec, Moment, timestamp
from gateway.keys.service import KeyService

MAX_BODY_BYTES = 64 * 1024
DEFAULT_PAGE, MAX_PAGE = 100, 1000


class Rotation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    grace_s: float = Field(DEFAULT_GRACE_S, ge=0, le=MAX_GRACE_S, description="how long the old key still works")


class Expiry(BaseModel):
    """One of the two: a moment (or null: never), or seconds from now (0: now)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expires_at: Moment | None = Field(None, description="ISO 8601 (UTC without an offset) or a Unix time")
    expires_in_s: float | None = Field(None, ge=0, le=10 * 365 * 86400)

    def moment(self, now: float) -> float | None:
        if "expires_in_s" in self.model_fields_set:
            assert self.expires_in_s is not None
            return now + self.expires_in_s
        return timestamp(self.expires_at) if self.expires_at is not None else None


def keys_of(request: Request) -> KeyService:
    return gateway_of(request).keys


async def body_of(request: Request) -> dict[str, Any]:
    """The JSON object the request carries ({} for none)."""
    raw = await read_body(request.receive, request_headers(request.scope), MAX_BODY_BYTES)
    if not raw.strip():
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The body is not valid JSON.", "invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The body must be a JSON object.", "invalid_json")
    return data


def parsed(model: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [(".".join(str(p) for p in e["loc"]) or "<root>", e["msg"]) for e in exc.errors()]
        error = InvalidRequest("; ".join(f"{p}: {m}" for p, m in problems), "invalid_key_spec", param=problems[0][0])
        error.details = [{"path": p, "message": m} for p, m in problems]
        raise error from None


async def create_key(request: Request) -> Response:
    actor = await require_admin(request)
    spec = parsed(KeySpec, await body_of(request))
    record, key = await keys_of(request).create(gateway_of(request).store.current, spec, actor,
                                                client_address(request))
    return json_response({**record.public(time.time()), "key": key}, 201)


async def list_keys(request: Request) -> Response:
    """A page of keys, newest first (``limit``, 100 unless given, at most 1,000; ``after``: the last id of the
    page before), as OpenAI's lists page: ``has_more``, ``first_id``, ``last_id``."""
    await require_admin(request)
    params = request.query_params
    raw = params.get("limit", str(DEFAULT_PAGE))
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise InvalidRequest(f"limit: a whole number from 1 to {MAX_PAGE}.", "invalid_value", param="limit")
    page, more = keys_of(request).page(params.get("tenant"), params.get("after"), int(raw))
    now = time.time()
    return json_response({"object": "list", "data": [r.public(now) for r in page], "has_more": more,
                          "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None})


async def get_key(request: Request) -> Response:
    await require_admin(request)
    return json_response(keys_of(request).get(request.path_params["key_id"]).public(time.time()))


async def revoke_key(request: Request) -> Response:
    actor = await require_admin(request)
    await body_of(request)
    record = await keys_of(request).revoke(request.path_params["key_id"], actor, client_address(request))
    return json_response(record.public(time.time()))


async def rotate_key(request: Request) -> Response:
    actor = await require_admin(request)
    rotation = parsed(Rotation, await body_of(request))
    new, key, old = await keys_of(request).rotate(gateway_of(request).store.current, request.path_params["key_id"],
                                                  rotation.grace_s, actor, client_address(request))
    now = time.time()
    return json_response({**new.public(now), "key": key, "previous": old.public(now)}, 201)


async def expire_key(request: Request) -> Response:
    actor = await require_admin(request)
    expiry: Expiry = parsed(Expiry, await body_of(request))
    given = expiry.model_fields_set
    if len(given) != 1 or ("expires_in_s" in given and expiry.expires_in_s is None):
        raise InvalidRequest("Give expires_at (a time, or null for never) or expires_in_s (seconds from now).",
                             "invalid_key_spec", param="expires_at")
    at = expiry.moment(time.time())
    record = await keys_of(request).expire(request.path_params["key_id"], at, actor, client_address(request))
    return json_response(record.public(time.time()))


ROUTES = [
    Route("/admin/keys", create_key, methods=["POST"]),
    Route("/admin/keys", list_keys, methods=["GET"]),
    Route("/admin/keys/{key_id}", get_key, methods=["GET"]),
    Route("/admin/keys/{key_id}", expire_key, methods=["PATCH"]),
    Route("/admin/keys/{key_id}/revoke", revoke_key, methods=["POST"]),
    Route("/admin/keys/{key_id}/rotate", rotate_key, methods=["POST"]),
]
