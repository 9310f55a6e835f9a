"""How finance is shown money and periods: the one formatter of the finance page, the statements (the printable
page and the workbook) and ``tollgate costs``.

The rules, the same on every surface:

- An **amount** (a spend, a budget, a GPU cost, a line or a total) is shown to the currency's minor unit (the
  cent for USD, the won for KRW: ``Currency.places``), rounded half away from zero (as a spreadsheet shows a
  number with the same format), with a comma between thousands: 0.207766759 USD is "0.21", 1234.5 is
  "1,234.50", -0.004 is "0.00" (never "-0.00").
- A **rate** (cost per 1,000 requests, per token, per worker-hour) keeps up to ``RATE_DIGITS`` significant
  digits, never fewer places than an amount, and no trailing zero past an amount's places: 0.0110625 is
  "0.01106", 12.3456 is "12.35", 0.000000125 is "0.000000125", 1234.567 is "1,234.57".
- Each figure is rounded from the ledger's own figure, never summed from rounded figures: a total is the ledger's
  sum, rounded once, so the sum of a table's N rounded lines may differ from its rounded total by up to N + 1
  half-units (``ROUNDING_NOTE``, which every statement prints). Lines that are whole cents sum to their total.
- A **period** is its first and its last day, both inclusive, in UTC: a month is "2026-12-01 to 2026-12-31"
  (``period``).

CSV and JSON carry the ledger's exact figures as plain decimals (gateway.ledger.prices.plain): they are data to
compute with, not documents to read. The workbook stores the exact figure as a number, in the format
(``excel_amount``, ``excel_rate``) under which a spreadsheet shows what the page shows.

The ledger keeps USD. The page and the statements show the organisation's currency (the policy's
``finance.currency``): ``display_currency`` is the one in force on a period's first day, with its rate per USD
from ``finance.usd_rates``, and a build shows its figures in it (``shown_in``, set on the report thread for the
build); ``amount`` and ``rate`` convert the ledger's USD figure first, then round. One rate a period: its lines
and its total are converted alike, so they add up as they do in USD. `tollgate costs` reads the API, in USD.
Why: docs/decisions/011-finance-in-its-own-terms.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from gateway.policy.schema import FinancePolicy

RATE_DIGITS = 4
ROUNDING_NOTE = ("Each amount is rounded to the {unit} from the ledger's exact figure, half away from zero; a total "
                 "is the exact sum rounded once, so the sum of its rounded lines may differ from it by up to half a "
                 "{unit} for each line, and half a {unit} more.")


@dataclass(frozen=True, slots=True)
class Currency:
    """A currency as shown: its code, its places (2 for the cent, 0 for the won), the name of its unit, and how
    many of it one USD is (``per_usd``), with the day that rate took effect."""

    code: str
    places: int
    unit: str
    per_usd: Decimal = Decimal(1)
    since: date | None = None


USD = Currency("USD", 2, "cent")
KRW = Currency("KRW", 0, "won")
CURRENCIES = {c.code: c for c in (USD, KRW)}
_shown: ContextVar[Currency] = ContextVar("tollgate_finance_currency", default=USD)


def display_currency(finance: FinancePolicy, day: date) -> Currency:
    """The currency a period beginning on ``day`` is shown in: USD, or the policy's with the rate version in force
    on ``day`` (the earliest version when ``day`` comes before them all)."""
    base = CURRENCIES[finance.currency]
    if base is USD or not finance.usd_rates:
        return USD
    versions = finance.usd_rates  # sorted by day at load
    chosen = next((v for v in reversed(versions) if v.effective <= day), versions[0])
    return replace(base, per_usd=Decimal(repr(chosen.per_usd)), since=chosen.effective)


@contextmanager
def shown_in(currency: Currency) -> Iterator[None]:
    """``amount``, ``rate`` and the workbook's figures in ``currency`` within this block, on this thread."""
    token = _shown.set(currency)
    try:
        yield
    finally:
        _shown.reset(token)


def current() -> Currency:
    """The currency figures are shown in now (USD outside ``shown_in``)."""
    return _shown.get()


def converted(value: float | int | Decimal, currency: Currency | None = None) -> Decimal:
    """A ledger figure in USD as an exact figure of ``currency`` (the one shown when None)."""
    shown = currency or _shown.get()
    number = exact(value)
    return number if shown.per_usd == 1 else number * shown.per_usd


def exact(value: float | int | Decimal | str) -> Decimal:
    """A figure as a Decimal: a float by its shortest repr (0.1 is 0.1, not its binary expansion)."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    try:
        return Decimal(value)
    except InvalidOperation:
        raise ValueError(f"not a number: {value!r}") from None


def _render(number: Decimal, places: int) -> str:
    rounded = number.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    if rounded == 0:
        rounded = abs(rounded)  # never "-0.00"
    return f"{rounded:,.{places}f}"


def amount(value: float | int | Decimal | None, currency: Currency | None = None) -> str:
    """A ledger amount (USD) in ``currency`` (the one shown when None), to its minor unit ("-" for none)."""
    if value is None:
        return "-"
    shown = currency or _shown.get()
    number = converted(value, shown)
    if not number.is_finite():
        return str(number)
    return _render(number, shown.places)


def rate_places(value: float | int | Decimal, currency: Currency = USD) -> int:
    """``value`` is already in ``currency``."""
    # the places a rate is shown with: enough for RATE_DIGITS significant digits, at least an amount's, and no
    # trailing zero past an amount's (0.000000125 keeps nine places, 0.0110625 five, 12.3456 two)
    number = exact(value)
    if number == 0 or not number.is_finite():
        return currency.places
    leading = number.copy_abs().adjusted()  # the power of ten of the first significant digit
    places = max(currency.places, RATE_DIGITS - 1 - leading)
    digits = number.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP).as_tuple().digits
    while places > currency.places and digits and digits[-1] == 0:
        places, digits = places - 1, digits[:-1]
    return places


def rate(value: float | int | Decimal | None, currency: Currency | None = None) -> str:
    """A ledger rate (USD) in ``currency`` (the one shown when None), to RATE_DIGITS significant digits, at
    least to the minor unit ("-" for none)."""
    if value is None:
        return "-"
    shown = currency or _shown.get()
    number = converted(value, shown)
    if not number.is_finite():
        return str(number)
    return _render(number, rate_places(number, shown))


def excel_value(value: float | int) -> float | int:
    """A ledger figure (USD) as the workbook stores it, in the currency shown: a number, never text."""
    return value if _shown.get().per_usd == 1 else float(converted(value))


def excel_amount(currency: Currency | None = None) -> str:
    """The workbook's number format for an amount: a spreadsheet shows the cell as ``amount`` does."""
    places = (currency or _shown.get()).places
    return "#,##0" + ("." + "0" * places if places else "")


def excel_rate(value: float | int | Decimal, currency: Currency | None = None) -> str:
    """The workbook's number format for this ledger rate (USD): a spreadsheet shows its cell (``excel_value``)
    as ``rate`` does."""
    shown = currency or _shown.get()
    places = rate_places(converted(value, shown), shown)
    return "#,##0" + ("." + "0" * places if places else "")


def rounding_note(currency: Currency | None = None) -> str:
    return ROUNDING_NOTE.format(unit=(currency or _shown.get()).unit)


def period(start: datetime, end: datetime) -> str:
    """[start, end) in whole UTC days as its first and last day, inclusive: "2026-12-01 to 2026-12-31"."""
    return f"{start.date().isoformat()} to {(end - timedelta(microseconds=1)).date().isoformat()}"
