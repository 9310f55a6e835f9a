"""An engine whose /metrics says nothing, at 64 concurrent streams (python -m loadtest run no_metrics).

A simulated worker that runs 64 sequences at once serves /metrics missing (404, as an engine without vLLM's
metrics), hanging, or as 50 MB of junk. 64 clients stream 32-token answers for 10 s straight to it, then
through a fresh gateway. Prints streams per second and the statuses for each.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from loadtest.harness.fixtures import DEMO_KEY
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim

BODY = {"model": "sim-llama-8b", "messages": [{"role": "user", "content": "count"}], "max_tokens": 32,
        "ignore_eos": True, "stream": True}


async def closed_loop(url: str, clients: int = 64, seconds: float = 10.0) -> tuple[float, dict[int, int]]:
    done, statuses = 0, {}
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients + 8)) as client:
        async def one() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                async with client.stream("POST", url + "/v1/chat/completions", json=BODY,
                                         headers={"authorization": f"Bearer {DEMO_KEY}"}) as reply:
                    await reply.aread()
                    statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
                    done += reply.status_code == 200
        await asyncio.gather(*(one() for _ in range(clients)))
    return done / seconds, statuses


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    for mode in ("missing", "hang", "huge"):
        sim = start_sim(tmp, "--metrics", mode, "--max-num-seqs", "64", "--decode-base-ms", "20",
                        "--decode-per-seq-ms", "0")
        policy = build_policy([sim.url])
        policy["pools"]["main"]["max_inflight_per_worker"] = 256
        gw = start_gateway(tmp, policy)
        try:
            direct = asyncio.run(closed_loop(sim.url))
            through = asyncio.run(closed_loop(gw.url))
            print(f"/metrics {mode:7s}: direct {direct[0]:.1f} streams/s {direct[1]}; through the gateway "
                  f"{through[0]:.1f} streams/s ({through[0] / direct[0]:.0%}) {through[1]}", flush=True)
        finally:
            gw.kill()
            sim.kill()


if __name__ == "__main__":
    main()
