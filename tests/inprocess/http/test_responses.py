"""The Starlette routes' JSON responses: orjson's bytes, the status asked for, JSON's media type."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from gateway.http.responses import json_response


def test_json_is_orjsons_with_its_status_and_media_type() -> None:
    data = {"object": "list", "data": [{"id": "f1", "bytes": 3}], "at": datetime(2026, 1, 2, tzinfo=UTC)}
    made = json_response(data, 201)
    assert made.status_code == 201 and made.body == orjson.dumps(data)
    assert made.headers["content-type"] == "application/json"
    assert made.headers["content-length"] == str(len(made.body))
    assert orjson.loads(made.body)["at"] == "2026-01-02T00:00:00+00:00", "datetimes render as ISO 8601"

