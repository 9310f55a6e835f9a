"""Shared fixtures: real processes on loopback (simulated workers, the gateway, real vLLM on CPU)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest.harness import procs as procs_
from loadtest.harness.fixtures import ADMIN_TOKEN, BATCH_KEY, DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, metric_value
from loadtest.harness.policy import build_policy as policy_dict
from loadtest.harness.procs import ROOT, Proc

__all__ = ["ADMIN_TOKEN", "BATCH_KEY", "DEMO_KEY", "FINANCE_TOKEN", "PREMIUM_KEY", "ROOT", "Proc", "metric_value",
           "policy_dict"]
REDIS_URL = "redis://127.0.0.1:6379/0"  # the machine's Redis (CI starts one when none answers)


# Where a test stands says what it needs: tests/inprocess/ (mirroring gateway/ and workers/) needs nothing but
# Python: it starts no process and uses no server (loopback sockets inside the test's own process are fine), and is
# `make unit`; tests/process/ starts simulated workers, gateways and tools, and uses this machine's Redis and
# PostgreSQL; tests/vllm/ starts real vLLM on the CPU. tests/inprocess/test_structure.py holds the in-process
# layer to that.
IN_PROCESS = "tests.inprocess."


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        quality = item.get_closest_marker("quality") is not None  # the real model over hundreds of pairs
        name = item.module.__name__ if item.module is not None else ""
        if name.startswith(IN_PROCESS) and not quality:
            item.add_marker(pytest.mark.inprocess)


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start simulated workers: start_sim("--decode-base-ms", "50", model="m")."""
    procs: list[Proc] = []

    def start(*flags: str, model: str = "sim-llama-8b", port: int | None = None, ready: str = "/health") -> Proc:
        proc = procs_.start_sim(tmp_path, *flags, model=model, port=port, ready=ready)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def patient(policy: dict[str, Any]) -> dict[str, Any]:
    """Let a test's burst wait in the queue instead of being shed on the queue's forecast.

    Several gateway processes each hold only their part of a worker's slots, so a burst that one process would
    start at once queues, and on a slow CI machine the forecast can exceed the standard deadline. Tests of other
    features must not read that shed as their failure; shedding has its own tests (test_scheduling).
    """
    policy["scheduling"] = {"tiers": {klass: {"max_queue_wait_ms": 60_000} for klass in ("premium", "standard")}}
    return policy


def on_shared_state(policy: dict[str, Any], pg_dsn: str | None = None) -> dict[str, Any]:
    """A policy for several replicas: this machine's Redis under a namespace of the test's own, PostgreSQL if given."""
    policy["state"] = {"namespace": f"test-{uuid.uuid4().hex[:8]}", "redis_url": REDIS_URL,
                       **({"postgres_dsn": pg_dsn} if pg_dsn else {})}
    return patient(policy)


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start a gateway process on a policy dict; its policy file is proc.extra["policy_path"]."""
    procs: list[Proc] = []

    def start(policy: dict[str, Any], ready: str = "/readyz", **options: Any) -> Proc:
        proc = procs_.start_gateway(tmp_path, policy, ready=ready, **options)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_TEST_DB = "tollgate_test"


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A fresh ledger table in the test database (created when absent)."""
    import psycopg

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as db:
        if db.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_TEST_DB,)).fetchone() is None:
            db.execute(f"CREATE DATABASE {PG_TEST_DB}")
    dsn = f"postgresql://postgres@127.0.0.1:5432/{PG_TEST_DB}"
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("DROP TABLE IF EXISTS ledger")
        db.execute("DROP TABLE IF EXISTS worker_presence")
        db.execute("DROP TABLE IF EXISTS ledger_closes")
    yield dsn


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama every real vLLM server of the session serves (built once, in seconds)."""
    from workers.vllm.cpu import build_tiny_model

    return build_tiny_model(Path(os.environ.get("TOLLGATE_TINY_MODEL",
                                                tmp_path_factory.mktemp("model") / "tiny-llama")))


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Any]:
    """One real vLLM CPU server for the session (about 30-60 s to start)."""
    from workers.vllm.cpu import start_vllm_cpu

    cache = tmp_path_factory.mktemp("vllm")
    # 2048 tokens of context, so a request can run for seconds (abort tests need that margin on a CPU)
    server = start_vllm_cpu(model_dir=tiny_model, max_model_len=2048, log_path=cache / "vllm.log")
    yield server
    server.stop()


def ledger_records(url: str, token: str, count: int = 1, timeout: float = 10.0,
                   **match: object) -> list[dict[str, Any]]:
    """The ledger records (GET /admin/ledger) whose fields equal ``match``, once there are ``count`` of them (the
    ledger is written off the request path, a moment after the answer); fails the test if they do not come."""
    found: list[dict[str, Any]] = []

    def recorded() -> bool:
        rows = httpx.get(url + "/admin/ledger", timeout=5, headers={"authorization": f"Bearer {token}"}).json()
        found[:] = [r for r in rows["data"] if all(r.get(k) == v for k, v in match.items())]
        return len(found) >= count
    assert wait_for(recorded, timeout=timeout), (match, found)
    return found


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
