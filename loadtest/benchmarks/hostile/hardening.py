"""Hostile clients and bursts against the gateway (python -m loadtest run hardening).

1. hostile: legitimate chats (closed loop, c=8, 40 tokens, a worker at 10 ms a step) alone, then while 500
   idle connections and 100 slow-header clients (one header byte every 0.5 s, reconnecting when refused)
   hold sockets open. Reported: the legitimate p50/p99 in both phases, and what happened to the hostile ones.
2. burst: 2,000 chats with distinct English questions at concurrency 200, through a gateway with the cache on
   (memory store, the real all-MiniLM-L6-v2 in its process) and one with it off, same workers. Reported:
   throughput, errors, and the cache's outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.harness.fixtures import BENCH_KEY as KEY
from loadtest.harness.procs import start_gateway, start_sim
from loadtest.harness.runner import run
from loadtest.harness.spec import Spec
from loadtest.harness.stats import percentile

QUESTION_WORDS = ("How do I", "What is the best way to", "Why does my", "Can I", "When should I")
OBJECTS = ("router", "printer", "laptop", "database", "cluster", "package", "branch", "image", "server", "client",
           "account", "phone", "tv", "manager", "speaker", "spreadsheet", "job", "key", "record", "balancer")
VERBS = ("reset", "update", "configure", "back up", "restart", "secure", "clean", "install", "monitor", "debug")


def policy(workers: list[str], cache: bool) -> dict[str, Any]:
    from gateway.auth import hash_key

    return {"tenants": {"bench": {"tier": "standard", "keys": ["sha256:" + hash_key(KEY)]}},
            "models": {"sim-llama-8b": {"pool": "p"}},
            "server": {"tenant_max_concurrency": 4096},
            "pools": {"p": {"workers": workers, "max_connections": 1024}},
            "cache": {"enabled": cache, "store": "memory"}}


def legit_spec(seconds: float) -> Spec:
    return Spec.model_validate({
        "name": "legit", "arrival": {"mode": "closed", "concurrency": 8}, "duration_s": seconds,
        "classes": [{"name": "c", "api_key": KEY, "model": "sim-llama-8b", "stream": False,
                     "prompt_tokens": {"dist": "fixed", "value": 32}, "max_tokens": {"dist": "fixed", "value": 40}}]})


async def hostile_clients(url: str, idle: int, slow: int, stop: asyncio.Event) -> dict[str, int]:
    host, port = url.removeprefix("http://").split(":")
    counts = {"idle_opened": 0, "idle_closed_by_server": 0, "slow_opened": 0, "slow_408": 0, "slow_refused": 0}

    async def idle_one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                await asyncio.sleep(0.5)
                continue
            counts["idle_opened"] += 1
            try:
                await asyncio.wait_for(reader.read(1), timeout=60)
                counts["idle_closed_by_server"] += 1
            except TimeoutError:
                pass
            writer.close()

    async def slow_one() -> None:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 1000
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                counts["slow_refused"] += 1
                await asyncio.sleep(0.5)
                continue
            counts["slow_opened"] += 1
            for byte in head:
                if stop.is_set() or reader.at_eof():
                    break
                writer.write(bytes([byte]))
                try:
                    answer = await asyncio.wait_for(reader.read(64), timeout=0.5)
                except TimeoutError:
                    continue
                if answer.startswith(b"HTTP/1.1 408"):
                    counts["slow_408"] += 1
                break
            writer.close()

    tasks = [asyncio.create_task(idle_one()) for _ in range(idle)] + [
        asyncio.create_task(slow_one()) for _ in range(slow)]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return counts


async def legit_under_attack(url: str, seconds: float, idle: int, slow: int) -> tuple[Any, dict[str, int]]:
    stop = asyncio.Event()
    attack = asyncio.create_task(hostile_clients(url, idle, slow, stop))
    await asyncio.sleep(3.0)  # let the sockets pile up first
    result = await run(legit_spec(seconds), url)
    stop.set()
    return result, await attack


def latency_row(name: str, result: Any) -> dict[str, Any]:
    ok = [r.total for r in result.results if r.ok and r.total is not None]
    return {"phase": name, "requests": len(result.results), "errors": sum(not r.ok for r in result.results),
            "p50_ms": round(percentile(ok, 50) * 1000, 2), "p99_ms": round(percentile(ok, 99) * 1000, 2)}


def questions(n: int, seed: int) -> list[str]:
    """n distinct English questions (a seed per run, so no run repeats another's: every request is a miss)."""
    rng = random.Random(seed)
    return [f"{rng.choice(QUESTION_WORDS)} {rng.choice(VERBS)} my {rng.choice(OBJECTS)} number {seed}-{i}?"
            for i in range(n)]


async def burst(url: str, n: int, concurrency: int, seed: int) -> dict[str, Any]:
    """n distinct questions, `concurrency` at a time, as fast as the gateway answers."""
    import aiohttp

    queue: asyncio.Queue[str] = asyncio.Queue()
    for q in questions(n, seed):
        queue.put_nowait(q)
    outcomes: dict[str, int] = {}
    statuses: dict[int, int] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     headers={"authorization": f"Bearer {KEY}"}) as session:
        async def user() -> None:
            while not queue.empty():
                q = queue.get_nowait()
                body = {"model": "sim-llama-8b", "max_tokens": 16, "temperature": 0,  # cacheable: looked up, stored
                        "messages": [{"role": "user", "content": q}]}
                async with session.post(url + "/v1/chat/completions", json=body) as response:
                    await response.read()
                    statuses[response.status] = statuses.get(response.status, 0) + 1
                    cache = response.headers.get("x-tollgate-cache", "off").split(";", 1)[0]
                    outcomes[cache] = outcomes.get(cache, 0) + 1
        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"requests": n, "seconds": round(elapsed, 2), "req_per_s": round(n / elapsed, 1),
            "errors": sum(v for k, v in statuses.items() if k != 200), "statuses": statuses, "cache": outcomes}


