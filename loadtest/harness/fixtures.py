"""The test policy's keys, the benchmarks' key, and reading a metric: shared by the suite (tests/conftest.py) and
the benchmarks, which never import tests/ (the installed loadtest package has no tests beside it). The policies
themselves are built by loadtest.harness.policy."""

from __future__ import annotations

import httpx

DEMO_KEY = "tg-test-demo-key"
PREMIUM_KEY = "tg-test-premium-key"
BATCH_KEY = "tg-test-batch-key"
ADMIN_TOKEN = "tg-test-admin-token"
FINANCE_TOKEN = "tg-test-finance-token"
BENCH_KEY = "tg-bench-key"  # the ``bench`` policy's tenant, and the cache and hardening benches' own tenant


def metric_value(url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples (matching labels) from a /metrics endpoint, via prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    text = httpx.get(url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def gauge(text: str, name: str) -> float:
    """Sum of the samples of a /metrics page's lines that start with ``name`` (e.g. ``vllm:num_requests_running{``)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))
