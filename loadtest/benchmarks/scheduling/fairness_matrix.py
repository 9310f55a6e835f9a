"""Fairness on many traffic shapes: a quiet tenant beside a flooding one of its class, cell by cell
(python -m loadtest run fairness_matrix).

Each cell is a pool (workers x sequences), a stream length, the quiet tenant's rate as a share of the pool's
capacity, the flood's overload (both tenants together, as a multiple of capacity) and a class; both tenants send
mixed prompt lengths (lognormal, mean 256 tokens). Capacity is the simulator's arithmetic: a worker runs
``seqs`` sequences, each step takes ``decode_base + 0.15 ms x seqs`` plus 0.08 ms for each prompt token it
prefills, so it answers about ``seqs / (tokens x step)`` streams a second, less the prefills' share. The step
is chosen per cell so that an answer takes about a second (``--answer-s``), whatever its length: long streams
then do not make a round last minutes, nor short ones flood the loop with events.

Per cell, after a warm-up of both tenants (the engines show their limits), rounds of: the quiet tenant alone, the
flood alone, both. Reported: the quiet tenant's TTFT p95 alone and beside the flood, their ratio against the goal's
floor (``beside / max(alone, 100 ms)``, goal <= 1.5), the quiet tenant's errors, where its slowest requests
waited (the gateway's queue, from Server-Timing, or the engine), and the flood's answers per second alone and
beside, against what the quiet tenant's own slots would take from it (its 95th-percentile count of its own
requests holding a slot, plus one, of the pool's sequences; counted beside the flood, where its answers take
as long as the flood's: alone, in an idle engine, they are shorter, and 2 x 64's quiet tenant held 5% of the
slots alone while it sent a tenth of what the pool answers). The last cell puts two gateways (sharing Redis)
in front of the same workers, the flood sent only to one and the quiet tenant only to the other.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.auth import hash_key
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim
from loadtest.harness.runner import run
from loadtest.harness.spec import Spec
from loadtest.harness.stats import percentile

QUIET_KEY, FLOOD_KEY = "tg-bench-quiet-key", "tg-bench-flood-key"
PER_SEQ_S = 0.00015  # the simulator's default decode cost per running sequence
PREFILL_S = 0.00008 * 256  # its default prefill cost per prompt token, times the prompts' mean length
FLOOR_S = 0.1  # the goal's floor: a p95 alone below it is read as 100 ms


@dataclass(frozen=True)
class Cell:
    name: str
    workers: int = 2
    seqs: int = 8
    tokens: int = 64
    quiet_share: float = 0.1  # of capacity
    overload: float = 1.25  # both tenants together, of capacity
    tier: str = "premium"
    replicas: int = 1  # 2: two gateways sharing Redis, the flood sent to one and the quiet tenant to the other

    def step_s(self, answer_s: float) -> float:
        """The decode step that makes an answer of ``tokens`` take about ``answer_s``, at least 2 ms."""
        return max(0.002 + PER_SEQ_S * self.seqs, answer_s / self.tokens)

    def capacity(self, answer_s: float) -> float:
        """Streams per second the pool answers at full batch: ``c`` a second of decoding alone, less the steps
        every admitted prompt's prefill lengthens (``n = c (1 - n p)``)."""
        decode = self.seqs / (self.tokens * self.step_s(answer_s))
        return self.workers * decode / (1 + decode * PREFILL_S)


# One step from the shape the issue found escaping (two 8-sequence workers, 64-token streams, the quiet tenant at a
# tenth of capacity, both at 1.25x) along each axis, and the corners of the ranges the issue names.
CELLS = [
    Cell("centre"),
    Cell("quiet 1/20", quiet_share=0.05),
    Cell("quiet 1/3", quiet_share=0.33),
    Cell("16 tokens", tokens=16),
    Cell("256 tokens", tokens=256),
    Cell("1024 tokens, 1x4", workers=1, seqs=4, tokens=1024),
    Cell("1 worker x 4", workers=1, seqs=4),
    Cell("4 workers x 16", workers=4, seqs=16),
    Cell("2 workers x 64", seqs=64),
    Cell("overload 1.1x", overload=1.1),
    Cell("overload 3x", overload=3.0),
    Cell("standard", tier="standard"),
    Cell("2 replicas: flood on one", replicas=2),
]


