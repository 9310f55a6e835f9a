"""The test policy and its keys, and reading a metric: shared by the suite (tests/conftest.py) and the
benchmarks, which never import tests/ (the installed loadtest package has no tests beside it)."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.auth import hash_key

DEMO_KEY = "tg-test-demo-key"
PREMIUM_KEY = "tg-test-premium-key"
BATCH_KEY = "tg-test-batch-key"
ADMIN_TOKEN = "tg-test-admin-token"
FINANCE_TOKEN = "tg-test-finance-token"


def policy_dict(workers: list[str], model: str = "sim-llama-8b", **pool: Any) -> dict[str, Any]:
    """A test policy: demo (standard), prem (premium), bulk (batch, reject above cap), admin token."""
    return {
        "version": 1,
        "server": {"max_body_bytes": 65536, "admin_token_sha256": "sha256:" + hash_key(ADMIN_TOKEN),
                   "finance_token_sha256": "sha256:" + hash_key(FINANCE_TOKEN)},
        "tiers": {
            "premium": {"max_tokens_default": 512, "max_tokens_cap": 4096, "on_exceed": "clamp"},
            "standard": {"max_tokens_default": 512, "max_tokens_cap": 1024, "on_exceed": "clamp"},
            "batch": {"max_tokens_default": 64, "max_tokens_cap": 256, "on_exceed": "reject"},
        },
        "tenants": {
            "demo": {"tier": "standard", "keys": ["sha256:" + hash_key(DEMO_KEY)], "models": ["*"]},
            "prem": {"tier": "premium", "keys": ["sha256:" + hash_key(PREMIUM_KEY)], "models": [model]},
            "bulk": {"tier": "batch", "keys": ["sha256:" + hash_key(BATCH_KEY)], "models": ["other-model"]},
        },
        "models": {model: {"pool": "main"}, "other-model": {"pool": "main"}},
        "prices": {"models": {model: [{"effective": "2026-01-01", "input_per_m": 0.2, "output_per_m": 0.6},
                                      {"effective": "2026-06-01", "input_per_m": 0.3, "output_per_m": 0.9,
                                       "cached_input_per_m": 0.1}]},
                   "class_multipliers": {"premium": 1.5, "standard": 1.0, "batch": 0.8}},
        "pools": {"main": {"workers": workers, "scrape_interval_s": 0.2, "cooldown_s": 1.0,
                           "connect_timeout_s": 1.0, "read_timeout_s": 10.0, **pool}},
    }


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
