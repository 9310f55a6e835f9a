"""Fairness inside a class: does a noisy premium tenant hurt a quiet one? (python -m loadtest run fairness)

One gateway on the embedded default in front of the two small overload-2x workers (4 sequences, 12 ms decode
steps, ~10 req/s of 64-token answers together), with a second premium tenant. The quiet tenant sends 1 req/s
of 64-token streams, first alone, then while the noisy tenant sends 10x that plus enough to pass capacity
(``--noisy-rate``, default 14 req/s); rounds alternate, after a warm-up of both (``--warmup-s``): a fresh
gateway's first seconds, while the engines' limits are unknown, are the scheduling benchmark's cold start. Reported:
the quiet tenant's TTFT p50/p95 and errors in each, and the noisy one's. The goal: the quiet tenant's TTFT p95
within 1.5x of what it gets alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from gateway.auth import hash_key
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import SMALL_SIM, start_gateway, start_sim
from loadtest.harness.runner import Run, run
from loadtest.harness.spec import Spec
from loadtest.harness.stats import percentile

QUIET_KEY, NOISY_KEY = "tg-demo-premium-change-me", "tg-bench-noisy-premium"


def stream_class(name: str, key: str, weight: float) -> dict[str, Any]:
    return {"name": name, "api_key": key, "tier": "premium", "weight": weight, "model": "sim-llama-8b",
            "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256}, "max_tokens": {"dist": "fixed", "value": 64},
            "stream": True, "slo": {"ttft_ms": 800, "total_ms": 8000}}


def spec(rate: float, classes: list[dict[str, Any]], seconds: float, seed: int) -> Spec:
    return Spec.model_validate({"name": "fairness", "target": "http://127.0.0.1:8080", "duration_s": seconds,
                                "seed": seed, "timeout_s": 60, "classes": classes,
                                "arrival": {"mode": "open", "rate": rate, "process": "poisson", "max_inflight": 4096}})


def summary(result: Run, cls: str) -> dict[str, Any]:
    rows = [r for r in result.results if r.cls == cls]
    ok = [r.ttft for r in rows if r.ok and r.ttft is not None]
    return {"sent": len(rows), "errors": sum(not r.ok for r in rows),
            "ttft_p50_ms": round(percentile(ok, 50) * 1000, 1) if ok else None,
            "ttft_p95_ms": round(percentile(ok, 95) * 1000, 1) if ok else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quiet-rate", type=float, default=1.0)
    parser.add_argument("--noisy-rate", type=float, default=14.0)
    parser.add_argument("--round-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-s", type=float, default=10.0,
                        help="both tenants, unrecorded, first: the engines show their limits (a cold start is "
                             "the scheduling benchmark's to measure)")
    parser.add_argument("--tenant-headroom", type=float, help="scheduling.tenant_headroom (default: the policy's)")
    args = parser.parse_args()
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sims = [start_sim(Path(tmp), *SMALL_SIM) for _ in range(2)]
        policy = build_policy([s.url for s in sims], "default", scheduling="priority", cache=False)
        policy["tenants"]["noisy-premium"] = {"tier": "premium", "keys": ["sha256:" + hash_key(NOISY_KEY)]}
        if args.tenant_headroom is not None:
            policy["scheduling"]["tenant_headroom"] = args.tenant_headroom
        gateway = start_gateway(Path(tmp), policy)
        try:
            total = args.quiet_rate + args.noisy_rate
            if args.warmup_s:
                asyncio.run(run(spec(total, [stream_class("quiet", QUIET_KEY, args.quiet_rate),
                                             stream_class("noisy", NOISY_KEY, args.noisy_rate)], args.warmup_s, 1),
                                gateway.url))
            for i in range(args.rounds):
                alone = asyncio.run(run(spec(args.quiet_rate, [stream_class("quiet", QUIET_KEY, 1)], args.round_s,
                                             10 + i), gateway.url))
                both = asyncio.run(run(spec(total, [stream_class("quiet", QUIET_KEY, args.quiet_rate),
                                                    stream_class("noisy", NOISY_KEY, args.noisy_rate)],
                                            args.round_s, 20 + i), gateway.url))
                for key, part in (("alone", alone), ("beside the noisy tenant", both)):
                    if key in runs:
                        runs[key].results += part.results
                    else:
                        runs[key] = part
        finally:
            gateway.kill()
            for sim in sims:
                sim.kill()
    table = {"quiet alone": summary(runs["alone"], "quiet"),
             "quiet beside noisy": summary(runs["beside the noisy tenant"], "quiet"),
             "noisy": summary(runs["beside the noisy tenant"], "noisy")}
    alone, beside = table["quiet alone"]["ttft_p95_ms"], table["quiet beside noisy"]["ttft_p95_ms"]
    table["quiet p95 ratio"] = round(beside / alone, 2) if alone and beside else None
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
