"""The finance page and a statement in Korean and in KRW, over HTTP against a gateway process on a simulated
worker: the language asked for by ``?lang=`` or ``Accept-Language``, a font stack with Hangul, a Korean cost
centre in the drill-down and its chart, every amount the ledger's USD at the policy's rate to the won, the same
on the page, the printable statement and the workbook (opened with openpyxl), which show the same period."""

from __future__ import annotations

import io
import os
import re
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import openpyxl
from playwright.sync_api import sync_playwright

from gateway.finance import money, words
from gateway.finance.reports import parse_month
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, Proc, policy_dict, wait_for

MODEL = "sim-llama-8b"
CHROMIUM = "/usr/bin/chromium"
RATE = 1385.5  # KRW per USD
FINANCE = {"Authorization": f"Bearer {FINANCE_TOKEN}"}
TAG = "team=검색"  # a cost centre named in Korean (OpenAI's metadata)


def krw(usd: float) -> str:
    """What a USD figure of the ledger reads in won, worked out here from the rate, not by the formatter."""
    won = (Decimal(repr(usd)) * Decimal(repr(RATE))).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return f"{abs(won) if won == 0 else won:,}"


def cells(html: str, test_id: str) -> list[list[str]]:
    rows = re.findall(rf'<tr[^>]*data-testid="{test_id}"[^>]*>(.*?)</tr>', html, flags=re.S)
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
            for row in rows]


def by_testid(html: str, test_id: str) -> str:
    found = re.search(rf'data-testid="{test_id}"[^>]*>([^<]*)<', html)
    assert found is not None, test_id
    return found[1]


