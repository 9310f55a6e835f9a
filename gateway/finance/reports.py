"""The cost report's figures and the ledger export's pages, as the edge answers them (gateway.http.reports:
/admin/reports/costs, /admin/ledger, /v1/usage).

A calendar month as a ledger range (``parse_month``); totals and rates per row (``with_rates``: cost per 1,000
requests, tokens per request); a tenant listed with zeros when it has no records (``every_tenant``); the cost
report's body, built on the report thread (gateway.finance.heavy) from one cursor over the store's sums, a chunk
at a time, never held whole (``costs``); and one page of the ledger export as its CSV or JSON bytes (``ledger_page``).

CSV has ISO times and plain numbers (money as plain decimals, never exponent notation; an absent value is an
empty cell), so it loads in pandas as typed, and text a spreadsheet would read as a formula starts with a quote
(``cell``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
from collections.abc import Generator, Iterable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.finance import heavy
from gateway.ledger.prices import plain
from gateway.ledger.stores import COLUMNS, OPEN_END, OPEN_START, LedgerStore

TOTALS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "cache_hits",
          "cache_saved_tokens", "errors")
MONTH = re.compile(r"([0-9]{4})-([0-9]{2})")
FIRST_YEAR, LAST_YEAR = 1970, 9998  # a month's end and the month before it stay inside the calendar
PAGE = 2000  # ledger records per store query while streaming
FORMULA = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet may read as the start of a formula


def parse_month(text: str) -> tuple[datetime, datetime]:
    """``YYYY-MM`` as the month's [first moment, the next month's first moment) in UTC."""
    match = MONTH.fullmatch(text)
    year, month = (int(match[1]), int(match[2])) if match else (0, 0)
    if not (FIRST_YEAR <= year <= LAST_YEAR and 1 <= month <= 12):
        raise InvalidRequest(f"month takes a calendar month as YYYY-MM ({FIRST_YEAR}-01 to {LAST_YEAR}-12), "
                             f"not '{text[:40]}'.", "invalid_month", param="month")
    first = datetime(year, month, 1, tzinfo=UTC)
    return first, datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def shown_range(start: str, end: str) -> dict[str, str | None]:
    """The range as a report states it: null for an open end."""
    return {"from": None if start == OPEN_START else start, "to": None if end == OPEN_END else end}


def every_tenant(rows: list[dict[str, Any]], names: Iterable[str]) -> list[dict[str, Any]]:
    """Rows by tenant, then a zero row for each named tenant that has none (in name order): the tenants with
    records keep the store's order ahead of them."""
    seen = {row["tenant"] for row in rows}
    return [*rows, *({"tenant": name, **dict.fromkeys(TOTALS, 0)} for name in sorted(names) if name not in seen)]


def sum_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: sum(r[k] or 0 for r in rows) for k in TOTALS}


def with_rates(row: dict[str, Any]) -> dict[str, Any]:
    requests = row["requests"] or 0
    row["cost_usd"] = round(row["cost_usd"] or 0.0, 9)
    row["cost_per_1k_requests_usd"] = round(row["cost_usd"] * 1000 / requests, 9) if requests else 0.0
    row["tokens_per_request"] = round(((row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)) / requests,
                                      2) if requests else 0.0
    return row


def cell(value: Any) -> Any:
    """A CSV cell: plain decimals, lowercase booleans, nothing for an absent value, and text a spreadsheet reads
    as text (a leading ' before what it would take for a formula: a tenant named "=HYPERLINK(...)")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | Decimal):
        return plain(value)
    if isinstance(value, str) and value.startswith(FORMULA):
        return "'" + value
    return value


def costs(store: LedgerStore, start: str, end: str, group_by: list[str], tenant: str | None, tag: str | None,
          names: list[str] | None, fmt: str) -> heavy.Spool:
    """The cost report's body (blocking: on the report thread): rows as the store sums them, in its order, each
    with its rates; with ``names`` (grouped by tenant alone) a zero row after them for each named tenant without
    records; the JSON's total the sum of the rows as shown."""
    total = dict.fromkeys(TOTALS, 0)

    def rows() -> Generator[dict[str, Any], None, None]:
        seen = set()
        with contextlib.closing(store.stream_totals(start, end, group_by, tenant, tag)) as chunks:
            for chunk in chunks:
                for row in chunk:
                    if names is not None:
                        seen.add(row["tenant"])
                    yield with_rates(row)
        if names is not None:
            yield from (with_rates({"tenant": name, **dict.fromkeys(TOTALS, 0)}) for name in sorted(names)
                        if name not in seen)

    def counted(source: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for row in source:
            for k in TOTALS:
                total[k] += row[k] or 0
            yield row

    body = heavy.Spool()
    # closed here, on the report thread, whatever happens: the store's cursor lives in this thread
    with contextlib.closing(rows()) as source:
        if fmt == "csv":
            keys = ["key_id" if g == "key" else g for g in group_by]
            body.csv([*keys, *TOTALS, "cost_per_1k_requests_usd", "tokens_per_request"],
                     ({k: cell(v) for k, v in row.items()} for row in source))
            return body
        head = orjson.dumps({"object": "cost_report", **shown_range(start, end), "group_by": group_by})
        body.write(head[:-1] + b',"data":')
        body.json_list(counted(source))
    body.write(b',"total":' + orjson.dumps(with_rates(total)) + b"}")
    return body


def ledger_page(store: LedgerStore, start: str, end: str, tenant: str | None, tag: str | None,
                after: tuple[str, str] | None, fmt: str) -> tuple[bytes, tuple[str, str] | None]:
    """A page of records after ``after`` as the export's bytes (blocking: on a thread), and where the next page
    starts (None: this was the last). The first page carries the CSV's header or the JSON's opening; the JSON's
    records after the first page each follow a comma."""
    rows = store.records(start, end, tenant, after, PAGE, tag)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, list(COLUMNS), lineterminator="\n")
        if after is None:
            writer.writeheader()
        writer.writerows({k: cell(v) for k, v in row.items()} for row in rows)
        body = out.getvalue().encode()
    else:
        items = b",".join(orjson.dumps(row) for row in rows)
        body = b'{"object":"list","data":[' + items if after is None else (b"," + items if rows else b"")
    return body, (rows[-1]["time"], rows[-1]["id"]) if len(rows) == PAGE else None
