"""What the GPUs cost, per tenant, measured (python -m loadtest run gpu_costs [--engine sim|vllm]).

Two workers at a known hourly rate behind one gateway; two tenants take turns in one Poisson arrival stream
(the same request count each), the heavy one asking three times the decode tokens (``ignore_eos``: the lengths
are exact), in bursts with idle gaps between them. Then it reads GET /admin/reports/gpu for the run and checks:

- reconciliation: the tenants' GPU cost plus every worker's idle row equals the workers' configured hours times
  their rate, to the cent;
- the heavy tenant's GPU cost over the light one's (expected between 2.5x and 3.5x);
- the measure against the engines' own time: the sequence-seconds the ledger gives each worker (the sum of its
  requests' spans) against the engine's own ``vllm:e2e_request_latency_seconds_sum``, and the busy time the
  report gives against the time the engine's ``vllm:num_requests_running`` was above zero (sampled every 100 ms);
- the same split by the other measure considered (each request's sequence-seconds, whole), for comparison.

--engine vllm starts two real vLLM CPU engines (the tiny model), each pinned to its own core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from gateway.auth import hash_key
from loadtest.harness import procs
from loadtest.harness.fixtures import DEMO_KEY, FINANCE_TOKEN, metric_value
from loadtest.harness.policy import build_policy

HEAVY_KEY = "tg-bench-heavy-key"
RATE = 98.32  # USD per worker-hour: an 8-GPU node at a cloud's on-demand rate, so cents are many


def policy(workers: list[str], model: str) -> dict[str, Any]:
    p = build_policy(workers, model=model, gpu_usd_per_hour=RATE, max_inflight_per_worker=256)
    p["tenants"]["heavy"] = {"tier": "standard", "keys": ["sha256:" + hash_key(HEAVY_KEY)], "models": ["*"]}
    p["scheduling"] = {"tiers": {"standard": {"max_queue_wait_ms": 120_000}}}
    p["cache"] = {"enabled": False}
    return p


class Sampler(threading.Thread):
    """The engines' own busy time: how long each one's running gauge was above zero."""

    def __init__(self, urls: list[str], every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.urls, self.every_s = urls, every_s
        self.busy = dict.fromkeys(urls, 0.0)
        self.stop = threading.Event()

    def run(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(self.every_s):
            now = time.monotonic()
            for url in self.urls:
                try:
                    if metric_value(url, "vllm:num_requests_running") > 0:
                        self.busy[url] += now - last
                except httpx.HTTPError:
                    pass
            last = now


async def traffic(url: str, model: str, rps: float, bursts: int, burst_s: float, gap_s: float, light: int,
                  seed: int) -> int:
    rng = random.Random(seed)
    sent = 0
    async with httpx.AsyncClient(timeout=300) as client:
        async def ask(key: str, tokens: int) -> None:
            r = await client.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
                "model": model, "messages": [{"role": "user", "content": f"question {rng.random()}"}],
                "max_tokens": tokens, "ignore_eos": True, "temperature": 0.7})
            r.raise_for_status()

        tasks = []
        heavy = False
        for b in range(bursts):
            ends = time.monotonic() + burst_s
            while time.monotonic() < ends:
                await asyncio.sleep(rng.expovariate(2 * rps))
                heavy = not heavy
                key, tokens = (HEAVY_KEY, 3 * light) if heavy else (DEMO_KEY, light)
                tasks.append(asyncio.create_task(ask(key, tokens)))
                sent += 1
            if b < bursts - 1:
                await asyncio.sleep(gap_s)
        await asyncio.gather(*tasks)
    return sent


def stamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    engines: list[Any] = []
    if args.engine == "vllm":
        from workers.vllm.cpu import start_vllm_cpu

        model = "tiny-llama"
        engines = [start_vllm_cpu(served_name=model, max_model_len=1024, cpus=str(i)) for i in range(2)]
        urls = [e.url for e in engines]
    else:
        model = "sim-llama-8b"
        engines = [procs.start_sim(tmp, model=model) for _ in range(2)]
        urls = [e.url for e in engines]
    gateway = procs.start_gateway(tmp, policy(urls, model))
    try:
        before = {u: metric_value(u, "vllm:e2e_request_latency_seconds_sum") for u in urls}
        sampler = Sampler(urls)
        start = time.time()
        sampler.start()
        sent = asyncio.run(traffic(gateway.url, model, args.rps, args.bursts, args.burst_s, args.gap_s,
                                   args.light_tokens, args.seed))
        time.sleep(args.gap_s)  # a last idle gap, paid for like the others
        end = time.time()
        sampler.stop.set()
        sampler.join()
        engine_seq_s = {u: metric_value(u, "vllm:e2e_request_latency_seconds_sum") - before[u] for u in urls}
        headers = {"Authorization": f"Bearer {FINANCE_TOKEN}"}
        params = {"from": stamp(start), "to": stamp(end), "group_by": "tenant"}
        for _ in range(200):
            out = httpx.get(gateway.url + "/admin/reports/gpu", params=params, headers=headers, timeout=60).json()
            if out["total"]["requests"] == sent:
                break
            time.sleep(0.1)
        ledger = httpx.get(gateway.url + "/admin/ledger", params={"from": stamp(start), "to": stamp(end + 60)},
                           headers=headers, timeout=60).json()["data"]
    finally:
        gateway.kill()
        for e in engines:
            e.stop() if hasattr(e, "stop") else e.kill()
    return summarise(args, out, ledger, engine_seq_s, sampler.busy, urls, sent, end - start)


def summarise(args: argparse.Namespace, out: dict[str, Any], ledger: list[dict[str, Any]],
              engine_seq_s: dict[str, float], engine_busy_s: dict[str, float], urls: list[str], sent: int,
              period_s: float) -> dict[str, Any]:
    rows = {r["tenant"]: r for r in out["data"] if r["kind"] == "usage"}
    idle = sum(r["gpu_cost_usd"] for r in out["data"] if r["kind"] == "idle")
    tenants = sum(r["gpu_cost_usd"] for r in rows.values())
    billed = sum(w["configured_hours"] * w["usd_per_hour"] for w in out["workers"])
    workers = {w["worker"]: w for w in out["workers"]}
    seq_s = {u: sum((r["worker_ms"] or 0) / 1000 for r in ledger if r["worker"] == u) for u in urls}
    by_tenant_seq = {t: sum((r["worker_ms"] or 0) / 1000 for r in ledger if r["tenant"] == t and r["worker"])
                     for t in rows}
    return {
        "engine": args.engine, "requests": sent, "period_s": round(period_s, 1), "usd_per_hour": RATE,
        "tenants_usd": round(tenants, 6), "idle_usd": round(idle, 6), "tenants_plus_idle_usd": round(tenants + idle, 6),
        "hours_times_rate_usd": round(billed, 6), "difference_cents": round((tenants + idle - billed) * 100, 6),
        "heavy_over_light": round(rows["heavy"]["gpu_cost_usd"] / rows["demo"]["gpu_cost_usd"], 3),
        "heavy_over_light_by_sequence_seconds": round(by_tenant_seq["heavy"] / by_tenant_seq["demo"], 3),
        "tokens": {t: r["completion_tokens"] for t, r in rows.items()},
        "workers": {u: {"configured_s": round(workers[u]["configured_hours"] * 3600, 2),
                        "busy_s": round(workers[u]["busy_hours"] * 3600, 2),
                        "engine_busy_s": round(engine_busy_s[u], 2),
                        "busy_error": round(workers[u]["busy_hours"] * 3600 / engine_busy_s[u] - 1, 4)
                        if engine_busy_s[u] else None,
                        "ledger_sequence_s": round(seq_s[u], 2), "engine_sequence_s": round(engine_seq_s[u], 2),
                        "sequence_error": round(seq_s[u] / engine_seq_s[u] - 1, 4) if engine_seq_s[u] else None,
                        "utilisation": workers[u]["utilisation"]} for u in urls},
        "cheapest": out["cheapest"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--rps", type=float, default=2.0, help="requests per second per tenant, in a burst")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--burst-s", type=float, default=20.0)
    parser.add_argument("--gap-s", type=float, default=10.0)
    parser.add_argument("--light-tokens", type=int, default=64, help="the heavy tenant asks three times this")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
