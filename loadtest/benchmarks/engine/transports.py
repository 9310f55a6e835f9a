"""Client CPU per request and per stream of the upstream transports we could use
(python -m loadtest run transports).

The gateway's upstream client must stay near nginx's cost, so its transport is chosen by this
measurement: the gateway's own (gateway.transport.http1, on httptools), pyreqwest (Rust: reqwest/hyper on its
own tokio thread), aiosonic, aiohttp, httpx on its default httpcore pool, and httpx on the aiohttp transport,
each against a zero-delay simulated worker on the other core, at concurrency 1/16/64; ``--stream`` reads
64-token SSE answers chunk by chunk instead. CPU is this process's own, every thread of it
(time.process_time: pyreqwest's tokio threads count), so the worker's share is excluded.
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
import aiosonic
import httpx
import orjson
import uvloop
from httpx_aiohttp import AiohttpTransport
from pyreqwest.client import ClientBuilder

from gateway.transport import http1
from loadtest.harness.procs import start_sim

BODIES = {
    False: orjson.dumps({"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hello there"}],
                         "max_tokens": 4}),
    True: orjson.dumps({"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hello there"}],
                        "max_tokens": 64, "stream": True}),
}
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


async def measure(url: str, concurrency: int, requests: int, stream: bool) -> dict[str, float]:
    """CPU ms per request (or per stream, read chunk by chunk) for each client at one concurrency."""
    out = {}
    body = BODIES[stream]
    base, path = url.rsplit("/v1/", 1)[0], "/v1/" + url.rsplit("/v1/", 1)[1]

    own = http1.Client(256, 30.0, 5.0, 30.0)

    async def tollgate() -> None:
        r = await own.request(b"POST", base, path, body, [(b"content-type", b"application/json")])
        while await r.readany():
            pass
        assert r.status == 200
        r.release()
    out["tollgate http1 (httptools)"] = await drive(tollgate, concurrency, requests)
    own.close()

    async with ClientBuilder().http1_only().pool_max_idle_per_host(256).build() as reqwest:
        async def via_reqwest() -> None:
            async with reqwest.post(url).body_bytes(body).headers(HEADERS).build_streamed() as r:
                reader = r.body_reader
                while await reader.read_chunk() is not None:
                    pass
                assert r.status == 200
        out["pyreqwest"] = await drive(via_reqwest, concurrency, requests)

    sonic = aiosonic.HTTPClient(aiosonic.TCPConnector(pool_configs={":default": {"size": 256}}))

    async def via_sonic() -> None:
        r = await sonic.post(url, data=body, headers=HEADERS)
        if stream:
            async for _ in r.read_chunks():
                pass
        else:
            await r.content()
        assert r.status_code == 200
    out["aiosonic"] = await drive(via_sonic, concurrency, requests)
    await sonic.aclose()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as raw:
        async def direct() -> None:
            async with raw.post(url, data=body, headers=HEADERS) as r:
                async for _ in r.content.iter_any():
                    pass
                r.raise_for_status()
        out["aiohttp"] = await drive(direct, concurrency, requests)

    if not stream:  # httpx's two pools: measured before, far behind on plain requests already
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(limits=limits) as client:
            async def plain() -> None:
                r = await client.post(url, content=body, headers=HEADERS)
                r.raise_for_status()
            out["httpx (httpcore)"] = await drive(plain, concurrency, requests)

        def session() -> aiohttp.ClientSession:
            return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        async with httpx.AsyncClient(transport=AiohttpTransport(client=session)) as client:
            async def via_aiohttp() -> None:
                r = await client.post(url, content=body, headers=HEADERS)
                r.raise_for_status()
            out["httpx + aiohttp transport"] = await drive(via_aiohttp, concurrency, requests)
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--stream", action="store_true", help="64-token SSE answers, read chunk by chunk")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--out", default=None, help="default: loadtest/results/engine/transports[-stream].json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(Path(tmp), "--zero-delay", cpu=0)
        try:
            for c in (int(n) for n in args.concurrency.split(",")):
                results[f"c={c}"] = uvloop.run(measure(sim.url + "/v1/chat/completions", c, args.requests,
                                                       args.stream))
                print(f"c={c}", json.dumps(results[f"c={c}"]), flush=True)
        finally:
            sim.kill()
    out = Path(args.out or f"loadtest/results/engine/transports{'-stream' if args.stream else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
