"""Spend: the cost-anomaly rule and the budget check at admission, and the settlement at finish.

``admit`` runs after the cache (a hit costs nothing to reserve) and before the scheduler (a downgrade changes
the class). It prices the request as usually sized (the prompt estimate + max_tokens for every sequence) for the
tenant's anomaly rule, then reserves its true worst case (every body byte a prompt token, plus a Responses
follow-up's stored conversation: Call.worst_tokens) against the tenant's budget: refused with 429
``insufficient_quota`` when spent + reserved + this would pass the limit, so concurrent requests cannot
overshoot it together, whatever their bodies hold (n, best_of, a list of prompts, text near one token a byte,
a long conversation continued), on one replica or many (the reservation is one atomic step in Redis): spend
stays within the limit plus one request's reservation. ``settle`` (from accounting, once per request) swaps the
reservation for the actual cost. Redis failing does not stop traffic: the budget is not enforced
while it is down (logged and counted), and the ledger, the truth, reseeds the counter when it is back.

A runtime key with a budget of its own (gateway.keys) is held to it beside its tenant's: the request reserves
its worst case against both (a key's counter is "#<key id>", a name no tenant can have, seeded from the ledger's
records of that key), is refused when either would pass, and settles both.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway.context import RequestContext
from gateway.errors import InvalidRequest, OverBudget
from gateway.keys.model import lineage_of
from gateway.ledger import prices as pricing
from gateway.ledger import times
from gateway.ledger.prices import plain
from gateway.ledger.stores import OPEN_END, LedgerStore
from gateway.openai_api import Call, clamp_output
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import TenantView
from gateway.policy.schema import Budget, Tier
from gateway.spend.alerts import Alerts
from gateway.spend.anomaly import Baselines
from gateway.spend.counters import NANO, Counters, MemoryCounters, RedisCounters

if TYPE_CHECKING:
    from gateway.state import SharedState

log = logging.getLogger("tollgate.spend")


@dataclass(frozen=True, slots=True)
class Reservation:
    key: str
    rid: str  # what the counters hold it under: settling releases what they hold, not what we believe
    amount: int  # nano-USD; 0 when the counter did not answer (the reservation may still have been made)
    budget: Budget
    scope: str  # the tenant's name, or "#<key id>" for a key's own budget
    then: Reservation | None = None  # the request's other reservation (the tenant's and its key's)


def refusal(who: str, budget: Budget, spent: int, reserved: int, worst_usd: float, now: float) -> str:
    """Why a request was refused, in plain words and plain decimals: what is left of the budget against what
    this request could cost at most (its reservation), not "has used its budget" when nothing was spent."""
    limit = budget.limit_usd
    left = max(0.0, limit - (spent + reserved) / NANO)
    period = {"day": "daily", "month": "monthly"}.get(budget.period, budget.period)
    resets = datetime.fromisoformat(times.period_end(budget.period, now)).strftime("%Y-%m-%d %H:%M UTC")
    held = f", and {plain(round(reserved / NANO, 6))} is held by requests in flight" if reserved else ""
    if left <= 0:
        return (f"{who} has nothing left of its {period} budget of {plain(limit)} USD "
                f"({plain(round(spent / NANO, 6))} spent{held}); it resets at {resets}.")
    return (f"{who} has {plain(round(left, 6))} USD left of its {period} budget of {plain(limit)} USD "
            f"({plain(round(spent / NANO, 6))} spent{held}), and this request could cost up to "
            f"{plain(round(worst_usd, 6))} USD (its prompt and max_tokens at the model's price). Lower max_tokens "
            f"or the prompt, or wait until the budget resets at {resets}.")


def _held(reservation: object | None) -> list[Reservation]:
    found = []
    while isinstance(reservation, Reservation):
        found.append(reservation)
        reservation = reservation.then
    return found


_RID_PREFIX = os.urandom(6).hex()  # reservation ids: unique across processes, no syscall per request
_rids = itertools.count()


def period_key(tenant: str, budget: Budget, now: float) -> str:
    day = datetime.fromtimestamp(now, UTC)
    return f"{tenant}:{day:%Y-%m-%d}" if budget.period == "day" else f"{tenant}:{day:%Y-%m}"


def _worst_usd(ctx: RequestContext, call: Call, prices: Any, version: Any, prompt: int, klass: Tier) -> float:
    """What a request costs at most with ``prompt`` prompt tokens and every sequence at its max_tokens."""
    per_prompt, per_output = pricing.rates(prices, version, klass, ctx.batch is not None)
    return prompt * per_prompt + call.max_output * call.sequences * per_output


class Spend:
    def __init__(self, metrics: GatewayMetrics, alerts: Alerts, ledger: LedgerStore | None,
                 state: SharedState | None = None) -> None:
        """``state``: with Redis, budgets are counted there (shared by replicas); else in this process."""
        self.metrics = metrics
        self.alerts = alerts
        self.ledger = ledger
        self.baselines = Baselines()
        self.counters: Counters = (RedisCounters(state) if state is not None and state.redis is not None
                                   else MemoryCounters())
        self._alerted: set[str] = set()  # period keys whose soft alert went out (this replica)
        self._seeding: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def admit(self, ctx: RequestContext, call: Call) -> Tier:
        """Apply the anomaly rule and reserve the worst case; returns the class the request runs in (its own,
        or batch when the rule downgrades it)."""
        tenant = ctx.tenant
        assert tenant is not None and ctx.model is not None
        prices = ctx.snapshot.policy.prices
        now = time.time()
        version = pricing.version_on(prices, ctx.model, times.utc_day(now))
        if version is None:
            return ctx.service_class  # an unpriced model: nothing to budget or compare
        klass = ctx.service_class
        per_prompt, per_output = pricing.rates(prices, version, klass, ctx.batch is not None)
        # The anomaly rule compares what a request may generate with the tenant's usual; an embeddings request
        # generates nothing (nothing to clamp), and its small costs would lower the usual of the tenant's chat.
        if call.max_output and not ctx.probe:  # a probe's prompts are the operator's, not the tenant's usual
            # the anomaly rule's measure of a request's size: its prompt as usually written, every sequence long
            usual_usd = call.prompt_estimate * per_prompt + call.max_output * call.sequences * per_output
            rule = tenant.anomaly
            if not self.baselines.known(tenant.name):
                await self._seed_baseline(tenant.name, now)
            baseline = self.baselines.baseline(tenant.name, rule)
            if usual_usd > rule.k * baseline:
                klass = self._anomaly(ctx, call, usual_usd, baseline, version)  # may clamp or downgrade
                per_prompt, per_output = pricing.rates(prices, version, klass, ctx.batch is not None)
            else:
                self.baselines.observe(tenant.name, usual_usd, rule)
        worst_usd = call.prompt_bound * per_prompt + call.max_output * call.sequences * per_output  # a bound
        await self._reserve_all(ctx, tenant, worst_usd, now)
        return klass

    async def switch(self, ctx: RequestContext, call: Call) -> None:
        """The request moves to a fallback model (``ctx.served_model``): its reservation is released and made
        again at that model's price, so what it can cost stays bounded by what was reserved."""
        tenant = ctx.tenant
        assert tenant is not None
        if ctx.reservation is not None:
            self.settle(ctx, 0.0)
            ctx.reservation = None
        now = time.time()
        prices = ctx.snapshot.policy.prices
        version = pricing.version_on(prices, ctx.served_model, times.utc_day(now))
        if version is None:
            return
        worst = _worst_usd(ctx, call, prices, version, call.prompt_bound, ctx.service_class)
        await self._reserve_all(ctx, tenant, worst, now)

    def _anomaly(self, ctx: RequestContext, call: Call, worst_usd: float, baseline: float,
                 version: Any) -> Tier:
        tenant = ctx.tenant
        assert tenant is not None
        rule = tenant.anomaly
        details = {"tenant": tenant.name, "request_id": ctx.request_id, "model": ctx.model,
                   "worst_case_usd": round(worst_usd, 9), "baseline_usd": round(baseline, 9), "k": rule.k}
        webhook = _webhook(ctx)
        if rule.action == "reject":
            self.alerts.raise_alert("request_cost", "reject", webhook, **details)
            raise InvalidRequest(f"This request could cost up to ${worst_usd:.6f}, over {rule.k:g}x this tenant's "
                                 f"usual ${baseline:.6f}; lower max_tokens or the prompt size.", "cost_anomaly",
                                 param="max_tokens")
        if rule.action == "clamp":
            fitted = _fit_max_tokens(ctx, call, rule.k * baseline, version)
            if fitted is not None:
                clamp_output(ctx, call, fitted, "clamped-anomaly")
                details["max_tokens"] = fitted
        self.alerts.raise_alert("request_cost", rule.action, webhook, **details)
        return "batch" if rule.action == "downgrade" else ctx.service_class

    async def _reserve_all(self, ctx: RequestContext, tenant: TenantView, worst_usd: float, now: float) -> None:
        """Reserve against every budget the request is held to; refused by one, what the others hold is left on
        the context for the request's settle to release."""
        held: Reservation | None = None
        try:
            for scope, budget in tenant.budget_scopes:
                held = replace(await self._reserve(ctx, tenant, scope, budget, worst_usd, now), then=held)
        finally:
            ctx.reservation = held

    async def _reserve(self, ctx: RequestContext, tenant: TenantView, scope: str, budget: Budget,
                       worst_usd: float, now: float) -> Reservation:
        key = period_key(scope, budget, now)
        limit = int(budget.limit_usd * NANO)
        # Past the limit a request is refused whatever its size: held to limit + 1, the counters' sums stay
        # within 64 bits for every amount the policy allows.
        amount = math.ceil(worst_usd * NANO) if worst_usd * NANO <= limit else limit + 1
        rid = f"{_RID_PREFIX}{next(_rids):x}"
        try:
            result = await self.counters.reserve(key, rid, amount, limit, None)
            if result is None:
                seed = await self._seed(tenant.name, budget, now, scope, lineage_of(tenant))
                result = await self.counters.reserve(key, rid, amount, limit, seed)
        except Exception as exc:  # the shared counter is down or slow: let traffic through, say so
            log.error("budget counter unavailable (%s): %s is not enforced", exc, scope)
            self.metrics.errors.labels(ctx.label, ctx.model or "none", "budget_store_down").inc()
            return Reservation(key, rid, 0, budget, scope)  # a reserve that ran late is released at settle
        assert result is not None
        granted, spent, reserved = result
        if scope == tenant.name:
            self.metrics.child(self.metrics.budget_remaining, tenant.name).set((limit - spent - reserved) / NANO)
        if not granted and scope != tenant.name:
            keys = lineage_of(tenant)
            who = f"API key '{keys[-1]}'" + (f" (rotated from '{keys[0]}', whose spend it carries)"
                                             if len(keys) > 1 else "")
            raise OverBudget(refusal(f"{who} of tenant '{tenant.name}'", budget, spent, reserved, worst_usd, now))
        if not granted:
            raise OverBudget(refusal(f"Tenant '{tenant.name}'", budget, spent, reserved, worst_usd, now))
        return Reservation(key, rid, amount, budget, scope)

    async def _seed_baseline(self, tenant: str, now: float) -> None:
        """A tenant first seen by this process: its baseline from the ledger's last day (once; concurrent first
        requests share the one query)."""
        pending = self._seeding.get(tenant)
        if pending is None:
            pending = self._seeding[tenant] = asyncio.ensure_future(self._baseline_from_ledger(tenant, now))
        try:
            await asyncio.shield(pending)
        except Exception as exc:  # no ledger answer: the rule's default baseline stands in until it learns
            log.warning("anomaly baseline for %s not seeded from the ledger: %s", tenant, exc)
        finally:
            self._seeding.pop(tenant, None)
            self.baselines.seed(tenant, 0.0, 0)  # known from now on, seeded or not

    async def _baseline_from_ledger(self, tenant: str, now: float) -> None:
        if self.ledger is None:
            return
        day_ago = times.at(now - 86_400)
        rows = await asyncio.to_thread(self.ledger.totals, day_ago, OPEN_END, [], tenant)
        if rows and rows[0]["requests"] and rows[0]["cost_usd"]:
            self.baselines.seed(tenant, rows[0]["cost_usd"] / rows[0]["requests"], int(rows[0]["requests"]))

    async def _seed(self, tenant: str, budget: Budget, now: float, scope: str | None = None,
                    lineage: tuple[str, ...] = ()) -> int:
        """The period's spend so far, from the ledger (the truth when the counter is new or was lost): the
        tenant's, or with a key's scope the records of the key and those it was rotated from."""
        if self.ledger is None:
            return 0
        start = times.period_start(budget.period, now)
        if scope is None or scope == tenant:
            rows = await asyncio.to_thread(self.ledger.totals, start, OPEN_END, [], tenant)
        else:
            ids = set(lineage or (scope[1:],))
            rows = [r for r in await asyncio.to_thread(self.ledger.totals, start, OPEN_END, ["key"], tenant)
                    if r["key_id"] in ids]
        return math.ceil(sum(r["cost_usd"] or 0.0 for r in rows) * NANO)

    def settle(self, ctx: RequestContext, cost_usd: float) -> None:
        """Once per request, from accounting: swap the reservation for the actual cost (in the background)."""
        tenant = ctx.tenant
        if tenant is None:
            return
        webhook = _webhook(ctx)
        rate = None if ctx.probe or cost_usd <= 0 else self.baselines.spend_rate_anomaly(
            tenant.name, cost_usd, time.time(), tenant.anomaly.k)
        if rate is not None:
            self.alerts.raise_alert("spend_rate", "alert", webhook, tenant=tenant.name,
                                    hour_usd=round(rate[0], 6), usual_hourly_usd=round(rate[1], 6))
        now = time.time()
        parts: list[tuple[str, Budget, str, str | None]] = [(r.scope, r.budget, r.key, r.rid)
                                                            for r in _held(ctx.reservation)]
        if cost_usd > 0:  # a budget it reserved nothing from (a priced cache hit, a store that was down) counts it
            held = {scope for scope, _, _, _ in parts}
            parts += [(scope, budget, period_key(scope, budget, now), None) for scope, budget in tenant.budget_scopes
                      if scope not in held]
        actual = math.ceil(cost_usd * NANO)
        for scope, budget, key, rid in parts:
            if isinstance(self.counters, MemoryCounters):
                self._settled(tenant, scope, budget, key, self.counters.settle_now(key, rid, actual), webhook)
                continue
            task = asyncio.get_running_loop().create_task(
                self._settle(tenant, scope, budget, key, rid, actual, webhook))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _settle(self, tenant: TenantView, scope: str, budget: Budget, key: str, rid: str | None,
                      actual: int, webhook: str | None) -> None:
        try:
            result = await self.counters.settle(key, rid, actual)
        except Exception as exc:
            log.error("budget counter unavailable at settlement (%s); the ledger keeps the cost", exc)
            return
        self._settled(tenant, scope, budget, key, result, webhook)

    def _settled(self, tenant: TenantView, scope: str, budget: Budget, key: str, result: tuple[int, int] | None,
                 webhook: str | None) -> None:
        if result is None:
            return
        spent, reserved = result
        limit = budget.limit_usd * NANO
        whose = {} if scope == tenant.name else {"key_id": scope[1:]}
        if not whose:
            self.metrics.child(self.metrics.budget_remaining, tenant.name).set((limit - spent - reserved) / NANO)
        if spent >= budget.alert_at * limit and key not in self._alerted:
            self._alerted.add(key)
            self.alerts.raise_alert("budget", "alert", webhook, tenant=tenant.name, **whose,
                                    period=key.split(":", 1)[1], spent_usd=round(spent / NANO, 6),
                                    limit_usd=budget.limit_usd, alert_at=budget.alert_at)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.counters.close()


def _webhook(ctx: RequestContext) -> str | None:
    url = ctx.snapshot.policy.spend.webhook_url
    return str(url) if url else None


def _fit_max_tokens(ctx: RequestContext, call: Call, allowed_usd: float, version: Any) -> int | None:
    """The largest max_tokens whose worst case stays within ``allowed_usd`` (at least 1)."""
    prices = ctx.snapshot.policy.prices
    prompt_only = pricing.cost(prices, version, pricing.Usage(call.prompt_estimate, 0), ctx.service_class,
                               ctx.batch is not None, False)
    per_token = pricing.cost(prices, version, pricing.Usage(0, 1_000_000), ctx.service_class,
                             ctx.batch is not None, False) / 1_000_000 * call.sequences
    if per_token <= 0:
        return None
    return max(1, min(call.max_output, int((allowed_usd - prompt_only) / per_token)))
