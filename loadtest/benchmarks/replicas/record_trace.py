"""Record a traffic trace of the scale signal's inputs (python -m loadtest run record_trace).

Two small simulated workers (8 sequences, 100 KV blocks each) behind the gateway on the embedded default's
tenants, and open-loop streaming load in phases: light, overload (KV cache full, a queue), busy within every
bar, light, a short blip, then nothing. Every ``--every`` seconds the gateway's own view is read from
GET /admin/scale (the signals its Autoscaler fed to the rules, and what it decided) and written as a CSV row.
tests/inprocess/ops/test_scaling.py replays the recorded signals through the rules; the default phases take 36 minutes,
most of it the idle tail the scale-in rule needs (10 quiet minutes, twice).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness.policy import build_policy
from loadtest.harness.procs import ROOT, start_gateway, start_sim
from loadtest.harness.runner import run
from loadtest.harness.spec import load_spec

SIM_FLAGS = ("--max-num-seqs", "8", "--num-blocks", "100", "--block-size", "16", "--decode-base-ms", "12")
# (label, seconds, arrivals per second); 0 is no load at all
PHASES: tuple[tuple[str, float, float], ...] = (
    ("light", 120, 2), ("overload", 390, 30), ("busy", 120, 9), ("light", 210, 1), ("blip", 20, 20),
    ("idle", 1300, 0))
FIELDS = ("t_s", "phase", "workers", "kv_usage", "queued", "ttft_p95_ms", "ttft_slo_ms", "ttft_tier", "live_desired",
          "live_reason")


def gateway_policy(workers: list[str]) -> dict[str, Any]:
    return build_policy(workers, "default", cache=False, autoscaling={"min_workers": 1, "max_workers": 8})


async def sample(url: str, started: float, phase: list[str], every: float, rows: list[dict[str, Any]],
                 out: Path) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            await asyncio.sleep(every - (time.monotonic() - started) % every)
            response = await client.get(url + "/admin/scale",
                                        headers={"Authorization": "Bearer tg-admin-demo-change-me"})
            pool = response.json()["pools"].get("local-sim")
            if pool is None:
                continue
            s = pool["signals"]
            rows.append({"t_s": round(time.monotonic() - started, 1), "phase": phase[0],
                         "workers": pool["current"], "kv_usage": s["kv_usage"], "queued": s["queued"],
                         "ttft_p95_ms": "" if s["ttft_p95_ms"] is None else s["ttft_p95_ms"],
                         "ttft_slo_ms": s["ttft_slo_ms"], "ttft_tier": s["ttft_tier"], "live_desired": pool["desired"],
                         "live_reason": pool["reason"]})
            write(out, rows)


def write(out: Path, rows: list[dict[str, Any]]) -> None:
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)


async def drive(url: str, every: float, out: Path, speed: float) -> None:
    spec = load_spec(ROOT / "loadtest" / "scenarios" / "overload-2x.yaml")
    started = time.monotonic()
    phase = ["start"]
    rows: list[dict[str, Any]] = []
    sampler = asyncio.create_task(sample(url, started, phase, every, rows, out))
    try:
        for label, seconds, rate in PHASES:
            phase[0] = label
            seconds /= speed
            if rate == 0:
                await asyncio.sleep(seconds)
                continue
            arrival = spec.arrival.model_copy(update={"rate": rate})
            await run(spec.model_copy(update={"arrival": arrival, "duration_s": seconds, "timeout_s": 30}), url)
    finally:
        sampler.cancel()
    write(out, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "tests" / "data" / "scale_trace.csv"))
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--speed", type=float, default=1.0, help="divide every phase's length (a quick try)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [start_sim(Path(tmp), *SIM_FLAGS) for _ in range(2)]
        try:
            gateway = start_gateway(Path(tmp), gateway_policy([p.url for p in procs]))
            procs.append(gateway)
            asyncio.run(drive(gateway.url, args.every, Path(args.out), args.speed))
        finally:
            for proc in procs:
                proc.kill()


if __name__ == "__main__":
    main()
