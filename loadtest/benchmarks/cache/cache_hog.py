"""What the response cache costs a request's TTFT on a saturated host (python -m loadtest run cache_hog).

Two gateways over one simulated worker at an engine's pace (its default timings: ~13 ms to a stream's first
token): one with the cache on (the policy's default embedder unless --embedder says otherwise), one with it off.
Requests alternate between the two, one for one, so both meet the same machine. Each phase sends --n streamed,
cacheable requests (temperature 0) at --rate per second, open loop: half paraphrases of questions stored
beforehand (a semantic hit is possible), half new questions (a miss). Phases: the machine as it is, then with
--hogs CPU-bound processes (`while True: pass`) running beside everything, on this 2-core machine.

Per phase and gateway: the client's TTFT (to the first SSE data line) p50/p95/p99, the cache stage the gateway
reports (Server-Timing `cache`, the exact layer on the request's path) p50/p99, what the cache answered, and
the semantic lookups that came after the answer (`tollgate_cache_bypass_total{reason="late"}`).

--memory: the resident memory of `tollgate serve` with the cache on after 40 requests, the gateway and its child
processes, for e5 (a thread of the gateway) and for all-MiniLM-L6-v2 (sentence-transformers in a process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from loadtest.harness.client import parse_server_timing
from loadtest.harness.fixtures import BENCH_KEY as KEY
from loadtest.harness.procs import Proc, start_gateway, start_sim
from loadtest.harness.questions import questions, rephrase
from loadtest.harness.stats import percentile

MODEL = "sim-llama-8b"


def policy(worker: str, cache: bool, embedder: dict[str, Any] | None) -> dict[str, Any]:
    from gateway.auth import hash_key

    spec: dict[str, Any] = {"enabled": cache, "max_entries_per_tenant": 100_000, "audit": {"enabled": False}}
    if embedder is not None:
        spec["embedder"] = embedder
    return {"tenants": {"bench": {"tier": "standard", "keys": ["sha256:" + hash_key(KEY)]}},
            "models": {MODEL: {"pool": "p"}}, "pools": {"p": {"workers": [worker]}}, "cache": spec}


async def ask(session: aiohttp.ClientSession, url: str, q: str) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 16, "temperature": 0,
            "stream": True}
    started = time.perf_counter()
    ttft = None
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200, r.status
        async for line in r.content:
            if ttft is None and line.startswith(b"data:"):
                ttft = time.perf_counter() - started
        stages = parse_server_timing(r.headers.get("server-timing", ""))
        outcome = r.headers.get("x-tollgate-cache", "").split(";", 1)[0]  # <outcome>[; key=value]*
        return {"ttft": ttft, "cache_ms": stages.get("cache"), "result": outcome}


async def phase(on: str, off: str, stored: list[str], fresh: list[str], rate: float) -> dict[str, Any]:
    items = [rephrase(q) for q in stored] + fresh
    random.Random(7).shuffle(items)
    rows: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        tasks = []
        for i, q in enumerate(items):
            for side, url in (("on", on), ("off", off)):
                delay = start + (2 * i + (side == "off")) / (2 * rate) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append((side, asyncio.ensure_future(ask(session, url, q))))
        for side, task in tasks:
            rows[side].append(await task)
    return {side: summary(r) for side, r in rows.items()}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [r["ttft"] for r in rows if r["ttft"] is not None]
    cache = [r["cache_ms"] for r in rows if r["cache_ms"] is not None]
    results: dict[str, int] = {}
    for r in rows:
        results[r["result"]] = results.get(r["result"], 0) + 1
    out = {"n": len(rows), **{f"ttft_p{p}_ms": round(percentile(ttft, p) * 1000, 2) for p in (50, 95, 99)},
           "results": results}
    misses = [r["ttft"] for r in rows if r["ttft"] is not None and r["result"] == "miss"]
    if misses and len(misses) < len(rows):  # what the cache costs the requests it could not answer
        out |= {"miss_ttft_p50_ms": round(percentile(misses, 50) * 1000, 2),
                "miss_ttft_p99_ms": round(percentile(misses, 99) * 1000, 2)}
    if cache:
        out |= {"cache_stage_p50_ms": round(percentile(cache, 50), 3),
                "cache_stage_p99_ms": round(percentile(cache, 99), 3), "cache_stage_max_ms": round(max(cache), 3)}
    return out


def late(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tollgate_cache_bypass_total") and 'reason="late"' in line)


def fill(url: str, stored: list[str]) -> None:
    with httpx.Client(timeout=30) as client:
        for q in stored:
            client.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                        json={"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 16,
                              "temperature": 0})
    time.sleep(1.0)  # a benchmark's settling time: background stores land


def hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MB."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except FileNotFoundError:
            continue
    return round(total, 1)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for child in (task / "children").read_text().split():
                found += [int(child), *_children(int(child))]
        except FileNotFoundError:
            continue
    return found


def memory(tmp: Path, sim: Proc) -> dict[str, Any]:
    out = {}
    for name, embedder in (("e5 (default)", None), ("all-MiniLM-L6-v2", {"kind": "sentence-transformers"}),
                           ("cache off", "off")):
        gw = start_gateway(tmp, policy(sim.url, embedder != "off", embedder if isinstance(embedder, dict) else None),
                           timeout=120)
        try:
            fill(gw.url, questions(40, 9))
            out[name] = rss_mb(gw.pid)
        finally:
            gw.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="requests per gateway per phase")
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second to each gateway")
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--embedder", choices=("e5", "minilm"), default="e5")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--out", default="loadtest/results/cache/hog.json")
    args = parser.parse_args()
    embedder = None if args.embedder == "e5" else {"kind": "sentence-transformers"}
    result: dict[str, Any] = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(Path(tmp))
        try:
            if args.memory:
                result["memory_mb"] = memory(Path(tmp), sim)
            on = start_gateway(Path(tmp), policy(sim.url, True, embedder), timeout=120)
            off = start_gateway(Path(tmp), policy(sim.url, False, None))
            try:
                for name, hog_count in (("idle", 0), (f"{args.hogs}_cpu_hogs", args.hogs)):
                    stored = questions(args.n // 2, 11 + hog_count)
                    fill(on.url, stored)
                    before = late(on.url)
                    running = hogs(hog_count)
                    try:
                        fresh = questions(args.n // 2, 21 + hog_count)
                        result[name] = asyncio.run(phase(on.url, off.url, stored, fresh, args.rate))
                    finally:
                        for h in running:
                            h.kill()
                            h.wait()
                    result[name]["on"]["semantic_late"] = late(on.url) - before
                    print(name, json.dumps(result[name]))
            finally:
                on.stop()
                off.stop()
        finally:
            sim.stop()
    if "memory_mb" in result:
        print("memory_mb", json.dumps(result["memory_mb"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
