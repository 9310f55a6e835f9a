"""The console in Chromium, as an admin uses it, against a gateway process on a simulated worker: sign in; create
a key with a budget, use it with the openai client, see its spend, revoke it and see the refusal; edit the policy
with a mistake, see the error at its line, fix it, apply it, see the change in the history, roll it back. The
README's screenshots are taken here (into TOLLGATE_SCREENSHOT_DIR when it is set)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Page, sync_playwright

from tests.conftest import ADMIN_TOKEN, Proc, policy_dict, wait_for

CHROMIUM = "/usr/bin/chromium"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "sim-llama-8b"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return Path(os.environ.get("TOLLGATE_SCREENSHOT_DIR", tmp_path))


@contextlib.contextmanager
def console(gateway: Proc, height: int) -> Iterator[Page]:
    """Chromium on the console, signed in with the admin token, every confirmation accepted."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": height})
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(f"{gateway.url}/console")
        page.fill("[data-testid=token]", ADMIN_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_selector("[data-testid=tab-keys]")
        yield page
        browser.close()


def test_a_key_made_used_watched_and_revoked(start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc],
                                             shots: Path) -> None:
    policy = policy_dict([start_sim("--decode-base-ms", "1").url])
    policy["prices"]["models"][MODEL] = [{"effective": "2026-01-01", "input_per_m": 300, "output_per_m": 900}]
    gateway = start_gateway(policy)  # a model priced so that three answers come to cents
    with console(gateway, 800) as page:
        page.wait_for_selector("[data-testid=create-key]")
        page.select_option("select[name=tenant]", "demo")
        page.fill("input[name=name]", "support-bot")
        page.fill("input[name=budget]", "5")
        page.fill("input[name=rpm]", "120")
        page.click("[data-testid=create-key] button[type=submit]")
        key = page.inner_text("[data-testid=new-key]")
        assert len(key) >= 32 and key not in page.content().replace(key, "", 1), "shown once, in one place"
        row = page.locator("[data-testid=key-row]", has_text="support-bot")
        assert row.locator("[data-testid=key-name]").inner_text() == "support-bot"
        assert row.locator("[data-testid=key-status]").get_attribute("data-status") == "active"
        key_id = row.get_attribute("data-key-id")
        assert key_id

        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
        for _ in range(3):
            client.chat.completions.create(model=MODEL, max_tokens=64,
                                           messages=[{"role": "user", "content": "How do refunds work?"}])

        def mine() -> list[dict[str, Any]]:
            rows = httpx.get(f"{gateway.url}/admin/reports/costs", headers=ADMIN,
                             params={"group_by": "key"}).json()["data"]
            return [r for r in rows if r["key_id"] == key_id]

        def spent() -> float:
            return sum(r["cost_usd"] for r in mine())
        # all three records, not the first: the writer may land them in two flushes, and the page read between
        # them would show less than the ledger holds when it is read again below
        assert wait_for(lambda: sum(r["requests"] for r in mine()) == 3, timeout=20), "the ledger has all three"
        page.click("[data-testid=tab-tenants]")
        page.click("[data-testid=tab-keys]")
        row = page.locator("[data-testid=key-row]", has_text="support-bot")
        shown = float(row.locator("[data-testid=key-spent]").inner_text().replace(",", ""))
        assert shown == round(spent(), 2) > 0, "the console shows the ledger's spend, to the cent"
        assert "5.00 / month" in row.inner_text()
        page.screenshot(path=str(shots / "console-keys.png"), full_page=True)

        # what a key's name holds is shown as text, never read as markup
        hostile = '<img src=x onerror="document.title=1">'
        made = httpx.post(f"{gateway.url}/admin/keys", headers=ADMIN, json={"tenant": "demo", "name": hostile})
        assert made.status_code == 201, made.text
        page.click("[data-testid=tab-tenants]")
        page.click("[data-testid=tab-keys]")
        assert page.locator("[data-testid=key-name]", has_text="onerror").inner_text() == hostile
        assert page.locator("main img").count() == 0 and page.title() != "1"

        row.locator("[data-testid=revoke]").click()
        page.wait_for_selector(f"[data-testid=key-row][data-key-id='{key_id}'] .status-revoked")
        with pytest.raises(openai.AuthenticationError, match="revoked"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "again"}])
        page.click("[data-testid=tab-audit]")
        page.wait_for_selector("[data-testid=audit-row]")
        audit = page.inner_text("[data-testid=audit-table]")
        assert "key.revoke" in audit and "key.create" in audit

        page.goto(f"{gateway.url}/console?lang=ko#keys")  # in Korean: the words, and Hangul drawn in a Korean face
        page.wait_for_selector("[data-testid=keys-table]")
        assert page.inner_text("[data-testid=tab-keys]") == "키" and "이번 달 지출" in page.inner_text("main")
        page.screenshot(path=str(shots / "console-keys-ko.png"), full_page=True)


