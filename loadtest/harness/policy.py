"""The one policy builder of the benchmarks and the suite: a base, its pool on the given workers, and the few
switches the benchmarks turn.

Bases:

- ``test``: the suite's policy: tenants demo (standard), prem (premium), bulk (batch, reject above cap), the
  admin and finance tokens, two price versions; its pool is ``main``.
- ``default``: policies/default.yaml with its chat pool (``local-sim``) on the workers and without its embedding
  model: the benches start chat workers only, and a pool with no healthy worker keeps a gateway unready.
- ``bench``: the least a request needs, plus a price and a budget so the ledger prices every request and the
  budget and anomaly checks run: one tenant ``bench`` (key ``fixtures.BENCH_KEY``), its pool ``p``.

Switches: ``scheduling`` sets the scheduling section to that mode alone; ``cache`` sets cache.enabled; every
other keyword goes into the base's pool (``gpu_usd_per_hour=2.5``, ``keepalive_s=0.001`` ...).
"""

from __future__ import annotations

from typing import Any, Literal

import yaml

from gateway.auth import hash_key
from loadtest.harness.fixtures import ADMIN_TOKEN, BATCH_KEY, BENCH_KEY, DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY
from loadtest.harness.procs import ROOT

Base = Literal["test", "default", "bench"]
POOL = {"test": "main", "default": "local-sim", "bench": "p"}


def build_policy(workers: list[str], base: Base = "test", *, model: str = "sim-llama-8b",
                 scheduling: str | None = None, cache: bool | None = None, **pool: Any) -> dict[str, Any]:
    """A policy dict of ``base`` on ``workers`` (the module docstring says what each base holds)."""
    if base == "test":
        policy = _test(workers, model)
    elif base == "default":
        policy = _default(workers)
    elif base == "bench":
        policy = _bench(workers, model)
    else:
        raise ValueError(f"no policy base {base!r}: test, default or bench")
    policy["pools"][POOL[base]].update(pool)
    if cache is not None:
        policy.setdefault("cache", {})["enabled"] = cache
    if scheduling is not None:
        policy["scheduling"] = {"mode": scheduling}
    return policy


def _test(workers: list[str], model: str) -> dict[str, Any]:
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
                           "connect_timeout_s": 1.0, "read_timeout_s": 10.0}},
    }


def _default(workers: list[str]) -> dict[str, Any]:
    policy = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    policy["pools"]["local-sim"]["workers"] = workers
    embed = {name for name, route in policy["models"].items() if route.get("kind") == "embed"}
    for name in embed:
        policy["pools"].pop(policy["models"].pop(name)["pool"], None)
        policy["prices"]["models"].pop(name, None)
    for tenant in policy["tenants"].values():
        tenant["models"] = [m for m in tenant.get("models", []) if m not in embed]
        cached = tenant.get("cache", {}).get("models", {})
        for name in embed & cached.keys():
            del cached[name]
    return policy


def _bench(workers: list[str], model: str) -> dict[str, Any]:
    return {"tenants": {"bench": {"tier": "standard", "keys": ["sha256:" + hash_key(BENCH_KEY)],
                                  "budget": {"period": "month", "limit_usd": 1e6}}},
            "models": {model: {"pool": "p"}},
            "prices": {"models": {model: [{"effective": "2026-01-01", "input_per_m": 0.2, "output_per_m": 0.6}]}},
            "pools": {"p": {"workers": workers, "max_connections": 512}}}
