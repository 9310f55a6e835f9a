"""`tollgate`'s refusals and look-ups that need no process: which workers `up` would simulate, the bundled
default policy found from any directory, and `up` and `serve --workers N` refusing before anything starts; and
`keys list` printing names as text, never as console markup or terminal controls."""

from __future__ import annotations

import argparse
import json
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

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
                  "http://127.0.0.1:8080/reports", "http://127.0.0.1:8080/console"):
        assert token in banner


def test_the_banner_names_no_token_the_policy_no_longer_holds(tmp_path: Path) -> None:
    from gateway.cli import DEFAULT_POLICY, demo_banner

    policy = yaml.safe_load((ROOT / DEFAULT_POLICY).read_text())
    policy["server"]["admin_token_sha256"] = "sha256:" + "0" * 64
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(policy))
    banner = demo_banner("http://h:1", 1, path)
    assert "tg-admin-demo-change-me" not in banner and "tg-finance-demo-change-me" in banner


def render(table: Any, terminal: bool) -> str:
    """What rich writes for ``table``: as to a colour terminal that draws hyperlinks, or as to a pipe."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, force_terminal=terminal, color_system="truecolor" if terminal else None, width=400,
            legacy_windows=False).print(table)
    return out.getvalue()


def key_row(name: str) -> dict[str, Any]:
    return {"id": "key-0123456789ab", "tenant": "demo", "name": name, "status": "active",
            "created_at": "2026-12-01T00:00:00Z", "created_by": "admin:x", "expires_at": None}


MARKUP = ["[/]", "[link=https://evil.example/x]click here[/link]", "[bold red]alarm", "[/bold]", "\\[x]", "[[/]]"]


@pytest.mark.parametrize("name", MARKUP)
def test_keys_list_prints_a_name_that_looks_like_markup_as_itself(name: str) -> None:
    for terminal in (False, True):
        shown = render(cli.keys_table([key_row(name), key_row("after it")]), terminal)
        assert name in shown and "after it" in shown, "literal, and the rows after it still print"
        assert "\x1b]8;" not in shown, "no terminal hyperlink"


@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=128))
def test_keys_list_never_fails_and_never_passes_a_control_or_bidi_character_to_the_terminal(name: str) -> None:
    from gateway.keys.model import UNSAFE_TEXT

    shown = render(cli.keys_table([key_row(name)]), True)
    assert "\x1b]8;" not in shown
    plain = render(cli.keys_table([key_row(name)]), False)
    assert UNSAFE_TEXT.search(plain.replace("\n", "")) is None, "each shown as its escape"
    if UNSAFE_TEXT.search(name) is None and name.isprintable() and name == name.strip() and " " not in name:
        assert name in plain, "printable names print as they are"


def test_a_name_stored_before_the_check_prints_its_controls_as_escapes() -> None:
    shown = render(cli.keys_table([key_row("ops\u202egpj.exe\x1b[2J\x85")]), False)
    assert "ops\\u202egpj.exe\\u001b[2J\\u0085" in shown


def test_keys_list_follows_every_page(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The admin API pages its keys (1,000 at most a page): the list walks every page by ``after``, in order."""
    made = [{"id": f"key-{i:012x}", "tenant": "demo", "name": f"k{i}"} for i in range(2_345)]
    asked: list[dict[str, Any]] = []

    def pages(args: Any, method: str, path: str, body: Any = None, params: Any = None) -> dict[str, Any]:
        asked.append(dict(params))
        start = next(i + 1 for i, k in enumerate(made) if k["id"] == params["after"]) if "after" in params else 0
        page = made[start:start + params["limit"]]
        return {"object": "list", "data": page, "has_more": start + len(page) < len(made)}

    monkeypatch.setattr(cli, "_admin_call", pages)
    cli.cmd_keys_list(argparse.Namespace(tenant="demo", json=True, token="t", keys_command="list"))
    assert [k["id"] for k in json.loads(capsys.readouterr().out)] == [k["id"] for k in made]
    assert len(asked) == 3 and all(p["tenant"] == "demo" for p in asked)


