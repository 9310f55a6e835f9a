"""Outcomes as Starlette responses: the status, headers and OpenAI error body gateway.outcomes renders, with
Starlette's own 405 kept when it overrides the status."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from starlette.requests import Request

from gateway import errors
from gateway.http.errors import handle, response
from gateway.outcomes import render


def test_a_response_carries_what_the_outcome_renders() -> None:
    outcome = errors.RateLimited("Slow down.", retry_after_s=2.5)
    status, headers, body = render(outcome)
    made = response(outcome)
    assert status == made.status_code == 429 and made.body == body
    assert made.headers["retry-after"] == "3" and made.headers["content-type"] == "application/json"
    assert orjson.loads(made.body)["error"]["code"] == "rate_limit_exceeded"
    assert {k.decode() for k, _ in headers} <= set(made.headers)


def test_a_status_given_overrides_the_usual_one_and_nothing_else() -> None:
    made = response(errors.InvalidRequest("GET is not allowed here.", "bad_method"), status=405)
    assert made.status_code == 405 and orjson.loads(made.body)["error"]["code"] == "bad_method"


def test_the_handler_answers_a_gateway_error_and_refuses_anything_else() -> None:
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": []})
    made = asyncio.run(handle(request, errors.NotFound("No such route.")))
    assert made.status_code == 404 and orjson.loads(made.body)["error"]["type"] == "invalid_request_error"
    with pytest.raises(AssertionError):
        asyncio.run(handle(request, ValueError("a bug is Starlette's 500, not an outcome")))
