"""Does `tollgate diagnose` measure the worker with the cache on? (python -m loadtest run diagnose_cache)

Alternates gateways with the response cache on (exact layer, temperature 0 cacheable) and off in front of one
engine-paced simulated worker, and runs the diagnosis against each: its TTFT p50 through the gateway, its whole
answer p50, and how many of its requests the cache answered. A diagnosis that measured cache replays would show
a far smaller TTFT with the cache on (before the fix: "every check passed" in 2 s on replays).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import httpx

from gateway.auth import hash_key
from gateway.ops import diagnose
from loadtest.harness import procs
from loadtest.harness.fixtures import DEMO_KEY, FINANCE_TOKEN
from loadtest.harness.policy import build_policy

MODEL = "sim-llama-8b"
METRICS = "tg-bench-metrics"


def one(tmp: Path, sim_url: str, cache: bool) -> dict[str, float]:
    policy = build_policy([sim_url])
    policy["server"]["metrics_token_sha256"] = "sha256:" + hash_key(METRICS)
    policy["cache"] = {"enabled": cache, "semantic_languages": [], "default_temperature": 0.0,
                       "audit": {"enabled": False}}
    gateway = procs.start_gateway(tmp, policy)
    try:
        report = asyncio.run(diagnose.run(gateway.url, DEMO_KEY, MODEL, sim_url, METRICS))
        rows = httpx.get(gateway.url + "/admin/ledger", headers={"Authorization": f"Bearer {FINANCE_TOKEN}"},
                         timeout=30).json()["data"]
    finally:
        gateway.kill()
    hits = sum(1 for r in rows if (r["cache"] or "").startswith("hit"))
    return {**report.figures, "cache_hits": hits, "requests": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-diagnose-"))
    sim = procs.start_sim(tmp, "--decode-base-ms", "8", model=MODEL)
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    try:
        for _ in range(args.rounds):
            for label in ("on", "off"):
                runs[label].append(one(tmp, sim.url, label == "on"))
                print(label, runs[label][-1], flush=True)
    finally:
        sim.kill()
    summary = {label: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for label, rs in runs.items()}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "median": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
