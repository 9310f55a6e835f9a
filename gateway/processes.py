"""`tollgate serve --workers N`: N gateway processes on one port (the flag's name is uvicorn's and gunicorn's;
what it starts are the gateway's own processes, never vLLM workers, which are "workers" everywhere else).

Each process binds the port itself with SO_REUSEPORT, so the kernel spreads new connections over them (no
accept lock, no hand-off through a parent). A small supervisor starts the processes, passes SIGTERM/SIGINT on
(each drains as a single gateway does) and restarts one that dies unexpectedly.

What is shared, and how (the README lists it): budgets, rate limits and the cache through Redis
(``state.redis_url``; the supervisor refuses to start N > 1 without it when any tenant has a budget or a rate
limit, since in-process counters would let N times the limit through; a memory cache is per process: fewer
hits, never a wrong one); the ledger and batch state through the data directory's SQLite (one writer at a
time, WAL) or the ledger in PostgreSQL (``state.postgres_dsn``); a worker's concurrency is split between the
processes (each takes its share of the learned limit; gateway.state.replicas), so N processes never hand a
worker N times what it runs. Every process runs batch lines, each claiming a few at a time (gateway.batches).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from gateway.policy.schema import Policy

RESTART_DELAY_S = 1.0


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def sharing_problems(policy: Policy) -> list[str]:
    """What N > 1 processes could not keep right with this policy."""
    problems = []
    limited = [name for name, t in policy.tenants.items() if t.budget is not None or t.rate_limit is not None]
    if limited and not policy.state.redis_url:
        problems.append(f"tenants {', '.join(sorted(limited))} have budgets or rate limits: set state.redis_url so "
                        "every process counts against the same limit")
    return problems


def supervise(child_argv: Sequence[str], processes: int) -> int:
    """Run ``processes`` children (``child_argv`` + their index), restarting any that dies; return on a signal."""
    children: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False

    def start(index: int) -> None:
        children[index] = subprocess.Popen([*child_argv, "--process-index", str(index), "--processes",
                                            str(processes)])

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for index in range(processes):
        start(index)
    while True:
        time.sleep(0.2)
        if stopping:
            for child in children.values():
                child.wait()
            return 0
        for index, child in list(children.items()):
            if child.poll() is not None:
                print(f"tollgate: gateway process {index} exited with {child.returncode}; restarting",
                      file=sys.stderr, flush=True)
                time.sleep(RESTART_DELAY_S)
                if not stopping:
                    start(index)
