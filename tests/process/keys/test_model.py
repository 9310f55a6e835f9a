"""A key's own limits beside its tenant's (tests/inprocess/keys/test_model.py) with the rate limiter counting in
Redis, this machine's."""

from __future__ import annotations

import pytest

from tests.conftest import REDIS_URL
from tests.inprocess.keys.test_model import (
    test_a_key_has_its_own_requests_per_minute_inside_its_tenants,
    test_a_key_limited_where_its_tenant_is_not_is_counted_alone,
)

__all__ = [  # collected here, on the limiter below
    "test_a_key_has_its_own_requests_per_minute_inside_its_tenants",
    "test_a_key_limited_where_its_tenant_is_not_is_counted_alone",
]


@pytest.fixture(params=[REDIS_URL], ids=["redis"])
def limiter(request: pytest.FixtureRequest) -> str:
    return str(request.param)
