"""`tollgate`'s refusals and look-ups that need no process: which workers `up` would simulate, the bundled
default policy found from any directory, and `up` and `serve --workers N` refusing before anything starts."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import cli
from tests.conftest import ROOT, policy_dict


def written(tmp_path: Path, policy: dict[str, Any]) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


@pytest.fixture
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal must come before any process starts (and `up` must not keep this process's SIGTERM handler)."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a process was started: {args}")
    monkeypatch.setattr("subprocess.Popen", refuse)  # patched by name: this module starts nothing
    monkeypatch.setattr(signal, "signal", lambda *args: None)


def test_up_simulates_the_loopback_workers_only_by_the_name_they_serve(tmp_path: Path) -> None:
    policy = policy_dict(["http://127.0.0.1:8002", "http://10.0.0.5:8000"])
    policy["pools"]["embed"] = {"workers": ["http://localhost:8001"]}
    policy["models"]["small-embed"] = {"pool": "embed", "kind": "embed", "upstream_model": "bge-small"}
    workers = [(port, sorted(models)) for port, models in cli.local_workers(written(tmp_path, policy))]
    assert workers == [(8001, [("bge-small", "embed")]),
                       (8002, [("other-model", "generate"), ("sim-llama-8b", "generate")])], \
        "by port; the remote worker is not this machine's to simulate"


def test_up_refuses_a_port_that_would_serve_two_models(tmp_path: Path, no_process: None) -> None:
    path = written(tmp_path, policy_dict(["http://127.0.0.1:8002"]))  # two models in one pool, one worker
    with pytest.raises(SystemExit) as caught:
        cli.main(["up", "--policy", str(path), "--data-dir", str(tmp_path / "data")])
    assert "port 8002 serves several models" in str(caught.value.code)


def test_up_refuses_a_worker_port_already_taken(tmp_path: Path, no_process: None) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        policy = policy_dict([f"http://127.0.0.1:{port}"])
        policy["pools"]["remote"] = {"workers": ["http://10.0.0.5:8000"]}
        policy["models"]["other-model"]["pool"] = "remote"  # one model on the local port
        with pytest.raises(SystemExit) as caught:
            cli.main(["up", "--policy", str(written(tmp_path, policy)), "--data-dir", str(tmp_path / "data")])
    assert f"port {port}" in str(caught.value.code) and "already in use" in str(caught.value.code)


def test_several_processes_refuse_limits_each_would_count_alone(tmp_path: Path, no_process: None) -> None:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["tenants"]["demo"]["rate_limit"] = {"requests_per_minute": 10}
    data_dir = tmp_path / "data"
    with pytest.raises(SystemExit) as caught:
        cli.main(["serve", "--workers", "2", "--policy", str(written(tmp_path, policy)), "--data-dir", str(data_dir)])
    assert "--workers 2 cannot share this policy's state" in str(caught.value.code)
    assert "tenants demo" in str(caught.value.code) and not data_dir.exists()


def test_an_invalid_policy_is_refused_by_name(tmp_path: Path, no_process: None) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("version: 1\ntenants: [not, a, map]\n")
    with pytest.raises(SystemExit) as caught:
        cli.main(["serve", "--workers", "2", "--policy", str(path), "--data-dir", str(tmp_path / "data")])
    assert f"{path} is not a valid policy" in str(caught.value.code)


def test_the_default_policy_is_found_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    found = cli._policy_path(cli.DEFAULT_POLICY)
    assert found.is_absolute() and found.exists() and found.name == "default.yaml"
    assert cli._policy_path("elsewhere.yaml") == Path("elsewhere.yaml"), "only the default is looked up"


def test_up_serves_a_copy_of_the_default_policy_never_the_tracked_file(tmp_path: Path) -> None:
    from gateway.cli import DEFAULT_POLICY, demo_banner, demo_policy

    tracked = ROOT / DEFAULT_POLICY
    copy = demo_policy(DEFAULT_POLICY, tmp_path / "data")
    assert copy == tmp_path / "data" / "policy.yaml" and copy.read_bytes() == tracked.read_bytes()
    copy.write_text(copy.read_text().replace("tg-admin-demo", "edited"))  # an admin's change is kept ...
    assert demo_policy(DEFAULT_POLICY, tmp_path / "data").read_text() == copy.read_text()  # ... across restarts
    own = tmp_path / "mine.yaml"
    own.write_bytes(tracked.read_bytes())
    assert demo_policy(str(own), tmp_path / "data") == own  # a policy named is served as it is
    banner = demo_banner("http://127.0.0.1:8080", 3, own)
    for token in ("tg-demo-key-change-me", "tg-admin-demo-change-me", "tg-finance-demo-change-me",
                  "http://127.0.0.1:8080/reports"):
        assert token in banner


def test_the_banner_names_no_token_the_policy_no_longer_holds(tmp_path: Path) -> None:
    from gateway.cli import DEFAULT_POLICY, demo_banner

    policy = yaml.safe_load((ROOT / DEFAULT_POLICY).read_text())
    policy["server"]["admin_token_sha256"] = "sha256:" + "0" * 64
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(policy))
    banner = demo_banner("http://h:1", 1, path)
    assert "tg-admin-demo-change-me" not in banner and "tg-finance-demo-change-me" in banner