def test_the_page_and_a_statement_in_korean_and_in_won(start_gateway: Callable[..., Proc],
                                                        start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    sim = start_sim("--decode-base-ms", "2")
    policy: dict[str, Any] = policy_dict([sim.url], gpu_usd_per_hour=3.0)
    policy["finance"] = {"currency": "KRW", "usd_rates": [{"effective": "2020-01-01", "per_usd": RATE}]}
    gateway = start_gateway(policy)
    for key, n in ((DEMO_KEY, 4), (PREMIUM_KEY, 2)):
        for i in range(n):
            answer = httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                                headers={"Authorization": f"Bearer {key}"},
                                json={"model": MODEL, "max_tokens": 200 + 40 * i, "metadata": {"team": "검색"},
                                      "messages": [{"role": "user", "content": f"질문 {i} " * 50}]})
            assert answer.status_code == 200, answer.text
    month = f"{datetime.now(UTC):%Y-%m}"

    def report(**params: str) -> dict[str, Any]:
        answer = httpx.get(gateway.url + "/admin/reports/costs", headers=FINANCE, params={"month": month, **params})
        return dict(answer.json())
    assert wait_for(lambda: report()["total"]["requests"] == 6, timeout=20)
    total = report()["total"]
    by_tenant = {r["tenant"]: r for r in report(group_by="tenant")["data"]}
    assert total["cost_usd"] > 0 and report()["object"] == "cost_report", "the API stays in the ledger's USD"

    # the page: Korean by ?lang= and by Accept-Language, amounts in won, a font stack with Hangul
    page = httpx.get(gateway.url + "/reports", params={"month": month, "lang": "ko"}, headers=FINANCE,
                     timeout=60).text
    asked = httpx.get(gateway.url + "/reports", params={"month": month}, timeout=60,
                      headers={**FINANCE, "Accept-Language": "ko-KR,ko;q=0.9,en;q=0.5"}).text
    english = httpx.get(gateway.url + "/reports", params={"month": month}, timeout=60,
                        headers={**FINANCE, "Accept-Language": "en-GB,en;q=0.9,ko;q=0.4"}).text
    for html in (page, asked):
        assert '<html lang="ko">' in html and "테넌트별 지출" in html and "지출 (KRW)" in html
    assert '<html lang="en">' in english and "Spend by tenant" in english and "Spend (KRW)" in english
    assert '"Noto Sans KR"' in page and '"Malgun Gothic"' in page and "svg text{font-family:" in page
    assert by_testid(page, "total-cost") == krw(total["cost_usd"]) == by_testid(english, "total-cost")
    assert re.fullmatch(r"\d{1,3}(,\d{3})*", by_testid(page, "total-cost")), "to the won: no decimals"
    for row in cells(page, "tenant-row"):
        assert row[5] == krw(by_tenant[row[0]]["cost_usd"]), row
    assert "1,385.5 KRW" in by_testid(page, "currency") and "2020-01-01" in by_testid(page, "currency")
    first, after = parse_month(month)
    assert f"{first:%Y-%m-%d} ~ " in by_testid(page, "range")
    assert 'data-testid="lang-ko"' in page and 'data-testid="lang-en"' in page
    refused = httpx.get(gateway.url + "/reports", params={"lang": "fr"}, headers=FINANCE)
    assert refused.status_code == 400 and "lang takes one of en, ko" in refused.text

    # the drill-down: the Korean cost centre in its table, and drawn in its chart's legend
    demo = httpx.get(gateway.url + "/reports", params={"month": month, "tenant": "demo", "lang": "ko"},
                     headers=FINANCE, timeout=60).text
    assert [r[0] for r in cells(demo, "drill-tag")] == [TAG]
    assert "테넌트 demo" in by_testid(demo, "drill-title")

    # the statement: the same figures and the same period, in Korean, on the page and in the workbook
    statement = httpx.get(gateway.url + "/admin/statements", params={"month": month}, headers=FINANCE,
                          timeout=60).json()
    printed = httpx.get(gateway.url + "/admin/statements", params={"month": month, "format": "html", "lang": "ko"},
                        headers=FINANCE, timeout=60).text
    assert '<html lang="ko">' in printed and "테넌트별 요약" in printed and '"Noto Sans KR"' in printed
    period = f"{first:%Y-%m-%d} ~ {money.period(first, after)[-10:]}"
    assert by_testid(printed, "period") == f"{period} (UTC)"
    summary_total = cells(printed, "summary-total")[0]
    assert summary_total[0] == "합계" and summary_total[5] == krw(statement["total"]["cost_usd"])
    assert summary_total[6] == krw(statement["total"]["gpu_cost_usd"])
    assert "0.5원" in by_testid(printed, "rounding")
    book = openpyxl.load_workbook(io.BytesIO(httpx.get(
        gateway.url + "/admin/statements", params={"month": month, "format": "xlsx", "lang": "ko"},
        headers=FINANCE, timeout=60).content))
    assert book.sheetnames[:2] == ["테넌트별 요약", "모델별"]
    sheet = book["테넌트별 요약"]
    assert [c.value for c in sheet[1]][:6] == ["테넌트", "요청 수", "입력 토큰", "출력 토큰", "캐시된 토큰",
                                               "정가 기준 지출 (KRW)"]
    last = sheet[sheet.max_row]
    assert last[0].value == "합계" and last[5].number_format == "#,##0"
    assert krw_shown(last[5].value) == summary_total[5], "a spreadsheet shows the page's figure"
    items = {r[0]: r[1] for r in book["명세서"].iter_rows(min_row=2, values_only=True)}
    assert items["기간 (UTC)"] == period and "1,385.5 KRW" in items["통화"]

    # in a browser: the page and the statement as a Korean reader sees them (the README's screenshots, when
    # TOLLGATE_SCREENSHOT_DIR says where), Hangul drawn in a Korean face, not in boxes
    shots = Path(os.environ.get("TOLLGATE_SCREENSHOT_DIR", tmp_path))
    faces = subprocess.run(["fc-list", ":lang=ko", "family"], capture_output=True, text=True, check=True).stdout
    assert faces.strip(), "no Korean face for the browser (scripts/ensure-debian-tools installs fonts-nanum)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        view = browser.new_page(viewport={"width": 1100, "height": 900}, locale="ko-KR")
        view.goto(f"{gateway.url}/reports?lang=ko&month={month}")
        view.fill("input[name=token]", FINANCE_TOKEN)
        view.click("button[type=submit]")
        view.wait_for_selector("[data-testid=total-cost]")
        assert view.inner_text("[data-testid=total-cost]") == krw(total["cost_usd"])
        view.screenshot(path=str(shots / "finance-page-ko.png"), full_page=True)
        view.goto(f"{gateway.url}/admin/statements?month={month}&format=html&lang=ko")
        assert view.inner_text("[data-testid=summary-total] td >> nth=0") == "합계"
        view.screenshot(path=str(shots / "statement-ko.png"))
        browser.close()
    assert all((shots / name).stat().st_size > 10_000 for name in ("finance-page-ko.png", "statement-ko.png"))

    # the catalogue: the Korean page says none of the English texts it translates
    for html in (page, demo, printed):
        text = re.sub(r"<[^>]+>", "\n", re.sub(r"<style>.*?</style>", "", html, flags=re.S))
        lines = {line.strip() for line in text.splitlines()}
        assert not lines & {k for k in words.KO if len(k) > 4 and words.KO[k] != k}, lines & set(words.KO)


def krw_shown(value: float) -> str:
    """A number as a spreadsheet shows it under "#,##0"."""
    won = Decimal(repr(value)).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return f"{won:,}"


def test_the_sign_in_form_speaks_the_language_asked_for(start_gateway: Callable[..., Proc],
                                                        start_sim: Callable[..., Proc]) -> None:
    gateway = start_gateway(policy_dict([start_sim().url]))
    korean = httpx.get(gateway.url + "/reports", headers={"Accept-Language": "ko"})
    assert korean.status_code == 200 and '<html lang="ko">' in korean.text and "재무 또는 관리자 토큰" in korean.text
    odd = httpx.get(gateway.url + "/reports", params={"lang": "fr"})
    assert odd.status_code == 200 and "Finance or admin token" in odd.text, "the form refuses nothing"
