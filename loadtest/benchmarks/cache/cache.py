"""Latency of the response cache (python -m loadtest run cache).

The gateway runs pinned to one core (CPU 1) with the cache on (memory store, real all-MiniLM-L6-v2);
a zero-delay simulated worker and this client share CPU 0.

1. hits: open loop at 50 req/s of exact hits, then of semantic hits (paraphrases of stored questions):
   end-to-end p50/p99 at the client.
2. miss cost: the same eligible, never-repeated questions through a cache-on and a cache-off gateway;
   and a non-eligible request (temperature above the cap) through both.
3. loop: p50/p99 of non-cacheable requests at 20 req/s alone, then while bursts of 100 concurrent
   eligible lookups run: if embedding blocked the event loop, the non-cacheable ones would wait too.
   Control: the same bursts made of non-cacheable requests, which is the cost of 100 requests at once.
   The gateway's own view (its Server-Timing ttft) is reported beside the client's, because the client
   and the worker share a core and bursts delay the client itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.harness.client import parse_server_timing
from loadtest.harness.fixtures import BENCH_KEY as KEY
from loadtest.harness.procs import start_gateway, start_sim
from loadtest.harness.questions import questions
from loadtest.harness.questions import rephrase as paraphrase
from loadtest.harness.stats import percentile


def policy(worker: str, cache: bool) -> dict[str, Any]:
    from gateway.auth import hash_key

    return {"tenants": {"bench": {"tier": "standard", "keys": ["sha256:" + hash_key(KEY)]}},
            "models": {"sim-llama-8b": {"pool": "p"}}, "pools": {"p": {"workers": [worker]}},
            "cache": {"enabled": cache, "max_entries_per_tenant": 100_000}}


async def ask(session: aiohttp.ClientSession, url: str, q: str, **extra: Any) -> tuple[float, str, float]:
    """(client-side seconds, X-Tollgate-Cache, the gateway's own total from Server-Timing in seconds)."""
    body = {"model": "sim-llama-8b", "messages": [{"role": "user", "content": q}], "max_tokens": 16, "temperature": 0,
            **extra}
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"authorization": f"Bearer {KEY}"}) as r:
        await r.read()
        assert r.status == 200, r.status
        gateway = parse_server_timing(r.headers.get("server-timing", "")).get("ttft", 0.0) / 1000
        return time.perf_counter() - started, r.headers.get("x-tollgate-cache", "").split(";", 1)[0], gateway


async def open_loop(session: aiohttp.ClientSession, url: str, items: list[str], rate: float,
                    **extra: Any) -> list[tuple[float, str, float]]:
    start = time.perf_counter()
    tasks = []
    for i, q in enumerate(items):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(ask(session, url, q, **extra)))
    return list(await asyncio.gather(*tasks))


def summary(rows: list[tuple[float, str, float]]) -> dict[str, Any]:
    values = [r[0] for r in rows]
    inside = [r[2] for r in rows]
    kinds: dict[str, int] = {}
    for _, k, _ in rows:
        kinds[k] = kinds.get(k, 0) + 1
    return {"n": len(values), "p50_ms": round(percentile(values, 50) * 1000, 2),
            "p99_ms": round(percentile(values, 99) * 1000, 2),
            "gateway_ttft_p50_ms": round(percentile(inside, 50) * 1000, 2),
            "gateway_ttft_p99_ms": round(percentile(inside, 99) * 1000, 2), "results": kinds}


async def run(on: str, off: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        stored = questions(n, 1)
        for q in stored:  # fill the cache (misses), then let background stores land
            await ask(session, on, q)
        await asyncio.sleep(1.0)
        out["exact_hits_50rps"] = summary(await open_loop(session, on, stored, 50))
        out["semantic_hits_50rps"] = summary(await open_loop(session, on, [paraphrase(q) for q in stored], 50))
        fresh = questions(n, 2)
        half = n // 2
        out["miss_cache_on"] = summary(await open_loop(session, on, fresh[:half], 20))
        out["miss_cache_off"] = summary(await open_loop(session, off, fresh[half:], 20))
        out["not_eligible_cache_on"] = summary(await open_loop(session, on, questions(half, 3), 20, temperature=1.5))
        out["not_eligible_cache_off"] = summary(await open_loop(session, off, questions(half, 4), 20,
                                                                temperature=1.5))
        out["loop_alone"] = summary(await open_loop(session, on, questions(100, 5), 20, temperature=1.5))

        async def bursts(seed: int, **extra: Any) -> None:
            for b in range(5):
                await asyncio.gather(*(ask(session, on, q, **extra) for q in questions(100, seed + b)))
                await asyncio.sleep(0.2)
        for name, seed, extra in (("loop_during_100_lookup_bursts", 100, {}),
                                  ("control_during_100_plain_bursts", 200, {"temperature": 1.5})):
            burst = asyncio.ensure_future(bursts(seed, **extra))
            out[name] = summary(await open_loop(session, on, questions(100, seed + 50), 20, temperature=1.5))
            await burst
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=400, help="questions per phase")
    parser.add_argument("--out", default="loadtest/results/cache/latency.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(Path(tmp), cpu=0)  # an engine's pace: a semantic hit is served if it beats the answer
        on = start_gateway(Path(tmp), policy(sim.url, True), cpu=1)
        off = start_gateway(Path(tmp), policy(sim.url, False), cpu=1)
        try:
            result = asyncio.run(run(on.url, off.url, args.n))
        finally:
            for p in (on, off, sim):
                p.kill()
    for k, v in result.items():
        print(k, json.dumps(v))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
