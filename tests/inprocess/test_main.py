"""`python -m gateway` is the `tollgate` command: gateway/__main__.py hands its arguments to the CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.cli import DEFAULT_POLICY, _policy_path


def run_module(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """What `python -m gateway ARGV` does: import gateway.__main__ afresh with ARGV as the command line."""
    monkeypatch.setattr(sys, "argv", ["python -m gateway", *argv])
    monkeypatch.delitem(sys.modules, "gateway.__main__", raising=False)
    import gateway.__main__  # noqa: F401  (importing it runs the command)


def test_python_m_gateway_runs_the_command_it_is_given(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    default = _policy_path(DEFAULT_POLICY)
    run_module(["policy", "check", str(default)], monkeypatch)
    assert capsys.readouterr().out.startswith(f"{default}: OK (")


def test_its_exit_status_is_the_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\ntiers: {standard: {max_tokens_cap: 0}}\n")
    with pytest.raises(SystemExit) as caught:
        run_module(["policy", "check", str(broken)], monkeypatch)
    assert caught.value.code == 1 and "tiers.standard.max_tokens_cap" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        run_module(["no-such-command"], monkeypatch)
    assert caught.value.code == 2, "argparse's usage error"
