"""A chaos run for the ledger: is every request recorded, to the token? (python -m loadtest run ledger)

Two simulated workers and one gateway (SQLite ledger in a data directory, cache off). ``--requests`` requests
(default 5,000) from three tenants, half streamed, 10% cut by the client after a few chunks, ``--concurrency``
at a time, each with its own X-Request-ID. A third of the way in, one worker is SIGKILLed and started again;
two thirds in, the gateway is SIGKILLed and started again on the same port and data directory.

Checked at the end:
- every request that got an answer (or was cut by the client) has exactly one ledger record; the only ones
  allowed to be missing finished less than 1 s before the gateway's SIGKILL;
- the ledger's prompt and completion tokens against the workers' own vllm:prompt_tokens_total and
  vllm:generation_tokens_total (summed over each worker's lives; each scraped just before it is killed);
  the difference is the requests in flight when something was killed (cut streams, which the workers
  generated a few tokens past);
- every record's cost recomputes from its price version.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.ledger.prices import Usage, recompute
from gateway.policy.schema import Prices
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import Proc, start_gateway, start_sim
from workers.process import free_port

CUT_NON_STREAM = True
KEYS = ("tg-demo-key-change-me", "tg-demo-premium-change-me", "tg-demo-batch-change-me")


@dataclass
class Outcome:
    rid: str
    kind: str  # answered | cut | transport (in flight when the gateway died) | refused (never reached it)
    status: int | None
    finished: float  # time.time()


def policy(workers: list[str]) -> dict[str, Any]:
    p = build_policy(workers, "default", cache=False, cooldown_s=1)
    p["tenants"]["demo-batch"]["models"] = ["*"]
    p["tiers"]["batch"]["on_exceed"] = "clamp"
    return p


def counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    values = {"vllm:prompt_tokens_total": 0.0, "vllm:generation_tokens_total": 0.0}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values["vllm:prompt_tokens_total"], values["vllm:generation_tokens_total"]


async def one(client: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> Outcome:
    """One request; refused connections (the gateway restarting) are retried: they never reached it."""
    outcome = await _once(client, url, i, random.Random(rng.random()))
    deadline = time.monotonic() + 30
    while outcome.kind == "refused" and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        outcome = await _once(client, url, i, random.Random(i))
    return outcome


async def _once(client: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> Outcome:
    rid = f"chaos-{i}"
    stream, cut = i % 2 == 0, rng.random() < 0.1
    body = {"model": "sim-llama-8b", "max_tokens": rng.randint(8, 48), "stream": stream,
            "messages": [{"role": "user", "content": f"request {i}: " + "word " * rng.randint(5, 60)}]}
    headers = {"Authorization": f"Bearer {KEYS[i % 3]}", "X-Request-ID": rid}
    try:
        if stream:
            async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
                events = 0
                async for line in r.aiter_lines():
                    events += line.startswith("data:")
                    if cut and events >= 3:
                        return Outcome(rid, "cut", r.status_code, time.time())
                return Outcome(rid, "answered", r.status_code, time.time())
        if cut and CUT_NON_STREAM:  # a non-streamed request the client gives up on before the answer
            try:
                r = await client.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=0.02)
                return Outcome(rid, "answered", r.status_code, time.time())
            except httpx.ReadTimeout:
                return Outcome(rid, "cut", None, time.time())
        r = await client.post(url + "/v1/chat/completions", json=body, headers=headers)
        return Outcome(rid, "answered", r.status_code, time.time())
    except httpx.ConnectError:
        return Outcome(rid, "refused", None, time.time())
    except httpx.TransportError:
        return Outcome(rid, "transport", None, time.time())


async def drive(url: str, total: int, concurrency: int, chaos: list[tuple[int, Any]]) -> list[Outcome]:
    rng = random.Random(7)
    outcomes: list[Outcome] = []
    next_i = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def worker() -> None:
            nonlocal next_i
            while next_i < total:
                i = next_i
                next_i += 1
                for at, action in chaos:
                    if i == at:
                        await asyncio.to_thread(action)
                outcomes.append(await one(client, url, i, rng))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--calm", action="store_true", help="no kills and no abandoned non-streamed requests: the "
                        "control, where the ledger must equal the workers' counters exactly")
    args = parser.parse_args()
    global CUT_NON_STREAM
    CUT_NON_STREAM = not args.calm
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        flags = ("--decode-base-ms", "2")
        sims: list[Proc] = [start_sim(tmp, *flags) for _ in range(2)]
        data_dir = tmp / "data"
        the_policy = policy([s.url for s in sims])
        port = free_port()
        gateway = start_gateway(tmp, the_policy, data_dir=data_dir, port=port)
        worker_totals = [0.0, 0.0]  # prompt, generation over every life of every worker
        kill_time: list[float] = []

        def kill_worker() -> None:
            victim = sims[1]
            prompt, gen = counters(victim.url)
            os.kill(victim.pid, signal.SIGKILL)
            victim.process.wait()
            worker_totals[0] += prompt
            worker_totals[1] += gen
            sims[1] = start_sim(tmp, *flags, port=victim.port)

        def kill_gateway() -> None:
            nonlocal gateway
            kill_time.append(time.time())
            os.kill(gateway.pid, signal.SIGKILL)
            gateway.process.wait()
            time.sleep(0.5)
            gateway = start_gateway(tmp, the_policy, data_dir=data_dir, port=port)

        try:
            started = time.monotonic()
            chaos = [] if args.calm else [(args.requests // 3, kill_worker), (2 * args.requests // 3, kill_gateway)]
            outcomes = asyncio.run(drive(gateway.url, args.requests, args.concurrency, chaos))
            elapsed = time.monotonic() - started
            time.sleep(1.5)  # the ledger writes within ~100 ms
            for sim in sims:
                prompt, gen = counters(sim.url)
                worker_totals[0] += prompt
                worker_totals[1] += gen
        finally:
            gateway.kill()
            for sim in sims:
                sim.kill()
        with sqlite3.connect(data_dir / "ledger.sqlite3") as db:
            db.row_factory = sqlite3.Row
            records = [dict(r) for r in db.execute("SELECT * FROM ledger")]
    by_rid: dict[str, int] = {}
    for record in records:
        by_rid[record["request_id"]] = by_rid.get(record["request_id"], 0) + 1
    reached = [o for o in outcomes if o.kind in ("answered", "cut")]
    missing = [o for o in reached if o.rid not in by_rid]
    in_grace = [o for o in missing if kill_time and kill_time[0] - 1.0 <= o.finished <= kill_time[0] + 0.1]
    prices = Prices.model_validate(policy([])["prices"])
    mismatched = [r for r in records if r["price_version"] and abs(r["cost_usd"] - recompute(
        prices, r["price_version"], Usage(r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]),
        r["service_class"], r["batch"] is not None, bool(r["cache"] and r["cache"].startswith("hit")))) > 1e-12]
    ledger_prompt = sum(r["prompt_tokens"] for r in records if not r["estimated"])
    ledger_gen = sum(r["completion_tokens"] for r in records if not r["estimated"])
    report = {
        "requests_sent": len(outcomes), "elapsed_s": round(elapsed, 1),
        "answered": sum(o.kind == "answered" for o in outcomes),
        "cut_by_client": sum(o.kind == "cut" for o in outcomes),
        "in_flight_at_the_gateway_kill (transport error)": sum(o.kind == "transport" for o in outcomes),
        "refused_after_30s": sum(o.kind == "refused" for o in outcomes),
        "statuses": {str(s): sum(o.status == s for o in reached) for s in sorted({o.status or 0 for o in reached})},
        "ledger_records": len(records), "duplicate_records": sum(n - 1 for n in by_rid.values() if n > 1),
        "reached_without_record": len(missing), "of_which_finished_within_1s_before_the_gateway_kill": len(in_grace),
        "estimated_records": sum(bool(r["estimated"]) for r in records),
        "ledger_prompt_tokens (exact records)": ledger_prompt,
        "ledger_prompt_tokens (estimated records)": sum(r["prompt_tokens"] for r in records if r["estimated"]),
        "workers_prompt_tokens": int(worker_totals[0]),
        "ledger_completion_tokens (exact records)": ledger_gen,
        "workers_generation_tokens": int(worker_totals[1]),
        "records_whose_cost_does_not_recompute": len(mismatched),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
