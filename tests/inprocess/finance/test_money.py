"""One money formatter on every surface (gateway.finance.money): the same figure reads the same on the finance
page, the printable statement, the workbook (as a spreadsheet shows the cell under its number format) and
`tollgate costs`; rounded lines and their rounded total differ by no more than the statement says; a period
reads as its first and last day everywhere."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import openpyxl
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from openpyxl import Workbook
from rich.console import Console

from gateway import cli
from gateway.finance import money, page, statements
from gateway.ledger.prices import plain

# a ledger figure: nano-USD, below a million dollars (15 significant digits at most, as a spreadsheet keeps)
FIGURES = st.decimals(min_value=Decimal("-999999.999999999"), max_value=Decimal("999999.999999999"), places=9,
                      allow_nan=False, allow_infinity=False)


def spreadsheet_shows(value: float, number_format: str) -> str:
    """What a spreadsheet shows for ``value`` under a "#,##0.00"-style format: its places, half away from zero,
    a comma between thousands when the format has one."""
    match = re.fullmatch(r"#,##0(?:\.(0+))?", number_format)
    assert match is not None, number_format
    places = len(match[1] or "")
    shown = Decimal(repr(value)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{abs(shown) if shown == 0 else shown:,.{places}f}"


def on_the_page(value: float) -> str:
    row = {"tenant": "t", "requests": 1, "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0,
           "cost_usd": value}
    shown = page.Range.of({"month": "2026-12"}, 1.8e9)
    html = page._tenant_table({"by_tenant": [row], "budgets": [], "before": {}, "total": {"requests": 1}}, shown)
    found = re.search(r'data-testid="tenant-cost">([^<]*)<', html)
    assert found is not None
    return found[1]


def on_the_statement(value: float) -> str:
    html = statements._table(statements.SUMMARY, [{"tenant": "t", "cost_usd": value}], "summary")
    return re.findall(r'<td class="usd">([^<]*)</td>', html)[0]


def in_the_workbook(value: float) -> str:
    book = Workbook(write_only=True)
    statements._sheet(book, "s", statements.SUMMARY, [{"tenant": "t", "cost_usd": value}], total=False)
    data = io.BytesIO()
    book.save(data)
    cell = openpyxl.load_workbook(io.BytesIO(data.getvalue()))["s"]["F2"]
    assert cell.value == value, "the exact figure, as a number"
    return spreadsheet_shows(cell.value, cell.number_format)


def in_the_cli(value: float) -> str:
    out = io.StringIO()
    table = cli.fitted("t", ["tenant"], ["cost\nUSD"], [["t", money.amount(value)]], 80)
    Console(file=out, width=80).print(table)
    return out.getvalue().splitlines()[-2].split("│")[2].strip()


@settings(max_examples=60, deadline=None)
@given(figure=FIGURES)
def test_a_figure_reads_the_same_on_every_surface(figure: Decimal) -> None:
    value = float(figure)
    expected = money.amount(figure)
    assert re.fullmatch(r"-?\d{1,3}(,\d{3})*\.\d\d", expected), expected
    assert abs(Decimal(expected.replace(",", "")) - figure) <= Decimal("0.005")
    for surface in (on_the_page, on_the_statement, in_the_workbook, in_the_cli):
        assert surface(value) == expected, surface.__name__


def test_the_old_plain_decimals_differ_between_surfaces() -> None:
    """Positive control: a surface still printing the ledger's plain decimals (as the page did) is caught."""
    assert find(FIGURES, lambda d: plain(float(d)) != in_the_workbook(float(d))) is not None


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(FIGURES, min_size=1, max_size=40))
def test_rounded_lines_differ_from_their_rounded_total_by_no_more_than_the_statement_says(lines: list[Decimal]
                                                                                         ) -> None:
    total = money.amount(sum(lines, Decimal(0)))
    added = sum((Decimal(money.amount(x).replace(",", "")) for x in lines), Decimal(0))
    gap = abs(added - Decimal(total.replace(",", "")))
    assert gap <= Decimal("0.005") * (len(lines) + 1)  # half a cent per line, and half a cent for the total
    assert "half a cent for each line, and half a cent more" in money.rounding_note()


@settings(max_examples=200, deadline=None)
@given(cents=st.lists(st.integers(min_value=-10**8, max_value=10**8), min_size=1, max_size=40))
def test_lines_in_whole_cents_sum_to_their_total_exactly(cents: list[int]) -> None:
    lines = [Decimal(c).scaleb(-2) for c in cents]
    total = Decimal(money.amount(sum(lines, Decimal(0))).replace(",", ""))
    assert sum(Decimal(money.amount(x).replace(",", "")) for x in lines) == total


@pytest.mark.parametrize(("value", "shown"), [(0.0110625, "0.01106"), (12.3456, "12.35"), (0.000000125, "0.000000125"),
                                              (1234.567, "1,234.57"), (0, "0.00"), (17.3125, "17.31"),
                                              (-0.00004567, "-0.00004567")])
def test_a_rate_keeps_four_significant_digits_and_never_fewer_places_than_an_amount(value: float, shown: str) -> None:
    assert money.rate(value) == shown


@settings(max_examples=100, deadline=None)
@given(figure=FIGURES.filter(lambda d: d != 0))
def test_a_rate_keeps_four_significant_digits(figure: Decimal) -> None:
    shown = Decimal(money.rate(figure).replace(",", ""))
    assert abs(shown - figure) <= abs(figure) * Decimal("0.0005") + Decimal("0.005") * (abs(figure) >= 1000)


def test_amounts_are_to_the_cent_and_never_negative_zero() -> None:
    assert [money.amount(v) for v in (0.207766759, 1234.5, -0.004, 0.005, 1e-05)] == \
        ["0.21", "1,234.50", "0.00", "0.01", "0.00"]
    assert money.amount(12345.6, money.KRW) == "12,346"


def test_a_month_reads_as_its_first_and_last_day_on_the_page_and_the_statement() -> None:
    first, after = datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    assert money.period(first, after) == "2026-12-01 to 2026-12-31"
    assert "2026-12-01 to 2026-12-31" in page.Range.of({"month": "2026-12"}, 1.8e9).describe()
    out: dict[str, Any] = {"from": "2026-12-01T00:00:00.000000Z", "to": "2027-01-01T00:00:00.000000Z"}
    assert statements.period_of(out) == "2026-12-01 to 2026-12-31"