CELLS = st.text(alphabet=st.sampled_from("abcdefghij-0123456789.,"), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None)
@example(width=40, keys=["a" * 24, "b" * 24], values=["c" * 24])  # too wide for any table: "name: value" lines
@given(width=st.integers(min_value=40, max_value=160), keys=st.lists(CELLS, min_size=1, max_size=2),
       values=st.lists(CELLS, min_size=1, max_size=9))
def test_a_table_fits_the_terminal_and_never_splits_a_value(width: int, keys: list[str], values: list[str]) -> None:
    """Each cell prints whole on one line, in tables no wider than the terminal (the columns shared among them)."""
    import io

    from rich.console import Console

    headers = [f"column\n{i}" for i in range(len(values))]
    out = io.StringIO()
    Console(file=out, width=width).print(cli.fitted("t", [f"key{i}" for i in range(len(keys))], headers,
                                                    [[*keys, *values]], width))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    cells = {c.strip() for line in lines for c in line.split("│")} | {line.partition(": ")[2] for line in lines}
    assert set(keys) | set(values) <= cells, (keys, values, out.getvalue())


def test_the_control_fails_when_rich_is_left_to_fold() -> None:
    """Positive control: the old table (every column folding) splits a value in 40 columns."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(padding=(0, 1), collapse_padding=True)
    for name in ("tenant", "model", "requests", "cost"):
        table.add_column(name, overflow="fold")
    table.add_row("a-tenant-name", "sim-llama-8b", "123456", "0.0110625")
    out = io.StringIO()
    Console(file=out, width=30).print(table)
    assert "sim-llama-8b" not in out.getvalue() or "0.0110625" not in out.getvalue()


@pytest.mark.parametrize(("start", "end", "month", "this_month", "title"), [
    ("2026-12-01T00:00:00.000000Z", "2099-01-01T00:00:00.000000Z", "2026-12", True,
     "this month so far: 2026-12-01 to now"),
    ("2026-11-01T00:00:00.000000Z", "2026-12-01T00:00:00.000000Z", "2026-11", False,
     "month 2026-11: 2026-11-01 to 2026-11-30"),
    ("2026-11-03T00:00:00.000000Z", "2026-11-21T00:00:00.000000Z", None, False, "2026-11-03 to 2026-11-20"),
    ("2026-11-03T00:00:00.000000Z", None, None, False, "2026-11-03 to now"),
    (None, "2026-11-21T00:00:00.000000Z", None, False, "everything up to 2026-11-20")])
def test_a_report_is_titled_in_words(start: str | None, end: str | None, month: str | None, this_month: bool,
                                     title: str) -> None:
    assert cli.report_title(start, end, month, this_month) == title


def test_costs_takes_the_admin_token_and_says_a_refusal_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    seen: list[str] = []

    def get(url: str, params: dict[str, str], headers: dict[str, str], timeout: float) -> httpx.Response:
        seen.append(headers["Authorization"])
        body = {"error": {"message": "month takes a calendar month as YYYY-MM, not '2026-13'.", "param": "month",
                          "type": "invalid_request_error", "code": "invalid_month"}}
        return httpx.Response(400, json=body, request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", get)
    monkeypatch.delenv("TOLLGATE_FINANCE_TOKEN", raising=False)
    monkeypatch.setenv("TOLLGATE_ADMIN_TOKEN", "tg-admin-from-env")
    with pytest.raises(SystemExit) as exited:
        cli.main(["costs", "--month", "2026-13"])
    assert seen == ["Bearer tg-admin-from-env"]
    said = str(exited.value.code)
    assert said == ("tollgate costs: the gateway refused the request (HTTP 400): month takes a calendar month as "
                    "YYYY-MM, not '2026-13'."), said
    assert "{" not in said
