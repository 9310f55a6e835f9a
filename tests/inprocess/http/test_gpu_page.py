"""The finance page's GPU section, rendered from a real report: tenants beside idle, every tenant listed."""

from __future__ import annotations

from gateway.finance.gpu import report
from gateway.finance.gpu_page import section
from gateway.finance.sizing import cheapest
from gateway.policy.schema import Policy
from tests.inprocess.ledger.test_gpu import T0, A, presence, record


def test_idle_is_its_own_row_and_a_quiet_tenant_shows_zeros() -> None:
    policy = Policy.model_validate({"allow_empty": True, "pools": {"gpu": {"workers": [A], "gpu_usd_per_hour": 36}}})
    r = report([record("busy", A, 0, 10)], [presence(A, 0, 100)], policy.pools, T0, T0 + 100, ["tenant", "tier"])
    out = r.public() | {"cheapest": [s.public() for s in cheapest(r, policy)]}
    html = section(out, "from=2026-11-03&to=2026-11-03", None, ["busy", "quiet"])
    assert html.count('data-testid="gpu-tenant-row"') == 2
    assert '<td>quiet</td><td>0</td><td>0.0</td><td data-testid="gpu-tenant-cost">0.00</td>' in html
    assert '<td data-testid="gpu-tenant-cost">0.10</td>' in html  # 10 s at a cent a second
    assert 'data-testid="gpu-idle-row"' in html and "0.90" in html  # the other 90 s, apart
    assert 'data-testid="gpu-idle-share">90.0%' in html
    assert "scaling rules would have run" in html
    only = section(out, "from=2026-11-03&to=2026-11-03", "quiet", ["busy", "quiet"])
    assert only.count('data-testid="gpu-tenant-row"') == 1
