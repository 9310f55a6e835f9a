"""Policy validation, `tollgate policy check`, `keys new` and `worker render`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.policy.loader import PolicyError, diff, parse_policy
from tests.conftest import ADMIN_TOKEN, ROOT, Proc, policy_dict


def tollgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def errors_of(policy: dict) -> dict[str, str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(yaml.safe_dump(policy))
    return dict(info.value.errors)


def test_default_policy_is_valid() -> None:
    result = tollgate("policy", "check", "policies/default.yaml")
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_every_error_has_its_path() -> None:
    policy = policy_dict(["http://127.0.0.1:1"])
    policy["tenants"]["demo"]["tier"] = "gold"
    policy["tenants"]["demo"]["keys"] = ["plaintext-key"]
    policy["tenants"]["prem"]["colour"] = "blue"
    policy["pools"]["main"]["workers"] = ["not a url"]
    policy["pools"]["main"]["read_timeout_s"] = -1
    errors = errors_of(policy)
    assert "tenants.demo.tier" in errors
    assert "tenants.demo.keys" in errors and "sha256" in errors["tenants.demo.keys"]
    assert "tenants.prem.colour" in errors
    assert "pools.main.workers.0" in errors
    assert "pools.main.read_timeout_s" in errors


def test_cross_references_are_checked() -> None:
    policy = policy_dict(["http://127.0.0.1:1"])
    policy["models"]["sim-llama-8b"]["pool"] = "nowhere"
    policy["tenants"]["prem"]["models"] = ["ghost"]
    policy["tenants"]["bulk"]["keys"] = policy["tenants"]["demo"]["keys"]
    policy["tiers"]["batch"]["max_tokens_default"] = 9999
    errors = errors_of(policy)
    assert "pool 'nowhere'" in errors["models.sim-llama-8b.pool"]
    assert "model 'ghost'" in errors["tenants.prem.models.0"]
    duplicate = errors.get("tenants.bulk.keys.0") or errors.get("tenants.demo.keys.0") or ""
    assert "already used by tenant" in duplicate
    assert "tiers.batch.max_tokens_default" in errors


def test_policy_check_cli_prints_paths_and_exits_1(tmp_path: Path) -> None:
    policy = policy_dict(["http://127.0.0.1:1"])
    policy["tenants"]["demo"]["tier"] = "gold"
    policy["workers"] = {"w": {"model": "m", "gpu_memory_utilisation": 0.5}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(policy))
    result = tollgate("policy", "check", str(path))
    assert result.returncode == 1
    assert re.search(r"^tenants\.demo\.tier: ", result.stderr, re.M)
    assert re.search(r"^workers\.w\.gpu_memory_utilisation: Extra inputs are not permitted", result.stderr, re.M)

    path.write_text("tenants: {demo: [unclosed")
    result = tollgate("policy", "check", str(path))
    assert result.returncode == 1 and "invalid YAML" in result.stderr and "line 1" in result.stderr


def test_diff_names_changed_paths() -> None:
    old = parse_policy(yaml.safe_dump(policy_dict(["http://127.0.0.1:1"])))
    changed = policy_dict(["http://127.0.0.1:2"])
    changed["tenants"]["new"] = {"tier": "batch"}
    new = parse_policy(yaml.safe_dump(changed))
    result = diff(old, new)
    assert result["added"] == ["tenants.new"]
    assert result["changed"] == ["pools.main.workers.0"]


def test_keys_new_prints_a_key_and_its_hash_line() -> None:
    result = tollgate("keys", "new", "--tenant", "acme")
    assert result.returncode == 0
    key = re.search(r"(tg-\S+)", result.stdout).group(1)
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert f'"sha256:{digest}"' in result.stdout
    assert tollgate("keys", "new", "--tenant", "acme").stdout != result.stdout, "fresh every time"


def test_worker_render(tmp_path: Path) -> None:
    result = tollgate("worker", "render", "llama-8b")
    assert result.returncode == 0, result.stderr
    cmd = result.stdout.strip()
    assert cmd.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct ")
    for flag in ("--served-model-name llama-8b", "--gpu-memory-utilization 0.9", "--max-num-seqs 256",
                 "--max-num-batched-tokens 8192", "--max-model-len 8192", "--enable-prefix-caching",
                 "--scheduling-policy priority"):
        assert flag in cmd

    policy = policy_dict(["http://127.0.0.1:1"])
    policy["workers"] = {"big": {"model": "org/m", "tensor_parallel_size": 4, "quantization": "awq",
                                 "kv_cache_dtype": "fp8", "enable_prefix_caching": False,
                                 "speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(policy))
    k8s = json.loads(tollgate("worker", "render", "big", "--policy", str(path), "--format", "k8s").stdout)
    args = k8s["args"]
    assert k8s["command"] == ["vllm", "serve"] and args[0] == "org/m"
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--quantization") + 1] == "awq"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert "--no-enable-prefix-caching" in args
    assert json.loads(args[args.index("--speculative-config") + 1]) == {"method": "ngram",
                                                                        "num_speculative_tokens": 4}
    missing = tollgate("worker", "render", "nope", "--policy", str(path))
    assert missing.returncode != 0 and "no worker 'nope'" in missing.stderr


def test_a_key_given_twice_is_refused_by_policy_check_and_by_the_admin_api(
        tmp_path: Path, start_gateway: Callable[..., Proc]) -> None:
    """An admin's second ``tier:`` line once moved a tenant to premium: now both lines are named, and nothing
    changes."""
    from tests.inprocess.policy.test_loader import with_second_tier

    policy = policy_dict(["http://127.0.0.1:9"])
    text, first, second = with_second_tier(yaml.safe_dump(policy))
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    result = tollgate("policy", "check", str(path))
    assert result.returncode == 1
    assert re.search(rf"^line {second}, column \d+: the key 'tier' is given twice in one mapping, on line {first} "
                     rf"and line {second}$", result.stderr, re.M), result.stderr

    gw = start_gateway(policy, ready="/healthz")
    before = gw.extra["policy_path"].read_text()
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    reply = httpx.put(gw.url + "/admin/policy", content=text, headers=admin, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_policy"
    [detail] = reply.json()["error"]["details"]
    assert f"on line {first} and line {second}" in detail["message"] and "'tier'" in detail["message"]
    assert gw.extra["policy_path"].read_text() == before, "nothing was written"
    status = httpx.get(gw.url + "/admin/policy/status", headers=admin, timeout=10).json()
    assert status["reloads_failed"] == 1 and "given twice" in status["last_error"]


def test_the_policy_round_trip_from_the_command_line(start_gateway: Callable[..., Proc],
                                                     start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    """get, edit, diff (nothing applied), apply, history, rollback, audit: against a running gateway, with the
    token from the environment; a mistake is refused with its path and line."""
    gateway = start_gateway(policy_dict([start_sim().url]))
    env = {"TOLLGATE_ADMIN_TOKEN": ADMIN_TOKEN}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", *args, "--url", gateway.url], cwd=ROOT, text=True,
                              capture_output=True, timeout=60, env={**os.environ, **env,
                                                                    "COLUMNS": "160"})

    def live_cap() -> int:
        policy = httpx.get(gateway.url + "/admin/policy", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
        return int(policy["tenants"]["demo"]["max_tokens_cap"] or 0)

    got = cli("policy", "get")
    assert got.returncode == 0 and "<redacted>" in got.stdout, got.stderr
    live = yaml.safe_load(got.stdout)
    live["tenants"]["demo"]["max_tokens_cap"] = 777
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(live, sort_keys=False))

    diffed = cli("policy", "diff", str(edited))
    assert diffed.returncode == 0 and "1 path would change" in diffed.stdout, diffed.stdout + diffed.stderr
    assert "tenants.demo.max_tokens_cap" in diffed.stdout and "777" in diffed.stdout
    assert live_cap() == 0, "a diff applies nothing"

    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(edited.read_text().replace("max_tokens_cap: 777", "max_tokens_cap: lots"))
    refused = cli("policy", "apply", str(wrong))
    line = next(i for i, text in enumerate(wrong.read_text().splitlines(), 1) if "lots" in text)
    assert refused.returncode != 0 and "tenants.demo.max_tokens_cap" in refused.stderr
    assert f"(line {line})" in refused.stderr, refused.stderr

    applied = cli("policy", "apply", str(edited))
    assert applied.returncode == 0 and "1 path changed" in applied.stdout, applied.stderr
    assert live_cap() == 777
    history = cli("policy", "history", "--json")
    entries = json.loads(history.stdout)
    assert [e["action"] for e in entries] == ["policy.apply", "policy.reject"]
    table = cli("policy", "history")
    assert entries[0]["id"] in table.stdout and "tenants.demo.max_tokens_cap" in table.stdout

    undone = cli("policy", "rollback", entries[0]["id"])
    assert undone.returncode == 0 and "rolled back" in undone.stdout, undone.stderr
    assert live_cap() == 0
    again = cli("policy", "rollback", entries[0]["id"])
    assert again.returncode != 0 and "changed again since" in again.stderr, "the same change cannot be undone twice"
    audit = cli("audit", "--action", "policy", "--json")
    assert [e["action"] for e in json.loads(audit.stdout)] == ["policy.rollback", "policy.apply", "policy.reject"]
    assert "policy.rollback" in cli("audit").stdout
