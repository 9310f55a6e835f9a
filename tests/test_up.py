"""`tollgate up`: workers from the policy, the gateway, a demo key that works, and a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import yaml

from tests.conftest import ROOT, wait_for
from workers.process import free_port


def _pids_of(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_up_serves_the_demo_key_and_stops_its_workers(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    ports = [free_port(), free_port()]
    policy["pools"]["local-sim"]["workers"] = [f"http://127.0.0.1:{p}" for p in ports]
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    gateway_port = free_port()
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "gateway", "up", "--policy", str(path), "--port",
                               str(gateway_port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        assert wait_for(lambda: _ready(url), timeout=90), (tmp_path / "up.log").read_text()
        banner = (tmp_path / "up.log").read_text()
        assert f"{url}/v1" in banner and "tg-demo-key-change-me" in banner
        workers = set().union(*(_pids_of(f"workers.sim --port {p}") for p in ports))
        assert len(workers) == 2
        client = openai.OpenAI(base_url=url + "/v1", api_key="tg-demo-key-change-me", max_retries=0)
        answer = client.chat.completions.create(model="sim-llama-8b", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3)
        assert answer.usage is not None and answer.usage.completion_tokens == 3
        up.send_signal(signal.SIGTERM)
        up.wait(20)
        assert wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=10), "workers outlived `up`"
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