class _Skip(Exception):
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--slow", type=int, default=100)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--only", choices=("hostile", "burst"), help="run one part")
    parser.add_argument("--out", default="loadtest/results/hostile/hardening.json")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sims = [start_sim(Path(tmp), "--decode-base-ms", "10") for _ in range(2)]
        urls = [s.url for s in sims]
        gw = start_gateway(Path(tmp), policy(urls, cache=False))
        try:
            if args.only == "burst":
                raise _Skip
            asyncio.run(run(legit_spec(2.0), gw.url))  # warm
            quiet = asyncio.run(run(legit_spec(args.seconds), gw.url))
            attacked, counts = asyncio.run(legit_under_attack(gw.url, args.seconds, args.idle, args.slow))
            rows = [latency_row("quiet", quiet), latency_row("under attack", attacked)]
            report["hostile"] = {"rows": rows, "hostile_clients": counts,
                                 "p99_ratio": round(rows[1]["p99_ms"] / rows[0]["p99_ms"], 2)}
            print(json.dumps(report["hostile"]), flush=True)
        except _Skip:
            pass
        finally:
            gw.kill()
        for sim in sims:
            sim.kill()
        sims = [start_sim(Path(tmp), "--zero-delay") for _ in range(2)]
        urls = [s.url for s in sims]
        if args.only == "hostile":
            gateways = {}
        else:
            gateways = {"cache_off": start_gateway(Path(tmp), policy(urls, cache=False)),
                        "cache_on": start_gateway(Path(tmp), policy(urls, cache=True), timeout=180)}
        try:
            report["burst"] = {}
            for seed, gateway in enumerate(gateways.values()):
                asyncio.run(burst(gateway.url, 200, 50, seed=100 + seed))  # warm the pools (and the embedder)
            for round_ in range(2):
                for name, gateway in (gateways.items() if round_ == 0 else reversed(gateways.items())):
                    result = asyncio.run(burst(gateway.url, args.burst, args.concurrency, seed=round_))
                    report["burst"].setdefault(name, []).append(result)
                    print(json.dumps({name: result}), flush=True)
        finally:
            for gateway in gateways.values():
                gateway.kill()
            for sim in sims:
                sim.kill()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
