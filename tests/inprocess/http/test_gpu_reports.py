"""The GPU report's parameters: groups, and a period that is always closed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from starlette.requests import Request

from gateway.errors import InvalidRequest
from gateway.http.gpu_reports import gpu_range, parse_groups


def request(query: str) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/admin/reports/gpu", "query_string": query.encode(),
                    "headers": []})


def test_the_period_defaults_to_this_month_so_far() -> None:
    now = datetime(2026, 11, 17, 9, 30, tzinfo=UTC).timestamp()
    assert gpu_range(request(""), now) == (datetime(2026, 11, 1, tzinfo=UTC).timestamp(), now)
    assert gpu_range(request("from=2026-10-01&to=2026-10-31"), now) == (
        datetime(2026, 10, 1, tzinfo=UTC).timestamp(), datetime(2026, 11, 1, tzinfo=UTC).timestamp())


@pytest.mark.parametrize("query", ["from=2026-11-30&to=2026-11-01", "from=2026-11-02T00:00:00Z&to=2026-11-01",
                                   "from=soon"])
def test_a_period_that_is_not_one_is_a_400(query: str) -> None:
    with pytest.raises(InvalidRequest):
        gpu_range(request(query), datetime(2026, 11, 17, tzinfo=UTC).timestamp())


def test_groups_are_named_once_each() -> None:
    assert parse_groups("tenant, worker") == ["tenant", "worker"]
    for bad in ("", "tenant,tenant", "day"):
        with pytest.raises(InvalidRequest):
            parse_groups(bad)
