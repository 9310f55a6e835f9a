"""What the GPU gauges cost a request: the CPU of reading a window's records for them, per record, the window read
whole (as each refresh did until e43a489) against the steps of ``gateway.finance.gpu_costs.Window``
(python -m loadtest run gpu_gauges [--rate 3900] [--seconds 300] [--seed S]).

A SQLite ledger in a temporary directory is filled with ``--rate`` records a second for ``--seconds`` (requests of
0.05 to 8 s on four workers, two tiers; lengths drawn from the seed), ending now. Then, in this process: one GPU
report over the last 15 minutes (the old refresh), the window's steps gathered from cold, and the one step a
refresh a minute later gathers. Prints CPU seconds, records read and microseconds a record read, and what each
scheme costs a request at that rate when it refreshes every minute.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from gateway.finance import gpu_costs
from gateway.ledger.stores import SqliteLedger
from gateway.ledger.times import at
from gateway.policy.schema import Policy

WORKERS = [f"http://gpu-{i}:8000" for i in range(4)]


def fill(store: SqliteLedger, rate: float, seconds: float, end: float, rng: random.Random) -> int:
    n = int(rate * seconds)
    batch = []
    for i in range(n):
        finished = end - seconds + seconds * i / n
        length = rng.uniform(0.05, 8.0)
        batch.append({"id": f"r{i:x}", "request_id": f"q{i:x}", "time": at(finished), "tenant": rng.choice("abc"),
                      "tier": rng.choice(["standard", "premium"]), "service_class": "standard", "model": "m",
                      "endpoint": "chat", "stream": False, "status": 200, "prompt_tokens": 16,
                      "completion_tokens": 64, "cached_tokens": 0, "estimated": False, "cost_usd": 1e-5,
                      "worker": rng.choice(WORKERS), "worker_ms": length * 1000, "total_ms": length * 1000,
                      "queue_wait_ms": 0.0, "ttft_ms": 5.0})
        if len(batch) == 10_000:
            store.insert(batch)
            batch = []
    store.insert(batch)
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=3900.0, help="records a second (the plain c=64 rate here)")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long a stretch of records, ending now")
    parser.add_argument("--seed", type=int, default=random.randrange(2**32))
    args = parser.parse_args()
    policy = Policy.model_validate({"allow_empty": True, "pools": {"gpu": {"workers": WORKERS,
                                                                            "gpu_usd_per_hour": 3.6}}})
    with tempfile.TemporaryDirectory() as where:
        store = SqliteLedger(Path(where) / "ledger.sqlite3")
        now = time.time()
        n = fill(store, args.rate, args.seconds, now, random.Random(args.seed))
        print(f"seed {args.seed}: {n:,} records over {args.seconds:.0f} s")
        started = time.process_time()
        gpu_costs.gather(store, policy, now - gpu_costs.WINDOW_S, now, ["tier"], [], False)
        whole = time.process_time() - started
        reads = gpu_costs.WINDOW_S / gpu_costs.REFRESH_S
        print(f"the window read whole: {whole:.2f} s CPU, {whole / n * 1e6:.2f} us a record; read {reads:.0f} "
              f"times a record, refreshed every {gpu_costs.REFRESH_S:.0f} s: {whole / n * reads * 1e6:.1f} us a "
              "request (more at a full window: its pages were quadratic before df73988)")
        cold = gpu_costs.Window(store)
        started = time.process_time()
        cold.refresh(now, policy, [])
        print(f"the window's {gpu_costs.STEPS} steps from cold: {time.process_time() - started:.2f} s CPU")
        warm = gpu_costs.Window(store)
        warm.refresh(now - gpu_costs.REFRESH_S, policy, [])
        newest = warm.steps[-1].end + gpu_costs.REFRESH_S
        read = len(store._run("SELECT id FROM ledger WHERE time >= ? AND time < ?",
                              [at(newest - gpu_costs.REFRESH_S), at(newest + gpu_costs.REFRESH_S)]))
        started = time.process_time()
        warm.refresh(now, policy, [])
        step = time.process_time() - started
        print(f"one step a minute later: {step:.3f} s CPU for {read:,} records read, {step / max(read, 1) * 1e6:.2f} "
              f"us a record; every {gpu_costs.REFRESH_S:.0f} s: {step / gpu_costs.REFRESH_S / args.rate * 1e6:.1f} us "
              "a request")
        store.close()


if __name__ == "__main__":
    main()
