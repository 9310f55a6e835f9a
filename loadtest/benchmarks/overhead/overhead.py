"""What the gateway adds over going straight to a worker (python -m loadtest run overhead).

A zero-delay simulated worker, the gateway in front of it, and the same closed-loop workload sent
directly and through the gateway, interleaved. Reported per scenario: added p50/p99 (total for
non-streaming, TTFT for streams) and the gateway's own CPU per request, from its /proc CPU time.

Placement on two cores: the gateway alone on CPU 1; the worker and this client share CPU 0 in both
arms, so the direct and gateway arms see the same contention apart from the gateway itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim
from loadtest.harness.runner import run
from loadtest.harness.spec import closed_spec as spec
from loadtest.harness.stats import percentile

SCENARIOS = [  # name, concurrency, stream, max_tokens
    ("non-stream c=1", 1, False, 16),
    ("non-stream c=16", 16, False, 16),
    ("non-stream c=64", 64, False, 16),
    ("stream 64 tok c=1", 1, True, 64),
    ("stream 64 tok c=64", 64, True, 64),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="per arm per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="loadtest/results/overhead/overhead.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(Path(tmp), "--zero-delay", cpu=0)
        gw = start_gateway(Path(tmp), build_policy([sim.url], "bench"), cpu=1)
        try:
            for name, c, stream, max_tokens in SCENARIOS:
                s = spec(c, stream, max_tokens, args.seconds)
                asyncio.run(run(spec(c, stream, max_tokens, 1.0), gw.url))  # warm the pools
                arms: dict[str, list[Any]] = {"direct": [], "gateway": []}
                gw_cpu, gw_requests = 0.0, 0
                for i in range(args.rounds):
                    for arm in (("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")):
                        cpu0 = gw.cpu_seconds()
                        result = asyncio.run(run(s, sim.url if arm == "direct" else gw.url))
                        arms[arm] += [r for r in result.results if r.ok]
                        if arm == "gateway":
                            gw_cpu += gw.cpu_seconds() - cpu0
                            gw_requests += len(result.results)
                row = {"scenario": name, "gateway_cpu_ms_per_request": round(gw_cpu / gw_requests * 1000, 3)}
                metric = "ttft" if stream else "total"
                for arm, results in arms.items():
                    values = [getattr(r, metric) for r in results if getattr(r, metric) is not None]
                    row[f"{arm}_requests"] = len(results)
                    row[f"{arm}_{metric}_p50_ms"] = round(percentile(values, 50) * 1000, 3)
                    row[f"{arm}_{metric}_p99_ms"] = round(percentile(values, 99) * 1000, 3)
                for q in ("p50", "p99"):
                    row[f"added_{metric}_{q}_ms"] = round(row[f"gateway_{metric}_{q}_ms"]
                                                          - row[f"direct_{metric}_{q}_ms"], 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            gw.kill()
            sim.kill()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
