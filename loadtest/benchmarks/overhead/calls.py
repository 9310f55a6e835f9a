"""Python function calls per request through one checkout's pipeline, under cProfile
(PYTHONPATH=CHECKOUT python -P loadtest/benchmarks/overhead/calls.py; for this checkout: python -m loadtest run calls).

CPU seconds per request swing by ±50% run to run when the machine is shared (the ab benchmark's spreads on 2026-12-02:
0.50-1.52 ms for one arm's plain requests), so a change of a few percent cannot be seen in them. The number of
function calls a request makes is the same from run to run whatever else the machine does: this runs plain and
streamed chats through one checkout's pipeline in this process (no HTTP edge: the lifecycle and ``run``, as a batch
line enters them) against a zero-delay simulated worker in a process of its own, under cProfile, and prints the
calls per request in all and in the gateway's own modules. Compare two checkouts by running it under each's
PYTHONPATH; a request's CPU follows its calls closely when no call is a new heavy one (read the top of the
profile it prints for that).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any


def bench_policy(worker: str) -> dict[str, Any]:
    """The ``bench`` policy of the checkout on PYTHONPATH: its harness's, or, in a checkout from before
    loadtest/harness/ (e.g. bdae962), its loadtest.bench_overhead's (the same policy then)."""
    if old_layout():
        from loadtest.bench_overhead import policy
        return policy(worker)
    from loadtest.harness.policy import build_policy
    return build_policy([worker], "bench")


def old_layout() -> bool:
    """The checkout on PYTHONPATH is from before loadtest/harness/ (asked of its files: an editable install's
    finder would hand it this tree's harness)."""
    import loadtest

    return not (Path(loadtest.__file__).parent / "harness").is_dir()


async def measure(n: int, stream: bool, worker: str) -> tuple[float, float, pstats.Stats]:
    import gateway
    from gateway import pipeline
    from gateway.context import RequestContext
    from gateway.policy.loader import PolicySnapshot, PolicyStore
    from gateway.policy.schema import Policy
    from gateway.runtime import Gateway
    from gateway.sink import BufferSink

    endpoint: object = "chat"  # a checkout from before the Endpoint objects named its APIs by string
    if (Path(gateway.__file__).parent / "endpoints").is_dir():  # (an editable install would find another's)
        from gateway.endpoints import CHAT
        endpoint = CHAT
    snapshot = PolicySnapshot.build(Policy.model_validate(bench_policy(worker)), "bench")
    gw = Gateway(PolicyStore(snapshot))
    body = (b'{"model":"sim-llama-8b","messages":[{"role":"user","content":"' + b"tell me more " * 10 +
            b'"}],"max_tokens":16,"stream":' + (b"true" if stream else b"false") + b"}")

    async def one() -> None:
        ctx = RequestContext("bench", gw.store.current, endpoint)  # type: ignore[arg-type]
        ctx.tenant = gw.store.current.tenants["bench"]
        sink = BufferSink()
        async with pipeline.Lifecycle(gw, ctx, sink):
            await pipeline.run(gw, ctx, body, sink)
        assert sink.status == 200, sink.body[:300]

    async with gw.lifespan():
        for _ in range(100):  # connections open, the capacity learned, every path warm
            await one()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(n):
            await one()
        profile.disable()
    stats = pstats.Stats(profile)
    calls = sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]
    own = sum(entry[1] for key, entry in stats.stats.items()  # type: ignore[attr-defined]
              if f"{os.sep}gateway{os.sep}" in key[0])
    return calls / n, own / n, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--top", type=int, default=0, help="print the profile's top N gateway functions too")
    args = parser.parse_args()
    if old_layout():
        from loadtest.procs import start_sim
    else:
        from loadtest.harness.procs import start_sim

    sim = start_sim(Path(tempfile.mkdtemp()), "--zero-delay")
    try:
        for kind, stream in (("plain", False), ("stream", True)):
            calls, own, stats = asyncio.run(measure(args.requests, stream, sim.url))
            print(f"{kind}: {calls:.1f} calls a request, {own:.1f} of them in gateway modules "
                  f"({args.requests} requests, gateway from {sys.modules['gateway'].__file__})")
            if args.top:
                stats.sort_stats("ncalls").print_stats(r"/gateway/", args.top)
    finally:
        sim.kill()


if __name__ == "__main__":
    main()
