"""What a request cost: the price version in force on its day, its tokens, its class and how it was served.

Prices are per million tokens. Prompt tokens vLLM served from its prefix cache are priced at the cached rate;
a Batch API line gets the batch discount; a cache hit costs ``cache_hit_factor`` of the fresh price of the
tokens it saved (0 by default). The version id ("model@date") is kept on the record, so any cost can be
recomputed from the record and the policy's price history (``recompute``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from gateway.policy.schema import Prices, PriceVersion, Tier


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


def version_on(prices: Prices, model: str | None, day: date) -> PriceVersion | None:
    """The latest version effective on ``day``; None if the model has no price then."""
    if model is None:
        return None
    current = None
    for version in prices.models.get(model, ()):
        if version.effective <= day and (current is None or version.effective > current.effective):
            current = version
    return current


def cost(prices: Prices, version: PriceVersion, usage: Usage, service_class: Tier, batch_line: bool,
         cache_hit: bool) -> float:
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    cached_rate = version.input_per_m if version.cached_input_per_m is None else version.cached_input_per_m
    fresh = ((usage.prompt_tokens - cached) * version.input_per_m + cached * cached_rate
             + usage.completion_tokens * version.output_per_m) / 1e6
    factor = prices.class_multipliers.get(service_class, 1.0)
    if batch_line:
        factor *= 1 - prices.batch_api_discount
    if cache_hit:
        factor *= prices.cache_hit_factor
    return round(fresh * factor, 12)


def rates(prices: Prices, version: PriceVersion, service_class: Tier, batch_line: bool) -> tuple[float, float]:
    """USD per fresh prompt token and per completion token for a request of ``service_class`` (what ``cost``
    charges, before its rounding): a request's worst case is two multiplications."""
    factor = prices.class_multipliers.get(service_class, 1.0)
    if batch_line:
        factor *= 1 - prices.batch_api_discount
    return version.input_per_m * factor / 1e6, version.output_per_m * factor / 1e6


def version_id(model: str, version: PriceVersion) -> str:
    return f"{model}@{version.effective.isoformat()}"


def recompute(prices: Prices, price_version: str, usage: Usage, service_class: Tier, batch_line: bool,
              cache_hit: bool) -> float:
    """The cost a record should carry, from its price version id (for audits and tests)."""
    model, _, day = price_version.rpartition("@")
    version = next(v for v in prices.models[model] if v.effective.isoformat() == day)
    return cost(prices, version, usage, service_class, batch_line, cache_hit)


def plain(value: float | int | Decimal) -> str:
    """A number as a plain decimal, never in exponent notation: the float's own shortest digits, with at least
    two places (1e-05 reads 0.00001, 12 reads 12.00). The one money format of the page and the CSVs."""
    number = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
    if not number.is_finite():
        return str(number)
    whole, _, places = format(number, "f").partition(".")
    return f"{whole}.{places.ljust(2, '0')}"
