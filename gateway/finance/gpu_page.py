"""The finance page's GPU section: what the workers' hours cost, beside what the price list charged.

Drawn from the same report as GET /admin/reports/gpu (gateway.finance.gpu_costs.gather), so page and API agree:
GPU cost per tenant beside list-price spend, the idle share, utilisation by worker, GPU cost per 1,000 requests
by tier, and the cheapest configuration that would have met the SLO.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from html import escape
from typing import Any

from gateway.finance import money, words

say = words.say


def section(gpu: dict[str, Any], csv_range: str, tenant: str | None, names: Iterable[str]) -> str:
    """``names``: the policy's tenants, each listed (with zeros when it ran nothing). With ``tenant`` (a
    drill-down): that tenant's GPU cost alone, by tier; the workers' hours, their idle cost and the cheapest
    configuration are the fleet's, and stay on the all-tenants page."""
    if tenant is not None:
        return _own(gpu, csv_range, tenant)
    usage = [r for r in gpu["data"] if r["kind"] == "usage"]
    idle = [r for r in gpu["data"] if r["kind"] == "idle"]
    workers_cost = gpu["reconciliation"]["workers_cost_usd"]
    idle_cost = gpu["reconciliation"]["idle_usd"]
    attributed = gpu["reconciliation"]["attributed_usd"]
    successful = sum(r["successful_requests"] for r in usage)
    cards = "".join(
        f'<div class="card"><span class="muted">{say(label)}</span><b data-testid="{tid}">{value}</b></div>'
        for label, tid, value in (
            ("GPU cost: workers' hours (USD)", "gpu-total", money.amount(workers_cost)),
            ("Of it idle", "gpu-idle-share", f"{idle_cost / workers_cost * 100:.1f}%" if workers_cost else "-"),
            ("GPU cost per 1,000 requests", "gpu-per-1k",
             money.rate(attributed * 1000 / successful) if successful else "-")))
    by_tenant = _tenants(usage, idle, None, names)
    link = f"/admin/reports/gpu?format=csv&{csv_range}"
    return (f'<section data-testid="gpu-section"><h2>{say("GPU cost")} '
            f'<a class="csv" href="{link}&group_by=tenant" data-testid="gpu-csv">{say("CSV by tenant")}</a>'
            f'<a class="csv" href="{link}&group_by=worker,tenant">{say("CSV by worker")}</a></h2>'
            f'<p class="muted">{escape(say(WHAT))}</p>'
            f'<div class="cards">{cards}</div>{by_tenant}{_tiers(usage)}{_workers(gpu["workers"])}'
            f'{_cheapest(gpu["cheapest"])}</section>')


WHAT = ("What the workers cost by the hour (pools.<pool>.gpu_usd_per_hour), busy or not: each moment a worker ran "
        "requests is shared among the requests running then; the time it ran nothing is its idle cost, shown apart. "
        "Tenants plus idle equal the workers' hours at their rates.")
OWN = ("Only {tenant}'s share: each moment a worker ran its requests, shared among the requests running then. Other "
       "tenants' cost and the workers' idle hours are not this tenant's: they are on the all-tenants page.")


def _own(gpu: dict[str, Any], csv_range: str, tenant: str) -> str:
    """A drill-down's GPU section: the tenant's share of the workers' busy time, by tier, and nothing else."""
    usage = [r for r in gpu["data"] if r["kind"] == "usage" and r.get("tenant") == tenant]
    cost = sum(r["gpu_cost_usd"] for r in usage)
    successful = sum(r["successful_requests"] for r in usage)
    cards = "".join(
        f'<div class="card"><span class="muted">{escape(label)}</span><b data-testid="{tid}">{value}</b></div>'
        for label, tid, value in (
            (say("GPU cost of {tenant} (USD)", tenant=tenant), "gpu-total", money.amount(cost)),
            (say("GPU cost per 1,000 requests"), "gpu-per-1k", money.rate(cost * 1000 / successful) if successful
             else "-")))
    link = f"/admin/reports/gpu?format=csv&{csv_range}&tenant={urllib.parse.quote(tenant, safe='')}"
    return (f'<section data-testid="gpu-section"><h2>{escape(say("GPU cost of {tenant}", tenant=tenant))} '
            f'<a class="csv" href="{escape(link)}&amp;group_by=tenant" data-testid="gpu-csv">CSV</a></h2>'
            f'<p class="muted" data-testid="gpu-own">{escape(say(OWN, tenant=tenant))}</p>'
            f'<div class="cards">{cards}</div>{_tenants(usage, [], tenant, [tenant])}{_tiers(usage)}</section>')


