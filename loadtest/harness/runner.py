"""Drive a workload at a target: closed loop at a concurrency, or open loop at a rate (Poisson or bursty).

Every run ends by itself (duration and/or request count). Ctrl-C stops it early and keeps what was
measured: the caller still writes partial results.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadtest.harness.client import Result, execute, make_session
from loadtest.harness.spec import Closed, Open, Spec
from loadtest.harness.workload import Workload

Progress = Callable[[int, float], None]


@dataclass
class Run:
    spec_name: str
    target: str
    started_at: float
    elapsed: float = 0.0
    results: list[Result] = field(default_factory=list)
    dropped: int = 0  # open loop: arrivals refused because max_inflight requests were outstanding
    interrupted: bool = False
    offered_rate: float | None = None

    def extend(self, later: Run) -> None:
        """Append a later round of the same arm, its start times shifted after this one's."""
        for r in later.results:
            r.start += self.elapsed
        self.results += later.results
        self.elapsed += later.elapsed
        self.dropped += later.dropped


async def run(spec: Spec, target: str | None = None, progress: Progress | None = None,
              rate: float | None = None, duration: float | None = None) -> Run:
    """Run ``spec`` (optionally at another open-loop ``rate`` or ``duration``, as ramp and compare do)."""
    target = (target or spec.target).rstrip("/")
    workload = Workload(spec)
    arrival = spec.arrival
    if rate is not None:
        arrival = Open(mode="open", rate=rate, process=getattr(arrival, "process", "poisson"))
    record = Run(spec.name, target, time.time(), offered_rate=getattr(arrival, "rate", None))
    limit = spec.requests
    deadline_s = duration if duration is not None else spec.duration_s
    t0 = time.perf_counter()
    deadline = t0 + deadline_s if deadline_s else float("inf")
    issued = 0

    def more() -> bool:
        return time.perf_counter() < deadline and (limit is None or issued < limit)

    ticker = asyncio.ensure_future(_tick(record, t0, progress)) if progress else None
    async with make_session() as session:
        try:
            if isinstance(arrival, Closed):
                async def user() -> None:
                    nonlocal issued
                    while more():
                        issued += 1
                        record.results.append(await execute(session, target, workload.next(), t0, spec.timeout_s))
                await asyncio.gather(*(user() for _ in range(arrival.concurrency)))
            else:
                rng = random.Random(spec.seed + 1)
                inflight: set[asyncio.Task[None]] = set()

                async def one() -> None:
                    record.results.append(await execute(session, target, workload.next(), t0, spec.timeout_s))
                next_at = time.perf_counter()
                while more():
                    next_at += _gap(arrival, rng, next_at - t0)
                    delay = next_at - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if not more():
                        break
                    issued += 1
                    if len(inflight) >= arrival.max_inflight:
                        record.dropped += 1
                        continue
                    task = asyncio.ensure_future(one())
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                if inflight:
                    await asyncio.gather(*inflight)
        except (asyncio.CancelledError, KeyboardInterrupt):
            record.interrupted = True
        finally:
            record.elapsed = time.perf_counter() - t0
            if ticker:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
    return record


def _gap(arrival: Open, rng: random.Random, now: float) -> float:
    if arrival.process == "poisson":
        return rng.expovariate(arrival.rate)
    # bursty: alternate bursts at rate*factor with quiet spells, keeping the long-run mean at `rate`
    period = arrival.burst_s * arrival.burst_factor
    in_burst = (now % period) < arrival.burst_s
    burst_rate = arrival.rate * arrival.burst_factor * 0.9
    quiet_rate = max(arrival.rate * 0.1 * arrival.burst_factor / max(arrival.burst_factor - 1, 1e-9), 1e-3)
    return rng.expovariate(burst_rate if in_burst else quiet_rate)


async def _tick(record: Run, t0: float, progress: Progress) -> None:
    while True:
        progress(len(record.results), time.perf_counter() - t0)
        await asyncio.sleep(0.5)