def test_a_policy_edit_refused_at_its_line_then_applied_then_rolled_back(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], shots: Path) -> None:
    gateway = start_gateway(policy_dict([start_sim().url]))
    live = httpx.get(f"{gateway.url}/admin/policy", params={"format": "yaml"}, headers=ADMIN).text
    lines = live.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "max_tokens_default: 512" and
              any(lines[j].strip() == "standard:" for j in range(max(0, i - 3), i)))
    with console(gateway, 900) as page:
        page.click("[data-testid=tab-policy]")
        editor = page.locator("[data-testid=policy-editor]")
        editor.wait_for()
        assert editor.input_value() == live, "the editor holds the live policy, as GET shows it"

        def send(value: str, button: str, answer: str) -> None:
            """The live policy with the standard tier's default set to ``value``, sent with ``button``."""
            edited = lines.copy()
            edited[at] = edited[at].replace("512", value)
            editor.fill("\n".join(edited) + "\n")
            page.click(f"[data-testid={button}]")
            page.wait_for_selector(answer)

        send("plenty", "policy-check", "[data-testid=policy-errors]")
        errors = page.inner_text("[data-testid=policy-errors]")
        assert "tiers.standard.max_tokens_default" in errors and f"(line {at + 1})" in errors, errors
        selected = page.evaluate("() => { const e = document.querySelector('[data-testid=policy-editor]');"
                                 " return e.value.slice(e.selectionStart, e.selectionEnd); }")
        assert selected.strip() == "max_tokens_default: plenty", "the editor shows the line at fault"
        page.screenshot(path=str(shots / "console-policy-error.png"))
        assert "max_tokens_default: 512" in httpx.get(f"{gateway.url}/admin/policy", params={"format": "yaml"},
                                                      headers=ADMIN).text, "nothing applied"

        send("300", "policy-apply", "[data-testid=policy-result] [data-testid=change]")
        change = page.inner_text("[data-testid=policy-result] [data-testid=change]")
        assert re.search(r"tiers\.standard\.max_tokens_default\s+512\s+300", change), change
        served = httpx.get(f"{gateway.url}/admin/policy", headers=ADMIN).json()
        assert served["tiers"]["standard"]["max_tokens_default"] == 300
        applied = page.locator("[data-testid=history-row][data-action='policy.apply']").first
        assert "tiers.standard.max_tokens_default" in applied.inner_text()
        page.screenshot(path=str(shots / "console-policy-applied.png"), full_page=True)

        applied.locator("[data-testid=rollback]").click()
        page.wait_for_selector("[data-testid=history-row][data-action='policy.rollback']")
        assert wait_for(lambda: httpx.get(f"{gateway.url}/admin/policy", headers=ADMIN).json()["tiers"][
            "standard"]["max_tokens_default"] == 512, timeout=5)
        assert "max_tokens_default: 512" in page.locator("[data-testid=policy-editor]").input_value()
        entries = httpx.get(f"{gateway.url}/admin/audit", params={"action": "policy"}, headers=ADMIN).json()["data"]
        assert [e["action"] for e in entries] == ["policy.rollback", "policy.apply"]
        assert entries[0]["details"]["changes"] == [{
            "path": "tiers.standard.max_tokens_default", "keys": ["tiers", "standard", "max_tokens_default"],
            "change": "changed", "old": 300, "new": 512}]
        assert entries[0]["details"]["rollback_of"] == entries[1]["id"]
        page.screenshot(path=str(shots / "console-policy-rolled-back.png"), full_page=True)
