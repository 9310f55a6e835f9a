"""GET /admin/reports/gpu: what the GPUs cost, per tenant (or model, tier, class, worker, tag, key), with each
worker's idle cost as its own row, its hours, and the cheapest configuration that would have met the SLO. With
``tenant=``, that tenant's GPU cost alone (its rows; nothing of the fleet's idle hours or other tenants).

``from`` and ``to`` as the cost report takes them; a GPU bills whether used or not, so the period is always
closed: ``from`` defaults to the start of this UTC month and ``to`` to now. The arithmetic is
gateway.finance.gpu's and the body gateway.finance.gpu_costs.document's, on the report thread
(gateway.finance.heavy: one build at a time, off the event loop), over the ledger's records and the workers'
presence spans in the shared store, so every replica answers the same report.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import InvalidRequest
from gateway.finance import gpu, heavy
from gateway.finance import gpu_costs as gpu_costs_
from gateway.http.guards import gateway_of, require_reader
from gateway.http.reports import attachment, download_name, ledger_store, parse_format, parse_tenant, time_range
from gateway.http.responses import NOSNIFF, spooled
from gateway.ledger.stores import OPEN_END, OPEN_START
from gateway.ledger.times import at


def gpu_range(request: Request, now: float) -> tuple[float, float]:
    """The period as Unix times: ``month``, or ``from`` and ``to`` as the cost report takes them, an open start
    being this UTC month's first moment and an open end, or one still to come, now."""
    first, after = time_range(request)
    if first == OPEN_START:
        start = datetime.fromtimestamp(now, UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()
    else:
        start = gpu.epoch(first)
    end = now if after == OPEN_END else min(now, gpu.epoch(after))  # what is to come has cost nothing yet
    if start >= end:
        raise InvalidRequest("The period is empty: 'from' must come before 'to' (an open 'from' is the start of "
                             "this month).", "invalid_range", param="from")
    return start, end


def parse_groups(text: str) -> list[str]:
    groups = [g.strip() for g in text.split(",") if g.strip()]
    if not groups or any(g not in gpu.GROUPS for g in groups) or len(set(groups)) != len(groups):
        raise InvalidRequest(f"group_by takes distinct names from: {', '.join(gpu.GROUPS)}.", "invalid_group_by",
                             param="group_by")
    return groups


async def gpu_costs(request: Request) -> Response:
    """The report, read, swept and written on the report thread alone (gateway.finance.heavy: a second build
    meanwhile is a 503 with Retry-After)."""
    await require_reader(request)
    start, end = gpu_range(request, time.time())
    group_by = parse_groups(request.query_params.get("group_by", "tenant"))
    fmt = parse_format(request)
    gw = gateway_of(request)
    store = ledger_store(request)
    tenant = await parse_tenant(request, store)
    live = gw.presence.live(time.time()) if gw.presence is not None else []
    names = sorted(gw.store.current.tenants) if group_by == ["tenant"] else []
    body = await heavy.build(f"gpu by {','.join(group_by)} {fmt}", gpu_costs_.document, store,
                             gw.store.current.policy, start, end, group_by, live, names, tenant, fmt)
    if fmt == "csv":
        name = download_name("gpu", at(start), at(end), month=request.query_params.get("month"), tenant=tenant,
                             group_by=group_by)
        return spooled(body, "text/csv; charset=utf-8", {"content-disposition": attachment(name), **NOSNIFF})
    return spooled(body, "application/json")


ROUTES = [Route("/admin/reports/gpu", gpu_costs, methods=["GET"])]
