"""The finance page's GPU section: what the workers' hours cost, beside what the price list charged.

Drawn from the same report as GET /admin/reports/gpu (gateway.ops.gpu_costs.gather), so page and API agree:
GPU cost per tenant beside list-price spend, the idle share, utilisation by worker, GPU cost per 1,000 requests
by tier, and the cheapest configuration that would have met the SLO.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import Any

from gateway.ledger.prices import plain


def section(gpu: dict[str, Any], csv_range: str, tenant: str | None, names: Iterable[str]) -> str:
    """``names``: the policy's tenants, each listed (with zeros when it ran nothing)."""
    usage = [r for r in gpu["data"] if r["kind"] == "usage"]
    idle = [r for r in gpu["data"] if r["kind"] == "idle"]
    workers_cost = gpu["reconciliation"]["workers_cost_usd"]
    idle_cost = gpu["reconciliation"]["idle_usd"]
    attributed = gpu["reconciliation"]["attributed_usd"]
    successful = sum(r["successful_requests"] for r in usage)
    cards = "".join(
        f'<div class="card"><span class="muted">{label}</span><b data-testid="{tid}">{value}</b></div>'
        for label, tid, value in (
            ("GPU cost: workers' hours (USD)", "gpu-total", plain(workers_cost)),
            ("Of it idle", "gpu-idle-share", f"{idle_cost / workers_cost * 100:.1f}%" if workers_cost else "-"),
            ("GPU cost per 1,000 requests", "gpu-per-1k",
             plain(round(attributed * 1000 / successful, 6)) if successful else "-")))
    by_tenant = _tenants(usage, idle, tenant, names)
    link = f"/admin/reports/gpu?format=csv&{csv_range}"
    return (f'<section data-testid="gpu-section"><h2>GPU cost '
            f'<a class="csv" href="{link}&group_by=tenant" data-testid="gpu-csv">CSV by tenant</a>'
            f'<a class="csv" href="{link}&group_by=worker,tenant">CSV by worker</a></h2>'
            '<p class="muted">What the workers cost by the hour (pools.&lt;pool&gt;.gpu_usd_per_hour), busy or not: '
            'each moment a worker ran requests is shared among the requests running then; the time it ran '
            'nothing is its idle cost, shown apart. Tenants plus idle equal the workers\' hours at their rates.</p>'
            f'<div class="cards">{cards}</div>{by_tenant}{_tiers(usage)}{_workers(gpu["workers"])}'
            f'{_cheapest(gpu["cheapest"])}</section>')


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
        per_1k = plain(round(t["gpu"] * 1000 / t["successful"], 6)) if t["successful"] else "-"
        rows.append(f'<tr data-testid="gpu-tenant-row"><td>{escape(name)}</td><td>{int(t["requests"])}</td>'
                    f'<td>{t["gpu_seconds"]:.1f}</td>'
                    f'<td data-testid="gpu-tenant-cost">{plain(round(t["gpu"], 6))}</td>'
                    f'<td>{plain(round(t["list"], 9))}</td><td>{per_1k}</td></tr>')
    for r in idle:
        rows.append(f'<tr data-testid="gpu-idle-row" class="muted"><td>(idle) {escape(r["worker"])}</td><td>-</td>'
                    f'<td>{r["gpu_seconds"]:.1f}</td><td>{plain(r["gpu_cost_usd"])}</td><td>-</td><td>-</td></tr>')
    return ('<h3>GPU cost by tenant, beside list-price spend</h3><table data-testid="gpu-tenant-table"><tr>'
            '<th>Tenant</th><th>Requests</th><th>GPU seconds</th><th>GPU cost (USD)</th><th>List-price spend (USD)'
            '</th><th>GPU cost per 1,000 requests</th></tr>'
            + ("".join(rows) or '<tr><td colspan="6">No worker time in this range.</td></tr>') + "</table>")


