"""A budget refusal in plain words and plain decimals: what is left against what the request could cost."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from gateway.policy.schema import Budget
from gateway.spend.counters import NANO
from gateway.spend.service import refusal

NOW = datetime(2026, 11, 30, 15, tzinfo=UTC).timestamp()
EXPONENT = re.compile(r"\d[eE][-+]?\d")


def test_a_tenant_that_spent_nothing_is_told_what_is_left_not_that_it_used_its_budget() -> None:
    text = refusal("Tenant 'idle'", Budget(period="day", limit_usd=0.00001), 0, 0, 0.000512, NOW)
    assert "has 0.00001 USD left of its daily budget of 0.00001 USD" in text
    assert "could cost up to 0.000512 USD" in text and "resets at 2026-12-01 00:00 UTC" in text
    assert "used" not in text and "dayly" not in text and not EXPONENT.search(text)


def test_a_budget_with_nothing_left_says_so_with_what_is_held_and_when_it_resets() -> None:
    text = refusal("Tenant 'x'", Budget(period="month", limit_usd=5), 5 * NANO, NANO // 4, 0.01, NOW)
    assert text == ("Tenant 'x' has nothing left of its monthly budget of 5.00 USD (5.00 spent, and 0.25 is held by "
                    "requests in flight); it resets at 2026-12-01 00:00 UTC.")