def stream_class(name: str, key: str, tier: str, weight: float, tokens: int) -> dict[str, Any]:
    return {"name": name, "api_key": key, "tier": tier, "weight": weight, "model": "sim-llama-8b",
            "prompt_tokens": {"dist": "lognormal", "mean": 256, "sd": 256}, "max_tokens": {"dist": "fixed",
                                                                                       "value": tokens},
            "stream": True}


def spec(rate: float, classes: list[dict[str, Any]], seconds: float, seed: int, words_seed: int) -> Spec:
    return Spec.model_validate({"name": "fairness-matrix", "duration_s": seconds, "seed": seed,
                                "words_seed": words_seed, "timeout_s": 120,
                                "classes": classes,
                                "arrival": {"mode": "open", "rate": rate, "process": "poisson", "max_inflight": 4096}})


def p95_ms(values: list[float]) -> float | None:
    return round(percentile(values, 95) * 1000, 1) if values else None


def in_flight_p95(results: list[Any]) -> int:
    """The quiet tenant's own requests holding a slot at each of its arrivals, 95th percentile (what it needs
    free): from the end of its wait in the gateway's queue (Server-Timing) to the end of its answer."""
    spans = [(r.start + r.server.get("queue_wait", 0.0) / 1000, r.start + (r.total or 0.0)) for r in results]
    counts = [sum(1 for s, e in spans if s < r.start < e) for r in results]
    return int(percentile(counts, 95)) if counts else 0


