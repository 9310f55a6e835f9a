"""Client CPU per request of the upstream transports we could use (python -m loadtest.bench_transports).

The gateway's upstream client must stay near nginx's cost, so its transport is chosen by this
measurement: httpx on its default httpcore pool, httpx on the aiohttp transport (httpx-aiohttp), and
aiohttp directly, each against a zero-delay simulated worker on the other core, at concurrency 1/16/64.
CPU is this process's own (time.process_time), so the worker's share is excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import orjson
import uvloop
from httpx_aiohttp import AiohttpTransport

from loadtest.procs import start_sim

BODY = orjson.dumps({"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hello there"}],
                     "max_tokens": 4})
HEADERS = {"content-type": "application/json"}


async def drive(call: Callable[[], Awaitable[None]], concurrency: int, requests: int) -> float:
    """CPU milliseconds per request for `requests` calls at `concurrency`."""
    remaining = requests

    async def user() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()
    for _ in range(50):
        await call()  # warm up: connections open, caches filled
    cpu0 = time.process_time()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return (time.process_time() - cpu0) / requests * 1000


async def measure(url: str, concurrency: int, requests: int) -> dict[str, float]:
    out = {}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        async def plain() -> None:
            r = await client.post(url, content=BODY, headers=HEADERS)
            r.raise_for_status()
        out["httpx (httpcore)"] = await drive(plain, concurrency, requests)

    def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
    async with httpx.AsyncClient(transport=AiohttpTransport(client=session)) as client:
        async def via_aiohttp() -> None:
            r = await client.post(url, content=BODY, headers=HEADERS)
            r.raise_for_status()
        out["httpx + aiohttp transport"] = await drive(via_aiohttp, concurrency, requests)
    async with session() as raw:
        async def direct() -> None:
            async with raw.post(url, data=BODY, headers=HEADERS) as r:
                await r.read()
                r.raise_for_status()
        out["aiohttp"] = await drive(direct, concurrency, requests)
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--out", default="loadtest/results/transports.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(Path(tmp), "--zero-delay", cpu=0)
        try:
            for c in (1, 16, 64):
                results[f"c={c}"] = uvloop.run(measure(sim.url + "/v1/chat/completions", c, args.requests))
                print(f"c={c}", json.dumps(results[f"c={c}"]), flush=True)
        finally:
            sim.kill()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
