"""The policy's finance section: the organisation's currency, its rate versions validated once at load with
errors that say what to write."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.policy.schema import FinancePolicy


def test_rates_are_sorted_by_their_day() -> None:
    policy = FinancePolicy.model_validate({"currency": "KRW", "usd_rates": [
        {"effective": "2026-12-01", "per_usd": 1400}, {"effective": "2026-01-01", "per_usd": 1300}]})
    assert [v.per_usd for v in policy.usd_rates] == [1300, 1400]
    assert FinancePolicy().currency == "USD"


@pytest.mark.parametrize(("given", "says"), [
    ({"currency": "KRW"}, "currency KRW needs usd_rates"),
    ({"usd_rates": [{"effective": "2026-12-01", "per_usd": 1}]}, "set currency (KRW) or leave them out"),
    ({"currency": "EUR"}, "Input should be 'USD' or 'KRW'"),
    ({"currency": "KRW", "usd_rates": [{"effective": "2026-12-01", "per_usd": 0}]}, "greater than 0"),
    ({"currency": "KRW", "usd_rates": [{"effective": "2026-12-01", "per_usd": 1}, {"effective": "2026-12-01",
                                                                                   "per_usd": 2}]},
     "two currency rate versions share an effective date")])
def test_a_currency_without_its_rate_or_a_rate_without_its_currency_is_refused(given: dict[str, Any],
                                                                                 says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        FinancePolicy.model_validate(given)
    assert says in str(refused.value)
