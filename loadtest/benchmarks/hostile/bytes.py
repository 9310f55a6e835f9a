"""What a hostile client or worker can take from the gateway: memory and the loop's time
(python -m loadtest run bytes [--cases a,b] [--seconds S]).

Each case runs against one gateway process (policies/default.yaml, every pool on one hostile worker,
loadtest/harness/hostile_worker.py) while this process asks /healthz every 20 ms. Printed per case: the gateway's RSS
before, at its highest while the case ran, and after it ended; /healthz p50/p99/max; what the attacker got.
The goals (issue: trust on the byte path): RSS at most 64 MB above where it was, back within 16 MB after,
/healthz p99 under 50 ms.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtest.harness.hostile_worker import HostileWorker
from loadtest.harness.procs import ROOT, Proc, start_gateway
from loadtest.harness.stats import percentile

KEY = "tg-demo-key-change-me"
AUTH = {"authorization": f"Bearer {KEY}"}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def policy_on(worker: str) -> dict[str, Any]:
    policy = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    for pool in policy["pools"].values():
        pool["workers"] = [worker]
        pool["cooldown_s"] = 0  # each case's failure must not take the worker out for the next one
    policy["pools"]["local-sim"]["answer_deadline_s"] = 5.0
    return policy


def raw(port: int, data: Callable[[socket.socket], None]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            data(s)
        except OSError:
            pass  # the gateway hung up: that is the point


def client_endless_header(gw: Proc, seconds: float) -> str:
    """Three attackers, each sending a header value that never ends (no key needed), again on a new connection
    each time the gateway hangs up."""
    sent, connections = [0, 0, 0], [0, 0, 0]
    deadline = time.monotonic() + seconds

    def one(i: int) -> None:
        def send(s: socket.socket) -> None:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-endless: ")
            while time.monotonic() < deadline:
                s.sendall(b"v" * 65536)
                sent[i] += 65536
        while time.monotonic() < deadline:
            connections[i] += 1
            raw(gw.port, send)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return f"{sum(connections)} connections, {sum(sent) / 1e6:.0f} MB sent, each cut off by the gateway"


def chat_case(mode: str, stream: bool = False) -> Callable[[Proc, float], str]:
    def run(gw: Proc, seconds: float) -> str:
        statuses: dict[int, int] = {}
        deadline = time.monotonic() + seconds
        with httpx.Client(timeout=60) as client:
            while time.monotonic() < deadline:
                body = {"model": "sim-llama-8b", "messages": [{"role": "user", "content": f"mode:{mode} mark:x"}],
                        "max_tokens": 8, "stream": stream}
                r = client.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        return f"statuses {statuses}"
    return run


def embeddings_cache(gw: Proc, seconds: float) -> str:
    """Distinct ~20 KB embeddings requests whose answers are as large as an engine's can be (2,048 inputs)."""
    count, deadline = 0, time.monotonic() + seconds
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline and count < 30:
            body = {"model": "sim-embed-small", "input": [f"{count} {i} " + "w" * 4 for i in range(2048)]}
            r = client.post(gw.url + "/v1/embeddings", json=body, headers=AUTH)
            r.raise_for_status()
            count += 1
    return f"{count} answers of ~{len(r.content) / 1e6:.0f} MB each"


def forged_logout(gw: Proc, seconds: float) -> str:
    """Sign-outs with cookies whose signature is wrong, each naming its own nonce and a far expiry."""
    count, deadline = 0, time.monotonic() + seconds
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline and count < 8000:
            payload = f"finance.{os.urandom(4).hex()}.9999999999.{os.urandom(9).hex()}"  # the cookie's shape
            sig = hmac.new(b"not the gateway's", payload.encode(), hashlib.sha256).hexdigest()
            client.cookies.set("tollgate_session", f"{payload}.{sig}")
            client.post(gw.url + "/reports/logout")
            count += 1
    return f"{count} forged sign-outs"


CASES: dict[str, Callable[[Proc, float], str]] = {
    "client_endless_header": client_endless_header,
    "worker_endless_header": chat_case("endless_header"),
    "worker_huge_body": chat_case("huge_body"),
    "worker_huge_stream": chat_case("huge_stream", stream=True),
    "worker_trickle": chat_case("trickle"),
    "embeddings_cache": embeddings_cache,
    "forged_logout": forged_logout,
}


def measure(gw: Proc, case: Callable[[Proc, float], str], seconds: float) -> dict[str, Any]:
    before = rss_mb(gw.pid)
    latencies: list[float] = []
    peak = [before]
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                t0 = time.perf_counter()
                client.get(gw.url + "/healthz")
                latencies.append((time.perf_counter() - t0) * 1000)
                peak[0] = max(peak[0], rss_mb(gw.pid))
                done.wait(0.02)
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        outcome = case(gw, seconds)
    finally:
        done.set()
        prober.join()
    httpx.get(gw.url + "/healthz")  # one more turn of the loop after the case
    after = rss_mb(gw.pid)
    return {"rss_before_mb": round(before, 1), "rss_peak_mb": round(peak[0], 1), "rss_after_mb": round(after, 1),
            "healthz_p50_ms": round(percentile(latencies, 50) or 0, 1),
            "healthz_p99_ms": round(percentile(latencies, 99) or 0, 1),
            "healthz_max_ms": round(max(latencies, default=0), 1),
            "probes": len(latencies), "outcome": outcome}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", default="loadtest/results/hostile/bytes.json")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp, HostileWorker.in_thread() as worker:
        gw = start_gateway(Path(tmp), policy_on(worker.url))
        try:
            for name in args.cases.split(","):
                results[name] = measure(gw, CASES[name], args.seconds)
                print(name, json.dumps(results[name]), flush=True)
        finally:
            gw.kill()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
