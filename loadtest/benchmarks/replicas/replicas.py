"""The 2x overload against two gateway replicas behind nginx (python -m loadtest run replicas).

Each arm: two small simulated workers (4 sequences, 12 ms decode steps: ~10 req/s together for 64-token
answers), two gateway replicas in front of both, and nginx (deploy/nginx/tollgate.conf) in front of the
replicas; the overload-2x scenario (premium/standard/batch 20/30/50 at twice the workers' capacity) goes to
nginx. Arms, in alternating rounds:

- split: the replicas share Redis (state.redis_url), so each takes its part of every worker's limit;
- alone: no shared state, each replica uses a worker's whole limit (what two unaware replicas do).

Reported per arm: per class TTFT p50/p95 and sheds, and per worker the requests it held (running + waiting)
sampled every 50 ms, against the engine's limit (4): how often and by how much the replicas together
overfilled it, and the most it ever held (the simulator's own high-water mark).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness.fixtures import gauge
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import ROOT, SMALL_SIM, Proc, start_gateway, start_nginx, start_sim
from loadtest.harness.report import per_class
from loadtest.harness.runner import Run, run
from loadtest.harness.spec import load_spec

ENGINE_LIMIT = int(SMALL_SIM[SMALL_SIM.index("--max-num-seqs") + 1])


def arm_policy(workers: list[str], split: bool, namespace: str, engine_priority: bool = False) -> dict[str, Any]:
    policy = build_policy(workers, "default", scheduling="priority", cache=False)
    policy["pools"]["local-sim"]["engine_priority"] = engine_priority
    if split:
        policy["state"] = {"redis_url": "redis://127.0.0.1:6379/0", "namespace": namespace}
    return policy


async def watch(sims: list[Proc], samples: dict[str, list[int]], stop: asyncio.Event) -> None:
    """Requests each worker holds (running + waiting), every 50 ms."""
    async with httpx.AsyncClient(timeout=2) as client:
        while not stop.is_set():
            for sim in sims:
                text = (await client.get(sim.url + "/metrics")).text
                held = gauge(text, "vllm:num_requests_running{") + gauge(text, "vllm:num_requests_waiting{")
                samples.setdefault(sim.url, []).append(int(held))
            await asyncio.sleep(0.05)


async def one_round(spec: Any, url: str, sims: list[Proc], samples: dict[str, list[int]]) -> Run:
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(sims, samples, stop))
    try:
        return await run(spec, url)
    finally:
        stop.set()
        await watcher


def held_report(sims: list[Proc], samples: dict[str, list[int]]) -> dict[str, Any]:
    out = {}
    for i, sim in enumerate(sims):
        rows = samples.get(sim.url, [])
        over = [h for h in rows if h > ENGINE_LIMIT]
        text = httpx.get(sim.url + "/metrics").text
        out[f"worker-{i}"] = {"samples": len(rows), "held_max_sampled": max(rows, default=0),
                              "samples_over_limit": len(over),
                              "share_over_limit": round(len(over) / max(1, len(rows)), 4),
                              "held_max_ever": int(gauge(text, "tollgate_sim_requests_held_max"))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=str(ROOT / "loadtest" / "scenarios" / "overload-2x.yaml"))
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load per arm")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="loadtest/results/replicas")
    parser.add_argument("--engine-priority", action="store_true", help="the workers schedule by priority "
                        "(--scheduling-policy priority) and the pool says so (engine_priority: premium may go "
                        "past the limit)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    results: dict[str, Run] = {}
    samples: dict[str, dict[str, list[int]]] = {"split": {}, "alone": {}}
    table: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs: list[Proc] = []
        arms: dict[str, tuple[str, list[Proc], list[Proc]]] = {}
        try:
            for arm in ("split", "alone"):
                flags = (*SMALL_SIM, "--scheduling-policy", "priority") if args.engine_priority else SMALL_SIM
                sims = [start_sim(Path(tmp), *flags) for _ in range(2)]
                policy = arm_policy([s.url for s in sims], arm == "split", f"bench-{int(time.time())}",
                                    args.engine_priority)
                gateways = [start_gateway(Path(tmp), policy) for _ in range(2)]
                front = start_nginx(Path(tmp), [g.port for g in gateways])
                procs += [*sims, *gateways, front]
                arms[arm] = (front.url, sims, gateways)
            per_round = args.duration / args.rounds
            for i in range(args.rounds):
                for arm in (("split", "alone") if i % 2 == 0 else ("alone", "split")):
                    url, sims, _ = arms[arm]
                    part = asyncio.run(one_round(spec.model_copy(update={"duration_s": per_round}), url, sims,
                                                 samples[arm]))
                    if arm in results:
                        results[arm].extend(part)
                    else:
                        results[arm] = part
            for arm, (_, sims, gateways) in arms.items():
                limits = [httpx.get(g.url + "/admin/queues", headers={"Authorization": "Bearer "
                                                                       "tg-admin-demo-change-me"}).json()
                          for g in gateways]
                failures = collections.Counter(f"{r.cls} {r.status} {r.error}" for r in results[arm].results
                                               if not r.ok and r.status != 429)
                sheds = collections.Counter()
                for g in gateways:
                    for line in httpx.get(g.url + "/metrics").text.splitlines():
                        if line.startswith("tollgate_shed_total{"):
                            sheds[line.split("{", 1)[1].split("}", 1)[0]] += int(float(line.rsplit(" ", 1)[1]))
                table[arm] = {"classes": per_class(results[arm]), "failures": dict(failures), "sheds": dict(sheds),
                              "workers": held_report(sims, samples[arm]),
                              "limits": [{k: q["pools"]["local-sim"][k]
                                          for k in ("learned_limits", "agreed_limits", "share")} for q in limits]}
        finally:
            for proc in procs:
                proc.kill()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    suffix = "-engine-priority" if args.engine_priority else ""
    Path(args.out, f"{spec.name}-replicas{suffix}.json").write_text(json.dumps(table, indent=2))
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
