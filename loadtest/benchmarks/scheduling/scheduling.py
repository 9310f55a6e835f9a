"""The priority scheduler against FIFO admission at twice the workers' capacity (python -m loadtest run scheduling).

Two gateways on the embedded default's tenants and tiers, one with scheduling.mode: priority and one with
fifo, each in front of its own two small simulated workers (4 sequences, 12 ms decode steps), take the
overload-2x scenario in alternating rounds. Reported per class: TTFT p50/p95 of answered requests, how many
were shed (429) or failed otherwise, and the longest queue wait the gateway reported (Server-Timing).
Requests still unanswered when a round ends count as misses, not as fast answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from loadtest.harness import report
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import ROOT, SMALL_SIM, start_gateway, start_sim
from loadtest.harness.report import per_class
from loadtest.harness.runner import Run, run
from loadtest.harness.spec import load_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=str(ROOT / "loadtest" / "scenarios" / "overload-2x.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="loadtest/results/scheduling")
    parser.add_argument("--duration", type=float, help="seconds of load per gateway (default: the scenario's)")
    parser.add_argument("--worker-metrics", choices=("ok", "missing", "hang", "huge"), default="ok",
                        help="what the workers' /metrics does (missing: an engine without vLLM's metrics)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    results: dict[str, Run] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        gateways = {}
        try:
            for mode in ("priority", "fifo"):
                sims = [start_sim(Path(tmp), *SMALL_SIM, "--metrics", args.worker_metrics) for _ in range(2)]
                procs += sims
                policy = build_policy([s.url for s in sims], "default", scheduling=mode, cache=False)
                gateways[mode] = start_gateway(Path(tmp), policy)
                procs.append(gateways[mode])
            per_round = (args.duration or spec.duration_s or 30) / args.rounds
            for i in range(args.rounds):
                for mode in (("priority", "fifo") if i % 2 == 0 else ("fifo", "priority")):
                    part = asyncio.run(run(spec.model_copy(update={"duration_s": per_round}), gateways[mode].url))
                    if mode in results:
                        results[mode].extend(part)
                    else:
                        results[mode] = part
        finally:
            for proc in procs:
                proc.kill()
    table = {mode: per_class(result) for mode, result in results.items()}
    for mode, result in results.items():
        report.write(spec, result, Path(args.out), prefix=f"{spec.name}-{mode}")
    Path(args.out, f"{spec.name}-compare.json").write_text(json.dumps(table, indent=2))
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
