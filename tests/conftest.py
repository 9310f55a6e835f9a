"""Shared fixtures: real processes on loopback (simulated workers, the gateway, real vLLM on CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.auth import hash_key
from workers.vllm.cpu import free_port

ROOT = Path(__file__).resolve().parent.parent
DEMO_KEY = "tg-test-demo-key"
PREMIUM_KEY = "tg-test-premium-key"
BATCH_KEY = "tg-test-batch-key"
ADMIN_TOKEN = "tg-test-admin-token"


@dataclass
class Proc:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _start(cmd: list[str], port: int, log: Path, ready_path: str, timeout: float = 20.0) -> Proc:
    with open(log, "wb") as sink:
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    proc = Proc(process, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{cmd} exited with {process.returncode}:\n{proc.output()}")
        try:
            if httpx.get(proc.url + ready_path, timeout=0.5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"{cmd} not ready in {timeout}s:\n{proc.output()}")


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start simulated workers: start_sim("--decode-base-ms", "50", model="m")."""
    procs: list[Proc] = []

    def start(*flags: str, model: str = "sim-llama-8b", port: int | None = None, ready: str = "/health") -> Proc:
        port = port or free_port()
        cmd = [sys.executable, "-m", "workers.sim", "--port", str(port), "--model", model, *flags]
        proc = _start(cmd, port, tmp_path / f"sim-{port}.log", ready)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def policy_dict(workers: list[str], model: str = "sim-llama-8b", **pool: Any) -> dict[str, Any]:
    """A test policy: demo (standard), prem (premium), bulk (batch, reject above cap), admin token."""
    return {
        "version": 1,
        "server": {"max_body_bytes": 65536, "admin_token_sha256": "sha256:" + hash_key(ADMIN_TOKEN)},
        "tiers": {
            "premium": {"max_tokens_default": 512, "max_tokens_cap": 4096, "on_exceed": "clamp"},
            "standard": {"max_tokens_default": 512, "max_tokens_cap": 1024, "on_exceed": "clamp"},
            "batch": {"max_tokens_default": 64, "max_tokens_cap": 256, "on_exceed": "reject"},
        },
        "tenants": {
            "demo": {"tier": "standard", "keys": ["sha256:" + hash_key(DEMO_KEY)], "models": ["*"]},
            "prem": {"tier": "premium", "keys": ["sha256:" + hash_key(PREMIUM_KEY)], "models": [model]},
            "bulk": {"tier": "batch", "keys": ["sha256:" + hash_key(BATCH_KEY)], "models": ["other-model"]},
        },
        "models": {model: {"pool": "main"}, "other-model": {"pool": "main"}},
        "pools": {"main": {"workers": workers, "scrape_interval_s": 0.2, "cooldown_s": 1.0,
                           "connect_timeout_s": 1.0, "read_timeout_s": 10.0, **pool}},
    }


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start a gateway process on a policy dict; the policy file stays at proc.policy_path."""
    procs: list[Proc] = []

    def start(policy: dict[str, Any], ready: str = "/readyz") -> Proc:
        port = free_port()
        path = tmp_path / f"policy-{port}.yaml"
        path.write_text(yaml.safe_dump(policy))
        cmd = [sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port", str(port)]
        proc = _start(cmd, port, tmp_path / f"gateway-{port}.log", ready)
        proc.policy_path = path  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real vLLM CPU server for the session (about 30-60 s to start)."""
    from workers.vllm.cpu import start_vllm_cpu

    cache = tmp_path_factory.mktemp("vllm")
    server = start_vllm_cpu(model_dir=Path(os.environ.get("TOLLGATE_TINY_MODEL", cache / "tiny-llama")),
                            log_path=cache / "vllm.log")
    yield server
    server.stop()


def metric_value(url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples (matching labels) from a /metrics endpoint, via prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    text = httpx.get(url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
