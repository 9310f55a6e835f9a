"""The ledger's one time format, and the budget periods it is read by.

Records store their time as text in this format and range queries compare it as text (in SQLite and
PostgreSQL alike), so every writer and every query bound must format it here: fixed width, UTC, microseconds.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta

_day: tuple[int, date] = (-1, date(1970, 1, 1))
_second: tuple[int, str] = (0, "1970-01-01T00:00:00")  # the last whole second ``at`` formatted, and its text


def sortable(moment: datetime) -> str:
    """A moment as the ledger writes and compares it (a naive moment is taken as UTC). Written out by hand:
    strftime's %Y does not pad years before 1000 on Linux, and "1-01-01" sorts after "2026"."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return (f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:{moment.minute:02d}:"
            f"{moment.second:02d}.{moment.microsecond:06d}Z")


def at(timestamp: float) -> str:
    """A Unix time as the ledger writes it: the same text as ``sortable(datetime.fromtimestamp(timestamp, UTC))``,
    to the microsecond rounded as ``fromtimestamp`` rounds it (half to even). Called for every ledger record and
    log line, so the date and time of day are formatted once a second and only the microseconds each time."""
    global _second
    fraction, whole = math.modf(timestamp)
    micro = round(fraction * 1_000_000)
    second = int(whole)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    elif micro < 0:
        second, micro = second - 1, micro + 1_000_000
    last = _second  # one read: another thread may replace it meanwhile
    if last[0] != second:
        last = _second = (second, sortable(datetime.fromtimestamp(second, UTC))[:-8])
    return f"{last[1]}.{micro:06d}Z"


def utc_day(timestamp: float) -> date:
    """The UTC calendar day of a Unix time (the day a price is looked up on: twice per request, so the last
    day is kept rather than built from a datetime each time)."""
    global _day
    number = int(timestamp // 86400)
    if _day[0] != number:
        _day = (number, datetime.fromtimestamp(number * 86400, UTC).date())
    return _day[1]


def period_start(period: str, now: float) -> str:
    """Where the budget period (``day`` or ``month``, UTC) holding ``now`` began, in the ledger's format."""
    start = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        start = start.replace(day=1)
    return sortable(start)


def period_end(period: str, now: float) -> str:
    """Where the budget period holding ``now`` ends (the next one's start), in the ledger's format."""
    start = datetime.fromisoformat(period_start(period, now))
    if period == "month":
        index = start.year * 12 + start.month
        return sortable(start.replace(year=index // 12, month=index % 12 + 1))
    return sortable(start + timedelta(days=1))
