"""A replica joining while another holds long streams (python -m loadtest run join).

One simulated worker (4 sequences, 12 ms decode steps), replica A on Redis shared state with ten clients
streaming 200-token answers through it as a premium tenant (no slots held back for a higher class); after
``--before`` seconds replica B starts and ten more clients stream through B. The worker's held requests
(running + waiting) are sampled every 50 ms: the join must not push them over what the gateways together
may send (A keeps its long streams while its part shrinks; B leaves A's excess unused until it drains). One
over 4 is the learned limit probing upwards (every ~30 s), which a single gateway does too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from loadtest.harness.fixtures import gauge
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim

ENGINE_LIMIT = 4


async def stream_forever(url: str, stop: asyncio.Event, clients: int) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        async def one() -> None:
            while not stop.is_set():
                try:
                    async with client.stream("POST", url + "/v1/chat/completions",
                                             headers={"Authorization": "Bearer tg-demo-premium-change-me"},
                                             json={"model": "sim-llama-8b", "max_tokens": 200, "stream": True,
                                                   "messages": [{"role": "user", "content": "Tell a story"}]}) as r:
                        async for _ in r.aiter_bytes():
                            pass
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)
        await asyncio.gather(*(one() for _ in range(clients)))


async def main(before_s: float, after_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(Path(tmp), "--max-num-seqs", str(ENGINE_LIMIT), "--decode-base-ms", "12")
        policy = build_policy([sim.url], "default", scheduling="priority", cache=False)
        policy["state"] = {"redis_url": "redis://127.0.0.1:6379/0", "namespace": f"join-{time.time_ns()}"}
        procs = [sim, start_gateway(Path(tmp), policy)]
        stop, held = asyncio.Event(), []

        async def sample() -> None:
            async with httpx.AsyncClient() as client:
                while not stop.is_set():
                    text = (await client.get(sim.url + "/metrics")).text
                    held.append((time.monotonic(), int(gauge(text, "vllm:num_requests_running{")
                                                       + gauge(text, "vllm:num_requests_waiting{"))))
                    await asyncio.sleep(0.05)
        try:
            tasks = [asyncio.create_task(sample()), asyncio.create_task(stream_forever(procs[1].url, stop, 10))]
            await asyncio.sleep(before_s)
            joined = time.monotonic()
            procs.append(await asyncio.to_thread(start_gateway, Path(tmp), policy))
            tasks.append(asyncio.create_task(stream_forever(procs[2].url, stop, 10)))
            await asyncio.sleep(after_s)
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for proc in procs:
                proc.kill()
    start = held[0][0] + 5  # after the limit is learned
    parts = {"before the join": [h for t, h in held if start < t < joined],
             "after the join": [h for t, h in held if t >= joined]}
    return {name: {"samples": len(rows), "held_max": max(rows), "over_engine_limit": sum(h > ENGINE_LIMIT
                                                                                           for h in rows)}
            for name, rows in parts.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=float, default=15.0)
    parser.add_argument("--after", type=float, default=20.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.before, args.after)), indent=2))
