"""Fairness on traffic shapes nobody picked, drawn from a seed (python -m loadtest run shapes --seed N).

Each shape is drawn at run time: 2-20 tenants, some quiet (each 5-50% of an equal share of the tokens the pool
serves) and some flooding; all standard, all premium, or quiet premium tenants beside floods of both classes (a quiet
standard tenant beside a premium flood is starved by design: strict priority); per tenant a prompt and an answer
length (log-uniform, 16-2,048 tokens; each request lognormal around them); 1-4 simulated workers of 4-64
sequences; overload 1.1x-3x of the pool's capacity, all tenants together.

The gateway's own scheduler (gateway.scheduling.Controller, unchanged, its capacity learner included) runs on a
virtual clock: an asyncio loop whose time is the simulation's, so deadlines, forecasts and drain rates are the
scheduler's own, and a run's figures do not depend on this machine's speed or load (nothing is timed on the
host). The engine is arithmetic: a worker runs up to its sequences (more wait in its own queue, in arrival
order), prefills prompts one after another (0.05 ms a prompt token, no prefix cache), then decodes for
``out x step``, the step chosen per shape so that a mean answer takes about a second. The gateway reads its
running (its sequences, prefilling or decoding) and waiting (its queue) every 0.5 s, as it reads vLLM's
metrics, and learns its limit from them; a request goes to
the worker with room that holds fewest. Requests are streamed: the gateway hears each first token. One gateway
process (the replicas' heartbeats are not simulated).

Per shape, three runs of the same arrivals: the quiet tenants alone, everyone under ``served_tokens``, and
everyone under ``fcfs``. Reported over the shapes: the quiet tenants' TTFT p95 beside the flood against alone
(the worst quiet tenant of each shape; ``max(beside, 100 ms) / max(alone, 100 ms)``) as p50, p90 and max, their
errors, Jain's index of tokens served among the tenants backlogged through the run, and goodput (tokens served
within the run) against ``fcfs``. Goals (issue 47): max ratio <= 1.5, p90 <= 1.25, no quiet errors, goodput
within 5% of fcfs.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import random
import selectors
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.errors import Shed
from gateway.fleet.worker import Observed, Worker
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy
from gateway.scheduling.controller import Controller
from loadtest.harness.stats import percentile

PREFILL_S = 0.00005  # a prompt token's prefill
FLOOR_S = 0.1  # the goal's floor under a p95
WARM_S = 5.0  # arrivals before this are not measured (the gateway learns the engines' limits)
CLASSES = ("premium", "standard")
SCRAPE_S = 0.5  # the gateway reads the engines' metrics this often


@dataclass(frozen=True)
class Tenant:
    name: str
    klass: str
    quiet: bool
    rate: float  # requests a second
    prompt: int
    answer: int


@dataclass(frozen=True)
class Shape:
    seed: int
    tenants: list[Tenant]
    workers: list[int]  # sequences per worker
    overload: float
    step: float  # seconds a decode step takes


@dataclass(frozen=True)
class Arrival:
    at: float
    tenant: str
    prompt: int
    out: int
    max_out: int


@dataclass
class Outcome:
    ttft: dict[str, list[float]] = field(default_factory=dict)  # measured arrivals' TTFT, by tenant
    engine: dict[str, list[float]] = field(default_factory=dict)  # of which in the engine before its prefill
    errors: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)  # tokens, measured window
    backlogged: dict[str, float] = field(default_factory=dict)  # share of samples with requests queued


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def draw_shape(seed: int) -> Shape:
    rng = random.Random(seed)
    n = rng.randint(2, 20)
    quiet_n = rng.randint(1, max(1, n // 2))
    kind = rng.choice(("standard", "premium", "mixed"))
    if kind == "mixed":  # quiet premium tenants, floods of both classes (one premium at least)
        floods = ["premium", *(rng.choice(("premium", "standard")) for _ in range(n - quiet_n - 1))]
        classes = ["premium"] * quiet_n + floods
    else:
        classes = [kind] * n
    lengths = [(_log_uniform(rng, 16, 2048), _log_uniform(rng, 16, 2048)) for _ in range(n)]
    workers = [rng.randint(4, 64) for _ in range(rng.randint(1, 4))]
    overload = rng.uniform(1.1, 3.0)
    mean_out = statistics.mean(out for _, out in lengths)
    step = 1.0 / mean_out  # a mean answer in about a second
    # requests a second: each worker's sequences over an answer's time, or its prefills one after another
    service = statistics.mean(p * PREFILL_S + out * step for p, out in lengths)
    prefill = statistics.mean(p * PREFILL_S for p, _ in lengths)
    capacity = sum(min(seqs / service, 1 / prefill) for seqs in workers)
    # a quiet tenant's tokens a second are 5-50% of an equal share of what the pool serves (the counter's measure)
    tokens = capacity * statistics.mean(p + out for p, out in lengths)
    quiet_rates = [tokens / n * rng.uniform(0.05, 0.5) / sum(lengths[i]) for i in range(quiet_n)]
    flood_weights = [rng.uniform(1, 4) for _ in range(n - quiet_n)]
    left = max(0.1, overload * capacity - sum(quiet_rates))
    flood_rates = [left * w / sum(flood_weights) for w in flood_weights]
    tenants = [Tenant(f"t{i}", classes[i], i < quiet_n, rate, *lengths[i])
               for i, rate in enumerate([*quiet_rates, *flood_rates])]
    return Shape(seed, tenants, workers, round(overload, 2), step)


def arrivals(shape: Shape, duration: float) -> list[Arrival]:
    rng = random.Random(shape.seed + 1)
    out = []
    for tenant in shape.tenants:
        at = rng.expovariate(tenant.rate)
        while at < duration:
            prompt = min(2048, max(16, round(rng.lognormvariate(math.log(tenant.prompt), 0.5))))
            answer = min(2048, max(16, round(rng.lognormvariate(math.log(tenant.answer), 0.5))))
            out.append(Arrival(at, tenant.name, prompt, answer, max(answer, tenant.answer * 2)))
            at += rng.expovariate(tenant.rate)
    return sorted(out, key=lambda a: a.at)


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is the simulation's: timers fire when the simulation reaches them."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def next_timer(self) -> float:
        scheduled = [h.when() for h in getattr(self, "_scheduled", []) if not h.cancelled()]
        return min(scheduled, default=math.inf)


def policy_of(shape: Shape, fairness: str) -> PolicySnapshot:
    return PolicySnapshot.build(Policy.model_validate({
        "tenants": {t.name: {"tier": t.klass} for t in shape.tenants},
        "models": {"m": {"pool": "p"}},
        "pools": {"p": {"workers": [f"http://w{i}" for i in range(len(shape.workers))],
                        "max_inflight_per_worker": 256}},
        "server": {"tenant_max_concurrency": 100_000},
        "scheduling": {} if fairness == "default" else {"fairness": fairness}}), "shapes")


@dataclass
class Engine:
    """One simulated worker: ``seqs`` sequences; more wait in its own queue; prompts prefilled one after another."""

    seqs: int
    running: int = 0
    queue: list[Callable[[], None]] = field(default_factory=list)
    prefill_free: float = 0.0


async def _run(loop: VirtualLoop, shape: Shape, reqs: list[Arrival], fairness: str, duration: float) -> Outcome:
    snap = policy_of(shape, fairness)
    workers = [Worker(f"http://w{i}", "p", observed=Observed(healthy=True)) for i in range(len(shape.workers))]
    engines = {w.url: Engine(seqs) for w, seqs in zip(workers, shape.workers, strict=True)}
    controller = Controller(clock=loop.time, scheduling=lambda: snap.policy.scheduling)
    controller.track("p", workers, snap.policy.pools["p"])
    events: list[tuple[float, int, Callable[[], None]]] = []
    outcome, seq = Outcome(), 0
    samples = 0
    queued_at: dict[str, int] = {}

    def schedule(at: float, action: Callable[[], None]) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, action))

    def scrape() -> None:
        for worker in workers:
            engine = engines[worker.url]  # as vLLM counts: running are scheduled (prefilling too), waiting queued
            worker.observed.waiting, worker.observed.running = len(engine.queue), engine.running
            worker.observed.scraped_at = loop.now
        controller.metrics_changed("p")
        schedule(loop.now + SCRAPE_S, scrape)

    async def one(req: Arrival) -> None:
        ctx = RequestContext(f"{req.tenant}-{req.at}", snap, CHAT)
        ctx.tenant = snap.tenants[req.tenant]
        ctx.service_class = ctx.tenant.tier
        ctx.stream = True  # streamed: the gateway hears each answer's first token
        measured = req.at >= WARM_S
        try:
            handle = await controller.admit(ctx, "p", req.prompt + req.max_out, 4 * req.prompt)
        except Shed:
            if measured:
                outcome.errors[req.tenant] = outcome.errors.get(req.tenant, 0) + 1
            return
        room = (controller.with_room(handle, snap.policy.scheduling, ctx) if OLD_API else  # type: ignore[call-arg]
                controller.with_room(handle, snap.policy.scheduling)) or set(workers)
        worker = min(room, key=lambda w: (engines[w.url].prefill_free if PLACEMENT == "prefill" else 0.0,
                                          w.inflight, w.url))
        worker.inflight += 1
        engine = engines[worker.url]
        sent = loop.now
        if OLD_API:  # the rules' own placement counted prefills by the worker they were sent to
            controller.sent(ctx, handle, 4 * req.prompt, worker)  # type: ignore[attr-defined]

        def start() -> None:
            engine.running += 1
            begin = max(loop.now, engine.prefill_free)
            first = engine.prefill_free = begin + req.prompt * PREFILL_S
            end = first + req.out * shape.step
            if measured:
                outcome.ttft.setdefault(req.tenant, []).append(first - req.at)
                outcome.engine.setdefault(req.tenant, []).append(begin - sent)
            schedule(first, lambda: controller.first_token(ctx, handle, worker, snap.policy.scheduling,
                                                           worker.inflight, first - sent))

            def done() -> None:
                engine.running -= 1
                worker.inflight -= 1
                ctx.prompt_tokens, ctx.completion_tokens = req.prompt, req.out
                controller.release(ctx, handle)
                if WARM_S <= end <= duration:
                    outcome.served[req.tenant] = outcome.served.get(req.tenant, 0) + req.prompt + req.out
                if engine.queue:
                    engine.queue.pop(0)()
            schedule(end, done)

        if engine.running < engine.seqs:
            start()
        else:
            engine.queue.append(start)

    tasks: set[asyncio.Task[None]] = set()
    pending = list(reversed(reqs))
    sample_at = WARM_S
    scrape()
    while pending or len(events) > 1:
        at = min(pending[-1].at if pending else math.inf, events[0][0] if events else math.inf,
                 loop.next_timer(), sample_at if sample_at < duration else math.inf)
        if at > duration * 2:
            break
        loop.now = max(loop.now, at)
        while pending and pending[-1].at <= loop.now:
            task = asyncio.ensure_future(one(pending.pop()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while events and events[0][0] <= loop.now:
            heapq.heappop(events)[2]()
        if sample_at <= loop.now and sample_at < duration:
            samples += 1
            for tenant in _queued(controller):
                queued_at[tenant] = queued_at.get(tenant, 0) + 1
            sample_at += 0.1
        for _ in range(4):
            await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    outcome.backlogged = {t: n / max(1, samples) for t, n in queued_at.items()}
    return outcome


PLACEMENT = "held"  # or "prefill" (--placement): the worker with room whose prefills end first
OLD_API = hasattr(Controller, "sent")  # a checkout from before flows (--policies default on its PYTHONPATH)


def _queued(controller: Controller) -> set[str]:
    """The tenants with requests queued (read from the admin snapshot, which an older checkout has too)."""
    classes: dict[str, Any] = controller.snapshot(["p"])["p"]["classes"]  # type: ignore[assignment]
    return {t for c in classes.values() for t, n in (c.get("by_tenant") or {
        f: v["queued"] for f, v in c.get("flows", {}).items()}).items() if n}


def simulate(shape: Shape, reqs: list[Arrival], fairness: str, duration: float) -> Outcome:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(_run(loop, shape, reqs, fairness, duration))
    finally:
        loop.close()


def jain(values: list[int]) -> float | None:
    """Jain's index of ``values`` (None for fewer than two)."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if len(values) > 1 and any(values) else None


