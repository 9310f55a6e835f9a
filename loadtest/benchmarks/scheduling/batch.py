"""A 1,000-line batch drained while premium streams run (python -m loadtest run batch).

One gateway on the embedded default's tenants in front of two small simulated workers (4 sequences, 12 ms
decode steps, the overload-2x workers). Premium streams arrive open-loop at about half the workers'
capacity. Alternating rounds run premium alone and premium while a batch of ``--lines`` lines (uploaded
and created with the real `openai` client by the batch tenant) drains. Reported: premium TTFT p50/p95 and
errors in each, and the batch's drain time and line counts. The batch only takes capacity premium is
not waiting for, so premium's TTFT should stay within its SLO (800 ms) while the batch finishes.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from loadtest.harness.policy import build_policy
from loadtest.harness.procs import SMALL_SIM, start_gateway, start_sim
from loadtest.harness.runner import Run, run
from loadtest.harness.spec import Spec
from loadtest.harness.stats import percentile

BATCH_KEY = "tg-demo-batch-change-me"


def premium_spec(rate: float, duration_s: float) -> Spec:
    return Spec.model_validate({
        "name": "premium-beside-batch", "target": "http://127.0.0.1:8080", "duration_s": duration_s, "seed": 5,
        "timeout_s": 60, "arrival": {"mode": "open", "rate": rate, "process": "poisson"},
        "classes": [{"name": "premium", "api_key": "tg-demo-premium-change-me", "tier": "premium",
                     "model": "sim-llama-8b", "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256},
                     "max_tokens": {"dist": "fixed", "value": 64}, "stream": True,
                     "slo": {"ttft_ms": 800, "total_ms": 8000}}]})


def submit_batch(url: str, lines: int, max_tokens: int) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=BATCH_KEY, max_retries=2)
    body = b"".join(json.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "sim-llama-8b", "max_tokens": max_tokens,
                 "messages": [{"role": "user", "content": f"Summarise record {i} of the archive."}]}}).encode()
        + b"\n" for i in range(lines))
    uploaded = client.files.create(file=("lines.jsonl", io.BytesIO(body)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h").id


def batch_state(url: str, batch_id: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key=BATCH_KEY).batches.retrieve(batch_id)


def premium_summary(result: Run) -> dict[str, Any]:
    ok = [r.ttft for r in result.results if r.ok and r.ttft is not None]
    return {"sent": len(result.results), "answered": len(ok),
            "errors": sum(not r.ok for r in result.results),
            "error_statuses": sorted({f"{r.status} {r.error or ''}".strip() for r in result.results if not r.ok}),
            "ttft_p50_ms": round(percentile(ok, 50) * 1000, 1) if ok else None,
            "ttft_p95_ms": round(percentile(ok, 95) * 1000, 1) if ok else None,
            "ttft_p99_ms": round(percentile(ok, 99) * 1000, 1) if ok else None}


def merge(into: dict[str, Run], key: str, part: Run) -> None:
    if key in into:
        into[key].results += part.results
    else:
        into[key] = part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--line-max-tokens", type=int, default=16)
    parser.add_argument("--rate", type=float, default=4.0, help="premium streams per second (~half capacity)")
    parser.add_argument("--round-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, Run] = {}
    drains: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        procs = [start_sim(Path(tmp), *SMALL_SIM) for _ in range(2)]
        try:
            policy = build_policy([p.url for p in procs], "default", scheduling="priority", cache=False)
            gateway = start_gateway(Path(tmp), policy)
            procs.append(gateway)
            for _ in range(args.rounds):
                merge(runs, "premium alone", asyncio.run(run(premium_spec(args.rate, args.round_s), gateway.url)))
                started = time.monotonic()
                batch_id = submit_batch(gateway.url, args.lines, args.line_max_tokens)
                part = asyncio.run(run(premium_spec(args.rate, args.round_s), gateway.url))
                during = batch_state(gateway.url, batch_id).request_counts.completed
                while (state := batch_state(gateway.url, batch_id)).status not in ("completed", "failed",
                                                                                  "expired", "cancelled"):
                    time.sleep(0.5)
                merge(runs, "premium while the batch drains", part)
                drains.append({"status": state.status, "lines": state.request_counts.total,
                               "completed": state.request_counts.completed, "failed": state.request_counts.failed,
                               "done_during_premium_round": during,
                               "drain_s": round(time.monotonic() - started, 1)})
        finally:
            for proc in procs:
                proc.kill()
    table = {"premium": {name: premium_summary(result) for name, result in runs.items()}, "batches": drains}
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
