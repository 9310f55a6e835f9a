"""Benchmarks of the simulated worker (python -m loadtest run sim).

1. capacity: zero step costs, the sim pinned to one core and the client (this process, the load
   generator) to the other: non-streaming requests/s and streamed tokens/s, with the CPU per request
   of each side. Neither may be the bottleneck of a gateway benchmark.
2. scaling: the calibrated 8B/A100 model, concurrency 1 -> max_num_seqs: total tokens/s rises while
   TPOT grows, as on a GPU.
3. kv: a small KV cache under more concurrent context than it holds: requests queue
   (vllm:num_requests_waiting > 0) and running sequences get preempted.
4. startup: time from process start to /health 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness.procs import start_sim
from loadtest.harness.runner import run
from loadtest.harness.spec import Spec
from loadtest.harness.stats import percentile
from workers.process import free_port

CLIENT_CPU, SERVER_CPU = 1, 0


def spec(concurrency: int, duration: float, max_tokens: int, prompt: int, stream: bool) -> Spec:
    return Spec.model_validate({
        "name": "bench", "arrival": {"mode": "closed", "concurrency": concurrency}, "duration_s": duration,
        "classes": [{"name": "c", "model": "sim-llama-8b", "stream": stream,
                     "prompt_tokens": {"dist": "fixed", "value": prompt},
                     "max_tokens": {"dist": "fixed", "value": max_tokens}}]})


def measure(url: str, s: Spec) -> dict[str, Any]:
    cpu0 = time.process_time()
    result = asyncio.run(run(s, url))
    client_cpu = time.process_time() - cpu0
    ok = [r for r in result.results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    tpot = [r.tpot for r in ok if r.tpot is not None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    return {"requests": len(result.results), "errors": len(result.results) - len(ok),
            "req_per_s": round(len(ok) / result.elapsed, 1), "tokens_per_s": round(tokens / result.elapsed, 1),
            "tpot_mean_ms": round(sum(tpot) / len(tpot) * 1000, 2) if tpot else None,
            "ttft_p50_ms": round((percentile(ttft, 50) or 0) * 1000, 2),
            "ttft_p99_ms": round((percentile(ttft, 99) or 0) * 1000, 2), "elapsed_s": round(result.elapsed, 2),
            "client_cpu_share": round(client_cpu / result.elapsed, 2),
            "client_cpu_ms_per_request": round(client_cpu / max(len(result.results), 1) * 1000, 3)}


def capacity(log_dir: Path) -> dict[str, Any]:
    os.sched_setaffinity(0, {CLIENT_CPU})
    sim = start_sim(log_dir, "--zero-delay", cpu=SERVER_CPU)
    try:
        out = {}
        for name, s in (("non_stream_c1", spec(1, 5, 16, 32, False)),
                        ("non_stream_c16", spec(16, 5, 16, 32, False)),
                        ("non_stream_c64", spec(64, 8, 16, 32, False)),
                        ("stream_c64_256tok", spec(64, 8, 256, 32, True))):
            cpu0 = sim.cpu_seconds()
            row = measure(sim.url, s)
            row["sim_cpu_share"] = round((sim.cpu_seconds() - cpu0) / row["elapsed_s"], 2)
            row["sim_cpu_ms_per_request"] = round((sim.cpu_seconds() - cpu0) / max(row["requests"], 1) * 1000, 3)
            out[name] = row
        return out
    finally:
        sim.kill()
        os.sched_setaffinity(0, {0, 1})


def scaling(log_dir: Path, levels: list[int]) -> list[dict[str, Any]]:
    sim = start_sim(log_dir)  # calibrated defaults: 12 ms + 0.15 ms/seq per step, 256 seqs
    try:
        rows = []
        for c in levels:
            row = measure(sim.url, spec(c, 10, 64, 128, True))
            rows.append({"concurrency": c, **row})
            print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        sim.kill()


def kv_pressure(log_dir: Path) -> dict[str, Any]:
    # 512 blocks x 16 = 8,192 tokens of KV; 64 requests x (256 prompt + 256 output) = 32,768 tokens wanted.
    sim = start_sim(log_dir, "--num-blocks", "512", "--max-num-seqs", "256")
    samples: list[dict[str, float]] = []

    async def scrape(stop: asyncio.Event) -> None:
        async with httpx.AsyncClient() as client:
            while not stop.is_set():
                text = (await client.get(sim.url + "/metrics")).text
                sample = {}
                for line in text.splitlines():
                    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"):
                        if line.startswith(name + "{"):
                            sample[name] = float(line.rsplit(" ", 1)[1])
                samples.append(sample)
                await asyncio.sleep(0.2)

    async def main() -> dict[str, Any]:
        stop = asyncio.Event()
        scraper = asyncio.ensure_future(scrape(stop))
        result = await run(spec(64, 15, 256, 256, True), sim.url)
        stop.set()
        await scraper
        ok = [r for r in result.results if r.ok]
        ttft = [r.ttft for r in ok if r.ttft is not None]
        return {"requests": len(result.results), "ok": len(ok),
                "max_waiting": max(s.get("vllm:num_requests_waiting", 0) for s in samples),
                "max_running": max(s.get("vllm:num_requests_running", 0) for s in samples),
                "max_kv_usage": max(s.get("vllm:kv_cache_usage_perc", 0) for s in samples),
                "preemptions": max(s.get("vllm:num_preemptions_total", 0) for s in samples),
                "ttft_p50_ms": round((percentile(ttft, 50) or 0) * 1000, 1),
                "ttft_p99_ms": round((percentile(ttft, 99) or 0) * 1000, 1)}
    try:
        return asyncio.run(main())
    finally:
        sim.kill()


def startup() -> dict[str, float]:
    times = []
    for _ in range(5):
        port = free_port()
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "workers.sim", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.01)
        times.append(time.perf_counter() - t0)
        proc.kill()
        proc.wait()
    return {"ready_s_min": round(min(times), 3), "ready_s_max": round(max(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["startup", "capacity", "scaling", "kv"])
    parser.add_argument("--levels", default="1,4,16,64,128,256")
    parser.add_argument("--out", default="loadtest/results/engine/sim.json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        for part in args.parts:
            if part == "startup":
                results["startup"] = startup()
            elif part == "capacity":
                results["capacity"] = capacity(log_dir)
            elif part == "scaling":
                results["scaling"] = scaling(log_dir, [int(x) for x in args.levels.split(",")])
            elif part == "kv":
                results["kv"] = kv_pressure(log_dir)
            else:
                sys.exit(f"unknown part {part!r}")
            print(part, json.dumps(results[part], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