def _p95(values: list[float]) -> float:
    return percentile(values, 95) or 0.0


def measure(seed: int, duration: float, policies: list[str]) -> dict[str, Any]:
    shape = draw_shape(seed)
    reqs = arrivals(shape, duration)
    quiet = {t.name for t in shape.tenants if t.quiet}
    alone = simulate(shape, [r for r in reqs if r.tenant in quiet], policies[0], duration)
    runs = {name: simulate(shape, reqs, name, duration) for name in policies}
    row: dict[str, Any] = {"seed": seed, "tenants": len(shape.tenants), "quiet": len(quiet),
                           "classes": sorted({t.klass for t in shape.tenants}),
                           "workers": shape.workers, "overload": shape.overload}
    for name, run in runs.items():
        ratios = [max(_p95(run.ttft.get(t, [])), FLOOR_S) / max(_p95(alone.ttft.get(t, [])), FLOOR_S)
                  for t in quiet if alone.ttft.get(t)]
        backlogged = {t.name: t.klass for t in shape.tenants if run.backlogged.get(t.name, 0) >= 0.9}
        jains = [jain([run.served.get(t, 0) for t, k in backlogged.items() if k == klass]) for klass in CLASSES]
        worst = max(quiet, key=lambda t: _p95(run.ttft.get(t, [])))
        row[name] = {"quiet_ratio": round(max(ratios, default=1.0), 3),
                     "quiet_p95_ms": round(_p95(run.ttft.get(worst, [])) * 1000, 1),
                     "its_engine_p95_ms": round(_p95(run.engine.get(worst, [])) * 1000, 1),
                     "quiet_errors": sum(run.errors.get(t, 0) for t in quiet),
                     "quiet_requests": sum(len(run.ttft.get(t, [])) for t in quiet),
                     "jain_backlogged": _round(min((j for j in jains if j is not None), default=None)),
                     "backlogged": len(backlogged), "tokens": sum(run.served.values())}
    row["alone_quiet_p95_ms"] = round(max((_p95(alone.ttft.get(t, [])) for t in quiet), default=0) * 1000, 1)
    if "fcfs" in runs:
        tokens = {name: sum(run.served.values()) for name, run in runs.items()}
        row["goodput_vs_fcfs"] = {name: _round(n / tokens["fcfs"] if tokens["fcfs"] else None)
                                  for name, n in tokens.items() if name != "fcfs"}
    return row


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def summary(rows: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"shapes": len(rows)}
    for name in policies:
        ratios = [r[name]["quiet_ratio"] for r in rows]
        jains = [r[name]["jain_backlogged"] for r in rows if r[name]["jain_backlogged"] is not None]
        out[name] = {"quiet_ratio": {"p50": _round(percentile(ratios, 50)), "p90": _round(percentile(ratios, 90)),
                                     "max": max(ratios)},
                     "shapes_over_1_5": sum(r > 1.5 for r in ratios),
                     "quiet_errors": sum(r[name]["quiet_errors"] for r in rows),
                     "quiet_requests": sum(r[name]["quiet_requests"] for r in rows),
                     "jain_backlogged": {"min": _round(min(jains, default=None)),
                                         "median": _round(percentile(jains, 50))}}
        goodput = [r["goodput_vs_fcfs"][name] for r in rows if r.get("goodput_vs_fcfs", {}).get(name) is not None]
        if goodput:
            out[name]["goodput_vs_fcfs"] = {"min": _round(min(goodput)), "median": _round(percentile(goodput, 50))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, required=True, help="draws the shapes (give a new one each run)")
    parser.add_argument("--shapes", type=int, default=30)
    parser.add_argument("--duration", type=float, default=30.0, help="virtual seconds of arrivals per run")
    parser.add_argument("--policies", default="served_tokens,fcfs",
                        help="scheduling.fairness values to run, comma-separated; 'default' sets none (a checkout "
                        "from before the setting, on PYTHONPATH)")
    parser.add_argument("--placement", choices=("held", "prefill"), default="held",
                        help="held: the worker with room holding fewest, as the gateway's router without a prefix; "
                        "prefill: the one whose prefills end first (what a placement scorer could aim at)")
    parser.add_argument("--out", help="write every shape's row and the summary here (JSON)")
    args = parser.parse_args()
    global PLACEMENT
    PLACEMENT = args.placement
    policies = args.policies.split(",")
    rows = []
    for i in range(args.shapes):
        rows.append(measure(args.seed * 1000 + i, args.duration, policies))
        print(json.dumps(rows[-1]), flush=True)
    result = {"seed": args.seed, "duration_s": args.duration, "summary": summary(rows, policies), "rows": rows}
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
