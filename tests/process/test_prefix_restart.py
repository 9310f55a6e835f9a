"""Where the gateway thinks a prefix lives follows what the engines say: a worker that restarted holds nothing."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, Proc, metric_value, policy_dict, wait_for

SYSTEM = "You answer questions about the quarterly billing report, in short plain sentences. " * 12


def _route(gateway: Proc, question: str) -> str:
    """The routing choice the gateway reports for one chat with the shared system prompt."""
    body = {"model": "sim-llama-8b", "max_tokens": 4,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30,
                       headers={"authorization": f"Bearer {DEMO_KEY}"})
    assert reply.status_code == 200, reply.text
    found = re.search(r'route;desc="([^"]*)"', reply.headers["server-timing"])
    assert found is not None, reply.headers["server-timing"]
    return found.group(1)


def _blocks(gateway: Proc) -> dict[str, int]:
    """The prompt blocks the gateway's prefix index places on each worker (GET /admin/queues)."""
    view = httpx.get(gateway.url + "/admin/queues", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5)
    return view.json()["pools"]["main"]["prefix_blocks"]


def test_a_worker_that_restarted_is_not_thought_to_hold_its_old_prefixes(
        start_sim: Callable[..., Proc], start_gateway: Callable[..., Proc]) -> None:
    """vLLM's prefix_cache_queries counter going back says the engine restarted, with an empty cache: the
    gateway forgets the prefixes it sent there, so a known prompt is placed afresh instead of being sent to a
    worker for a cache it no longer has (and held there under the load bound)."""
    sims = [start_sim(), start_sim()]
    gateway = start_gateway(policy_dict([s.url for s in sims]))
    assert not _route(gateway, "What was billed in May?").startswith("prefix")
    for i in range(3):
        assert _route(gateway, f"And in month {i}?").startswith("prefix "), "the prompt stays where it is cached"
    home = max(sims, key=lambda s: metric_value(s.url, "vllm:request_success_total"))
    home.kill()
    assert wait_for(lambda: metric_value(gateway.url, "tollgate_worker_healthy", worker=home.url) == 0)
    assert _blocks(gateway)[home.url] > 0, "while it is down, what it held is kept (it may come back as it was)"
    start_sim(port=home.port)
    assert wait_for(lambda: metric_value(gateway.url, "tollgate_worker_healthy", worker=home.url) == 1)
    assert wait_for(lambda: _blocks(gateway)[home.url] == 0), "its counters went back: the index forgot it"
    assert not _route(gateway, "And in June?").startswith("prefix"), "placed afresh, not sent for a lost cache"
    assert _route(gateway, "And in July?").startswith("prefix "), "and remembered again where it went"
