"""`tollgate serve --workers N`'s parts that run in this process: which policies N processes could not keep right,
and the socket each process binds the one port with. (The supervisor itself starts processes: it is
tests/process/test_workers.py's, not this layer's.)"""

from __future__ import annotations

import errno
import socket

import pytest

from gateway.policy.schema import Policy
from gateway.processes import reuse_port_socket, sharing_problems
from tests.conftest import policy_dict


def policy(redis: bool = False, **limits: dict[str, object]) -> Policy:
    """The test policy, each named tenant given a limit ({"budget": ...} or {"rate_limit": ...})."""
    data = policy_dict(["http://127.0.0.1:9"])
    for name, limit in limits.items():
        data["tenants"][name].update(limit)
    if redis:
        data["state"] = {"redis_url": "redis://shared-state:6379/0"}  # read, never dialled
    return Policy.model_validate(data)


def test_limits_counted_in_each_process_are_refused_for_several_processes() -> None:
    limited = policy(prem={"rate_limit": {"requests_per_minute": 10}},
                     demo={"budget": {"period": "day", "limit_usd": 5.0}})
    problems = sharing_problems(limited)
    assert len(problems) == 1 and "tenants demo, prem have budgets or rate limits" in problems[0]
    assert "state.redis_url" in problems[0]


def test_limits_shared_through_redis_or_no_limits_at_all_are_fine() -> None:
    assert sharing_problems(policy(redis=True, demo={"budget": {"limit_usd": 5.0}})) == []
    assert sharing_problems(policy()) == []


def test_every_process_binds_the_same_port_and_a_plain_socket_cannot() -> None:
    first = reuse_port_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = reuse_port_socket("127.0.0.1", port)
    try:
        assert second.getsockname()[1] == port and second.get_inheritable(), "handed to the process it serves"
        with socket.socket() as plain, pytest.raises(OSError) as caught:
            plain.bind(("127.0.0.1", port))
        assert caught.value.errno == errno.EADDRINUSE
    finally:
        first.close()
        second.close()


def test_an_ipv6_host_gets_an_ipv6_socket() -> None:
    with reuse_port_socket("::1", 0) as sock:  # the suite runs nothing skipped: CI's machine has ::1
        assert sock.family == socket.AF_INET6
