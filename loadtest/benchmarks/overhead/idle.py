"""What an idle gateway costs: two simulated workers, no traffic, the gateway's CPU over a window
(python -m loadtest run idle [--seconds 30] [--scrape-interval S]).

Idle work is a gateway's floor: its timers, writer threads and worker scrapes run whether or not anyone calls.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--scrape-interval", type=float, help="pools.local-sim.scrape_interval_s (default: the "
                        "embedded default's)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    sims = [start_sim(tmp) for _ in range(2)]
    policy = build_policy([s.url for s in sims], "default")
    if args.scrape_interval is not None:
        policy["pools"]["local-sim"]["scrape_interval_s"] = args.scrape_interval
    gateway = start_gateway(tmp, policy)
    try:
        time.sleep(5)  # past the first scrapes and the start's own work
        before, started = gateway.cpu_seconds(), time.monotonic()
        time.sleep(args.seconds)
        used, wall = gateway.cpu_seconds() - before, time.monotonic() - started
        print(f"idle gateway, two workers: {used / wall * 100:.2f}% of a core ({used:.2f} s CPU in {wall:.0f} s)")
    finally:
        gateway.kill()
        for sim in sims:
            sim.kill()


if __name__ == "__main__":
    main()