def measure(cell: Cell, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    step = cell.step_s(args.answer_s)
    flags = ("--max-num-seqs", str(cell.seqs), "--decode-base-ms", f"{(step - PER_SEQ_S * cell.seqs) * 1000:.3f}")
    sims = [start_sim(tmp, *flags) for _ in range(cell.workers)]
    policy = build_policy([s.url for s in sims], "default", scheduling="priority", cache=False)
    for name, key in (("quiet", QUIET_KEY), ("flood", FLOOD_KEY)):
        policy["tenants"][name] = {"tier": cell.tier, "keys": ["sha256:" + hash_key(key)]}
    if cell.replicas > 1:
        policy["state"] = {"redis_url": "redis://127.0.0.1:6379/0", "namespace": f"bench-{uuid.uuid4().hex[:8]}"}
    gateways = [start_gateway(tmp, policy) for _ in range(cell.replicas)]
    quiet_url, flood_url = gateways[-1].url, gateways[0].url
    capacity = cell.capacity(args.answer_s)
    quiet_rate = cell.quiet_share * capacity
    flood_rate = cell.overload * capacity - quiet_rate
    quiet = stream_class("quiet", QUIET_KEY, cell.tier, quiet_rate, cell.tokens)
    flood = stream_class("flood", FLOOD_KEY, cell.tier, flood_rate, cell.tokens)
    results: dict[tuple[str, str], list[Any]] = {}
    elapsed: dict[str, float] = {}

    arms = itertools.count()

    async def arm(name: str, senders: list[tuple[str, dict[str, Any], float, int]], seconds: float,
                  seed: int) -> None:
        """Each tenant its own open-loop run, to its own gateway, at once. A tenant's run is the same in every arm
        of a round (its seed: ``seed`` plus its own offset), so the quiet tenant sends prompts of the same lengths
        at the same moments alone and beside the flood: the p95s compare the flood's effect, not two samples of
        lognormal prompts (a prompt at the 99th percentile, ~1,500 tokens, prefills for 120 ms). Their words are
        new in each arm, or the engines' prefix caches would answer the second arm's prompts sooner."""
        words = next(arms) * 100
        runs = await asyncio.gather(*(run(spec(rate, [cls], seconds, seed + offset, words + offset), url)
                                      for url, cls, rate, offset in senders))
        for (_, cls, _, _), part in zip(senders, runs, strict=True):
            results.setdefault((name, cls["name"]), []).extend(part.results)
        elapsed[name] = elapsed.get(name, 0.0) + max(part.elapsed for part in runs)

    quiet_sender, flood_sender = (quiet_url, quiet, quiet_rate, 0), (flood_url, flood, flood_rate, 1)
    try:
        if args.warmup_s:
            asyncio.run(arm("warm-up", [quiet_sender, flood_sender], args.warmup_s, 1))
        for i in range(args.rounds):
            for name, senders in (("alone", [quiet_sender]), ("flood alone", [flood_sender]),
                                  ("both", [quiet_sender, flood_sender])):
                asyncio.run(arm(name, senders, args.round_s, 10 * (i + 1)))
    finally:
        for gateway in gateways:
            gateway.kill()
        for sim in sims:
            sim.kill()

    def rows(arm: str, cls: str) -> list[Any]:
        return results.get((arm, cls), [])

    alone, beside = rows("alone", "quiet"), rows("both", "quiet")
    alone_p95 = p95_ms([r.ttft for r in alone if r.ok and r.ttft is not None])
    beside_p95 = p95_ms([r.ttft for r in beside if r.ok and r.ttft is not None])
    slow = sorted((r for r in beside if r.ok and r.ttft is not None), key=lambda r: r.ttft)[-max(1, len(beside) // 20):]
    queued = [r.server.get("queue_wait", 0.0) for r in slow]
    seconds = elapsed.get("both") or args.round_s * args.rounds
    flood_alone = sum(r.ok for r in rows("flood alone", "flood")) / (elapsed.get("flood alone") or seconds)
    flood_beside = sum(r.ok for r in rows("both", "flood")) / seconds
    needs = in_flight_p95(beside) + 1  # beside the flood: there its answers take as long as the flood's
    ratio = round(beside_p95 / max(alone_p95, FLOOR_S * 1000), 2) if alone_p95 and beside_p95 else None
    return {**asdict(cell), "step_ms": round(step * 1000, 2), "capacity_rps": round(capacity, 2),
            "quiet_rps": round(quiet_rate, 2), "flood_rps": round(flood_rate, 2),
            "quiet_sent": len(beside), "quiet_errors_beside": sum(not r.ok for r in beside),
            "quiet_errors_alone": sum(not r.ok for r in alone),
            "quiet_error_kinds": sorted({f"{r.status} {r.error or ''}".strip() for r in beside + alone if not r.ok}),
            "quiet_p95_alone_ms": alone_p95, "quiet_p95_beside_ms": beside_p95, "ratio": ratio,
            "met": ratio is not None and ratio <= 1.5 and not any(not r.ok for r in beside),
            "slowest_5pct_queue_wait_ms": round(max(queued), 1) if queued else None,
            "slowest_5pct_ttft_ms": round(slow[0].ttft * 1000, 1) if slow else None,
            "flood_answered_rps_alone": round(flood_alone, 2), "flood_answered_rps_beside": round(flood_beside, 2),
            "flood_loss": round(1 - flood_beside / flood_alone, 3) if flood_alone else None,
            "quiet_slots_share": round(needs / (cell.workers * cell.seqs), 3),
            "quiet_slots_share_alone": round((in_flight_p95(alone) + 1) / (cell.workers * cell.seqs), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default="all", help="cell names separated by ';' (a name may hold a comma: "
                        "see CELLS), or all")
    parser.add_argument("--round-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--answer-s", type=float, default=0.85, help="about how long an answer takes")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    chosen = CELLS if args.cells == "all" else [c for c in CELLS if c.name in args.cells.split(";")]
    table = []
    for cell in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(cell, args, Path(tmp))
        print(json.dumps(row), flush=True)
        table.append(row)
    if args.out:
        args.out.write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
