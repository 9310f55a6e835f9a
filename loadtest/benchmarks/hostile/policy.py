"""A large or hostile policy against a serving gateway (python -m loadtest run policy [--tenants N]).

Starts a simulated worker and a gateway, then, while a client times GET /healthz every 10 ms: PUTs a policy of
N tenants through the admin API, PUTs a 2.7 KB YAML alias bomb, and restarts the gateway on the large policy.
Prints how long each took and the slowest /healthz answer during it (the event loop's stall).
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtest.harness.fixtures import ADMIN_TOKEN
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim


def large(policy: dict[str, Any], tenants: int) -> dict[str, Any]:
    for i in range(tenants):
        policy["tenants"][f"tenant-{i}"] = {
            "tier": "standard", "keys": ["sha256:" + hashlib.sha256(f"key-{i}".encode()).hexdigest()]}
    return policy


def bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "workers:\n  w:\n    speculative_config:\n" + "\n".join("      " + line for line in lines) + "\n"


class Prober:
    """GET /healthz every 10 ms from a thread; the slowest answer while ``measure`` runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    client.get(self.url + "/healthz")
                except httpx.HTTPError:
                    pass
                self.worst = max(self.worst, time.perf_counter() - started)
                time.sleep(0.01)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=100_000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    sim = start_sim(tmp, "--zero-delay")
    gw = start_gateway(tmp, build_policy([sim.url]))
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    text = yaml.safe_dump(large(build_policy([sim.url]), args.tenants))
    try:
        for name, body in ((f"PUT {args.tenants:,} tenants ({len(text) / 1e6:.1f} MB)", text),
                           ("PUT a 2.7 KB alias bomb", bomb())):
            with Prober(gw.url) as probe:
                started = time.perf_counter()
                reply = httpx.put(gw.url + "/admin/policy", content=body, headers=admin, timeout=600)
                took = time.perf_counter() - started
            print(f"{name}: {reply.status_code} in {took:.1f} s; slowest /healthz meanwhile "
                  f"{probe.worst * 1000:.0f} ms")
        gw.kill()
        path = tmp / "large.yaml"
        path.write_text(text)
        started = time.perf_counter()
        again = start_gateway(tmp, large(build_policy([sim.url]), args.tenants), timeout=600)
        print(f"start on {args.tenants:,} tenants: ready in {time.perf_counter() - started:.1f} s")
        again.kill()
    finally:
        gw.kill()
        sim.kill()


if __name__ == "__main__":
    main()
