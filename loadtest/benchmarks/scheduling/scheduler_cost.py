"""The priority scheduler's CPU per request, unsaturated (python -m loadtest run scheduler_cost).

The same checkout twice: ``scheduling.mode: fifo`` (admit at once) against ``priority`` (queues, learned
limits, fair share), alternated ``--starts`` times, gateway pinned to CPU 1, a zero-delay simulated worker and
the client on CPU 0, plain 16-token chats at concurrency 1 (nothing ever waits, so the difference is the cost
of the scheduler's bookkeeping on the path). Prints every run and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path

from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim
from loadtest.harness.runner import run
from loadtest.harness.spec import closed_spec as spec


def one(tmp: Path, worker: str, mode: str, seconds: float) -> float:
    gateway = start_gateway(tmp, build_policy([worker], "bench", scheduling=mode), cpu=1)
    try:
        asyncio.run(run(spec(1, False, 16, 1.0), gateway.url))
        before = gateway.cpu_seconds()
        result = asyncio.run(run(spec(1, False, 16, seconds), gateway.url))
        return (gateway.cpu_seconds() - before) / len(result.results) * 1e6
    finally:
        gateway.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    runs: dict[str, list[float]] = {"fifo": [], "priority": []}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        sim = start_sim(tmp, "--zero-delay", cpu=0)
        try:
            for i in range(args.starts):
                for mode in (("fifo", "priority") if i % 2 == 0 else ("priority", "fifo")):
                    runs[mode].append(round(one(tmp, sim.url, mode, args.seconds), 1))
                    print(mode, runs[mode][-1], flush=True)
        finally:
            sim.kill()
    medians = {mode: statistics.median(values) for mode, values in runs.items()}
    print(json.dumps({"us_cpu_per_request": runs, "medians": medians,
                      "priority_minus_fifo_us": round(medians["priority"] - medians["fifo"], 1)}, indent=2))


if __name__ == "__main__":
    main()