def _tiers(usage: list[dict[str, Any]]) -> str:
    tiers: dict[str, list[float]] = {}
    for r in usage:
        t = tiers.setdefault(r.get("tier") or "-", [0.0, 0.0])  # sums of rounded rows: rounded again below
        t[0] += r["gpu_cost_usd"]
        t[1] += r["successful_requests"]
    rows = "".join(f'<tr data-testid="gpu-tier-row"><td>{escape(tier)}</td><td>{int(n)}</td>'
                   f'<td>{plain(round(cost, 6))}</td><td>{plain(round(cost * 1000 / n, 6)) if n else "-"}</td></tr>'
                   for tier, (cost, n) in sorted(tiers.items()))
    return ('<h3>GPU cost per 1,000 requests by tier</h3><table><tr><th>Tier</th><th>Successful requests</th>'
            f'<th>GPU cost (USD)</th><th>Per 1,000 requests</th></tr>{rows or "<tr><td colspan=4>None.</td></tr>"}'
            '</table>')


def _workers(workers: list[dict[str, Any]]) -> str:
    rows = "".join(
        f'<tr data-testid="gpu-worker-row"><td>{escape(w["worker"])}</td><td>{escape(str(w["pool"] or "-"))}</td>'
        f'<td>{"-" if w["usd_per_hour"] is None else plain(w["usd_per_hour"])}</td>'
        f'<td>{w["configured_hours"]:.3f}</td><td>{w["busy_hours"]:.3f}</td><td>{w["idle_hours"]:.3f}</td>'
        f'<td>{w["down_hours"]:.3f}</td><td>{_bar(w["utilisation"])}</td><td>{plain(w["cost_usd"])}</td>'
        f'<td>{plain(w["idle_cost_usd"])}</td></tr>' for w in workers)
    return ('<h3>Utilisation by worker</h3><table data-testid="gpu-worker-table"><tr><th>Worker</th><th>Pool</th>'
            '<th>USD per hour</th><th>Hours paid</th><th>Busy</th><th>Idle</th><th>Of it down</th><th>Utilisation'
            '</th><th>Cost (USD)</th><th>Idle cost (USD)</th></tr>'
            + (rows or '<tr><td colspan="10">No worker seen in this range.</td></tr>') + "</table>")


def _cheapest(pools: list[dict[str, Any]]) -> str:
    lines = []
    for p in pools:
        slo = "met the TTFT objective" if p["meets_slo"] else "missed the TTFT objective"
        floor = "" if p["meets_slo"] else ": a floor, as the objective was missed"
        p95 = ", ".join(f"{escape(t)} p95 {v:.0f} ms" for t, v in sorted(p["ttft_p95_ms"].items())) or "no TTFT"
        lines.append(
            f'<li data-testid="cheapest"><b>{escape(p["pool"])}</b>: ran {p["workers_ran"]:.2f} workers on average '
            f'for {plain(p["cost_ran_usd"])} USD ({slo}: {p95}); for the same traffic the scaling rules would have '
            f'run {p["workers_needed"]:.2f} for {plain(p["cost_needed_usd"])} USD '
            f'({_saving(p["cost_ran_usd"] - p["cost_needed_usd"])}{floor}), a worker at its scale-out mark '
            f'holding {p["capacity_per_worker"]} requests at once, the most one held.</li>')
    return ("<h3>The cheapest configuration for this traffic</h3>"
            + (f"<ul>{''.join(lines)}</ul>" if lines else '<p class="muted">No worker time in this range.</p>'))


def _saving(amount: float) -> str:
    amount = round(amount, 6)
    if amount == 0:
        return "no saving"
    return f"{plain(amount)} USD less" if amount > 0 else f"{plain(-amount)} USD more: the pool was short"


def _bar(share: float) -> str:
    used = max(0.0, min(share, 1.0))
    return (f'<svg width="100" height="10"><rect width="100" height="10" fill="#eef1f5"/>'
            f'<rect width="{100 * used:.1f}" height="10" fill="#3b6ea5"/></svg> {share * 100:.1f}%')
