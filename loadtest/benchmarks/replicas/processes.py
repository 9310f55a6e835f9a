"""Throughput of `tollgate serve --workers 1` against `--workers 2` (python -m loadtest run processes).

A zero-delay simulated worker, then the gateway with N processes (alternating N = 1 and 2, ``--starts`` each),
and a closed-loop client of plain 16-token chats at ``--concurrency``. Reported per run: requests per second,
and the gateway's CPU per request (all its processes, from /proc). On this 2-core machine the worker and the
client share the cores with the gateway, so the second process can add only what they leave. Both arms count
the tenant's budget in Redis (several processes need shared counters; one process uses the same here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from loadtest.harness.policy import build_policy
from loadtest.harness.procs import _TICK, start, start_sim
from loadtest.harness.runner import run
from loadtest.harness.spec import closed_spec as spec
from workers.process import free_port


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (the supervisor and its gateway processes)."""
    pids = [pid, *(int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                    text=True).stdout.split())]
    total = 0.0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def one(tmp: Path, worker: str, processes: int, concurrency: int, seconds: float) -> dict[str, float]:
    port = free_port()
    path = tmp / f"policy-{port}.yaml"
    the_policy = build_policy([worker], "bench")  # its tenant has a budget: counted in Redis, as several processes need
    the_policy["state"] = {"redis_url": "redis://127.0.0.1:6379/0", "namespace": f"bench-{port}"}
    path.write_text(yaml.safe_dump(the_policy))
    gateway = start([sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port", str(port),
                     "--data-dir", str(tmp / f"data-{port}"), "--workers", str(processes)], port,
                    tmp / f"gw-{port}.log", "/readyz", timeout=60)
    try:
        asyncio.run(run(spec(concurrency, False, 16, 2.0), gateway.url))  # warm up
        before = tree_cpu(gateway.pid)
        result = asyncio.run(run(spec(concurrency, False, 16, seconds), gateway.url))
        cpu = tree_cpu(gateway.pid) - before
    finally:
        gateway.kill()
    ok = sum(r.ok for r in result.results)
    return {"req_per_s": round(ok / result.elapsed, 1), "cpu_ms_per_request": round(cpu / max(ok, 1) * 1000, 3),
            "errors": len(result.results) - ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        sim = start_sim(tmp, "--zero-delay")
        try:
            for _ in range(args.starts):
                for n in (1, 2):
                    runs[n].append(one(tmp, sim.url, n, args.concurrency, args.seconds))
                    print(n, runs[n][-1], flush=True)
        finally:
            sim.kill()
    print(json.dumps({f"--workers {n}": {
        "req_per_s_median": statistics.median(r["req_per_s"] for r in rows),
        "cpu_ms_per_request_median": statistics.median(r["cpu_ms_per_request"] for r in rows),
        "errors": sum(r["errors"] for r in rows)} for n, rows in runs.items()}, indent=2))


if __name__ == "__main__":
    main()
