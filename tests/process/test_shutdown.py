"""SIGTERM (a Kubernetes rolling update): answers in flight finish, new connections are refused, and the
process exits within the policy's grace period."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Callable

import aiohttp
import httpx

from tests.conftest import DEMO_KEY, Proc, policy_dict, wait_for

Starter = Callable[..., Proc]


async def stream_all(url: str, n: int, started: asyncio.Semaphore) -> list[str]:
    """``n`` streams at once; each releases ``started`` when its first bytes arrive."""
    body = {"model": "sim-llama-8b", "messages": [{"role": "user", "content": "count"}], "max_tokens": 64,
            "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession(headers={"authorization": f"Bearer {DEMO_KEY}"}) as session:
        async def one() -> str:
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
                first = await response.content.readany()
                started.release()
                return (first + await response.read()).decode()
        return await asyncio.gather(*(one() for _ in range(n)))


def refuses_connections(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return True
    return False


def test_sigterm_lets_50_streams_finish_and_refuses_new_connections(start_sim: Starter,
                                                                     start_gateway: Starter) -> None:
    sim = start_sim("--decode-base-ms", "40")  # 64 tokens: ~2.6 s a stream
    policy = policy_dict([sim.url])
    policy["server"]["shutdown_grace_s"] = 15
    # 50 streams at once on a fresh gateway: the worker's learned limit doubles from 8 each scrape, so some
    # wait a second or so for it; this test is about draining, so let them wait instead of being shed
    policy["scheduling"] = {"tiers": {"standard": {"max_queue_wait_ms": 10_000}}}
    gw = start_gateway(policy)
    host, port = "127.0.0.1", gw.port

    async def scenario() -> tuple[list[str], float, bool]:
        started = asyncio.Semaphore(0)
        streams = asyncio.ensure_future(stream_all(gw.url, 50, started))
        for _ in range(50):  # every stream has its first tokens
            await asyncio.wait_for(started.acquire(), timeout=30)
        assert not refuses_connections(host, port), "the control: the gateway takes connections before SIGTERM"
        signalled = time.monotonic()
        gw.process.send_signal(signal.SIGTERM)
        refused = await asyncio.to_thread(wait_for, lambda: refuses_connections(host, port), 10.0)
        assert not streams.done(), "the listener closed while the streams were still running"
        results = await streams
        return results, signalled, refused
    results, signalled, refused = asyncio.run(scenario())
    assert refused, "no new connections once draining"
    assert len(results) == 50
    for text in results:
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text
        assert text.count('"content":') >= 64
    gw.process.wait(timeout=20)
    assert time.monotonic() - signalled < 15, "exited within the grace period"
    assert gw.process.returncode in (0, -signal.SIGTERM), "a clean exit (uvicorn re-raises the signal it drained on)"
    assert httpx.get(sim.url + "/health").status_code == 200