def _tenants(usage: list[dict[str, Any]], idle: list[dict[str, Any]], tenant: str | None,
             names: Iterable[str]) -> str:
    def zero() -> dict[str, float]:
        return {"requests": 0, "successful": 0, "gpu_seconds": 0.0, "gpu": 0.0, "list": 0.0, "output": 0}

    totals = {name: zero() for name in names}
    for r in usage:
        t = totals.setdefault(r["tenant"], zero())
        t["requests"] += r["requests"]
        t["successful"] += r["successful_requests"]
        t["gpu_seconds"] += r["gpu_seconds"]
        t["gpu"] += r["gpu_cost_usd"]
        t["list"] += r["list_cost_usd"]
        t["output"] += r["completion_tokens"]
    rows = []
    for name, t in sorted(totals.items(), key=lambda kv: (-kv[1]["gpu"], kv[0])):
        if tenant is not None and name != tenant:
            continue
        per_1k = money.rate(t["gpu"] * 1000 / t["successful"]) if t["successful"] else "-"
        rows.append(f'<tr data-testid="gpu-tenant-row"><td>{escape(name)}</td><td>{int(t["requests"])}</td>'
                    f'<td>{t["gpu_seconds"]:.1f}</td>'
                    f'<td data-testid="gpu-tenant-cost">{money.amount(t["gpu"])}</td>'
                    f'<td>{money.amount(t["list"])}</td><td>{per_1k}</td></tr>')
    for r in idle:
        idle_name = escape(say("(idle) {worker}", worker=r["worker"]))
        rows.append(f'<tr data-testid="gpu-idle-row" class="muted"><td>{idle_name}</td><td>-</td>'
                    f'<td>{r["gpu_seconds"]:.1f}</td><td>{money.amount(r["gpu_cost_usd"])}</td><td>-</td><td>-</td></tr>')
    return (f'<h3>{say("GPU cost by tenant, beside list-price spend")}</h3><table data-testid="gpu-tenant-table">'
            + _heads("Tenant", "Requests", "GPU seconds", "GPU cost (USD)", "List-price spend (USD)",
                     "GPU cost per 1,000 requests")
            + ("".join(rows) or f'<tr><td colspan="6">{say("No worker time in this range.")}</td></tr>') + "</table>")


def _heads(*names: str) -> str:
    return "<tr>" + "".join(f"<th>{escape(say(n))}</th>" for n in names) + "</tr>"


def _tiers(usage: list[dict[str, Any]]) -> str:
    tiers: dict[str, list[float]] = {}
    for r in usage:
        t = tiers.setdefault(r.get("tier") or "-", [0.0, 0.0])  # sums of rounded rows: rounded again below
        t[0] += r["gpu_cost_usd"]
        t[1] += r["successful_requests"]
    rows = "".join(f'<tr data-testid="gpu-tier-row"><td>{escape(tier)}</td><td>{int(n)}</td>'
                   f'<td>{money.amount(cost)}</td><td>{money.rate(cost * 1000 / n) if n else "-"}</td></tr>'
                   for tier, (cost, n) in sorted(tiers.items()))
    return (f'<h3>{say("GPU cost per 1,000 requests by tier")}</h3><table>'
            + _heads("Tier", "Successful requests", "GPU cost (USD)", "Per 1,000 requests")
            + (rows or f'<tr><td colspan="4">{say("None.")}</td></tr>') + '</table>')


def _workers(workers: list[dict[str, Any]]) -> str:
    rows = "".join(
        f'<tr data-testid="gpu-worker-row"><td>{escape(w["worker"])}</td><td>{escape(str(w["pool"] or "-"))}</td>'
        f'<td>{"-" if w["usd_per_hour"] is None else money.rate(w["usd_per_hour"])}</td>'
        f'<td>{w["configured_hours"]:.3f}</td><td>{w["busy_hours"]:.3f}</td><td>{w["idle_hours"]:.3f}</td>'
        f'<td>{w["down_hours"]:.3f}</td><td>{_bar(w["utilisation"])}</td><td>{money.amount(w["cost_usd"])}</td>'
        f'<td>{money.amount(w["idle_cost_usd"])}</td></tr>' for w in workers)
    return (f'<h3>{say("Utilisation by worker")}</h3><table data-testid="gpu-worker-table">'
            + _heads("Worker", "Pool", "USD per hour", "Hours paid", "Busy", "Idle", "Of it down", "Utilisation",
                     "Cost (USD)", "Idle cost (USD)")
            + (rows or f'<tr><td colspan="10">{say("No worker seen in this range.")}</td></tr>') + "</table>")


def _cheapest(pools: list[dict[str, Any]]) -> str:
    lines = []
    for p in pools:
        slo = say("met the TTFT objective" if p["meets_slo"] else "missed the TTFT objective")
        floor = "" if p["meets_slo"] else say(": a floor, as the objective was missed")
        p95 = ", ".join(f"{t} p95 {v:.0f} ms" for t, v in sorted(p["ttft_p95_ms"].items())) or say("no TTFT")
        lines.append(f'<li data-testid="cheapest"><b>{escape(p["pool"])}</b>: ' + escape(say(
            CHEAPEST, ran=f'{p["workers_ran"]:.2f}', cost_ran=money.amount(p["cost_ran_usd"]), slo=slo, p95=p95,
            needed=f'{p["workers_needed"]:.2f}', cost_needed=money.amount(p["cost_needed_usd"]),
            saving=_saving(p["cost_ran_usd"] - p["cost_needed_usd"]), floor=floor,
            capacity=p["capacity_per_worker"])) + "</li>")
    return (f'<h3>{say("The cheapest configuration for this traffic")}</h3>'
            + (f"<ul>{''.join(lines)}</ul>" if lines
               else f'<p class="muted">{say("No worker time in this range.")}</p>'))


CHEAPEST = ("ran {ran} workers on average for {cost_ran} USD ({slo}: {p95}); for the same traffic the scaling rules "
            "would have run {needed} for {cost_needed} USD ({saving}{floor}), a worker at its scale-out mark holding "
            "{capacity} requests at once, the most one held.")


def _saving(amount: float) -> str:
    if not money.amount(amount).strip("0.,"):
        return say("no saving")
    if amount > 0:
        return say("{amount} USD less", amount=money.amount(amount))
    return say("{amount} USD more: the pool was short", amount=money.amount(-amount))


def _bar(share: float) -> str:
    used = max(0.0, min(share, 1.0))
    return (f'<svg width="100" height="10"><rect width="100" height="10" fill="#eef1f5"/>'
            f'<rect width="{100 * used:.1f}" height="10" fill="#3b6ea5"/></svg> {share * 100:.1f}%')
