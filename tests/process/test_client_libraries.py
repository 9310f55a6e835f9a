"""The client libraries people already use, as they use them, against `tollgate up` (the embedded default on
simulated workers): LangChain, instructor, openai-agents and LlamaIndex, each in tests/clients/, run in the
clients' own venv (.venv-clients, made by `make test`; tests/clients/requirements.txt says why it is apart)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, wait_for
from workers.process import free_port

CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
APPS = ("langchain_app", "instructor_app", "agents_app", "llamaindex_app")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`tollgate up` on the default policy, its workers and gateway moved to free ports."""
    tmp = tmp_path_factory.mktemp("up")
    policy = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    ports = [free_port(), free_port(), free_port()]
    policy["pools"]["local-sim"]["workers"] = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    policy["pools"]["local-embed"]["workers"] = [f"http://127.0.0.1:{ports[2]}"]
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    port = free_port()
    with open(tmp / "up.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "up", "--policy", str(path), "--port", str(port),
                                 "--data-dir", str(tmp / "data")], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/readyz", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(ready, timeout=90), (tmp / "up.log").read_text()
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("app", APPS)
def test_the_library_runs_its_tools_and_structured_output_on_the_embedded_default(up: str, app: str) -> None:
    assert CLIENTS_PYTHON.exists(), "the clients' venv is missing: `make .venv-clients/.done` (make test does it)"
    env = {**os.environ, "TOLLGATE_URL": up, "TOLLGATE_KEY": "tg-demo-key-change-me",
           "TOLLGATE_MODEL": "sim-llama-8b", "PYTHONPATH": ""}
    done = subprocess.run([str(CLIENTS_PYTHON), str(Path(__file__).parent.parent / "clients" / f"{app}.py")],
                          capture_output=True, text=True, timeout=240, env=env, cwd="/")
    assert done.returncode == 0, f"{app} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert f"{app.removesuffix('_app')}: ok" in done.stdout
