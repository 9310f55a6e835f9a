"""The gateway's Prometheus metrics: stage histograms by tier and model, counters, worker gauges."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Fine at the low end: the gateway's own share is measured in microseconds to milliseconds.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        tm = ["tier", "model"]
        self.ttft = Histogram("tollgate_ttft_seconds", "Arrival to first upstream byte.", tm,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("tollgate_tpot_seconds", "Mean time per output token after the first.", tm,
                              buckets=TPOT_BUCKETS, registry=r)
        self.queue_wait = Histogram("tollgate_queue_wait_seconds", "Time held by the scheduler before dispatch.",
                                    tm, buckets=FAST_BUCKETS, registry=r)
        self.upstream_connect = Histogram("tollgate_upstream_connect_seconds", "Dispatch until the request head "
                                          "is written to the worker (pool wait + TCP connect).", tm,
                                          buckets=FAST_BUCKETS, registry=r)
        self.duration = Histogram("tollgate_request_duration_seconds", "Arrival to last byte sent.", tm,
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("tollgate_requests", "Requests answered.", [*tm, "status"], registry=r)
        self.errors = Counter("tollgate_errors", "Requests that ended in an error.", [*tm, "kind"], registry=r)
        self.tokens = Counter("tollgate_tokens", "Tokens by direction.", [*tm, "direction"], registry=r)
        self.upstream_connections = Counter("tollgate_upstream_connections_opened", "Connections opened to "
                                            "workers (few per request means keep-alive reuse).", ["pool"],
                                            registry=r)
        self.retries = Counter("tollgate_upstream_retries", "Requests retried on another worker.", ["pool"],
                               registry=r)
        window = "over the last 15 minutes, fleet-wide (the same on every replica: aggregate with max)"
        self.gpu_busy = Gauge("tollgate_gpu_busy_seconds", f"Seconds the worker ran a request, {window}.",
                              ["pool", "worker"], registry=r)
        self.gpu_idle = Gauge("tollgate_gpu_idle_seconds", f"Seconds the worker was configured and ran nothing "
                              f"(down included), {window}.", ["pool", "worker"], registry=r)
        self.gpu_per_1k = Gauge("tollgate_gpu_cost_per_1k_requests_usd", f"GPU cost of 1,000 successful requests "
                                f"(their share of the workers' busy time at the pools' rates), {window}.", ["tier"],
                                registry=r)
        self.worker_up = Gauge("tollgate_worker_healthy", "1 if the worker is admitted for routing.",
                               ["pool", "worker"], registry=r)
        self.pool_healthy = Gauge("tollgate_pool_healthy_workers", "Workers of the pool admitted for routing (at 0 "
                                  "its models are answered 503, or by a fallback).", ["pool"], registry=r)
        self.model_ready = Gauge("tollgate_model_ready", "1 while the model's own pool has a worker admitted for "
                                 "routing (at 0 a request may still be served by a fallback).", ["model"], registry=r)
        self.worker_inflight = Gauge("tollgate_worker_inflight", "Gateway requests in flight on the worker.",
                                     ["pool", "worker"], registry=r)
        self.worker_waiting = Gauge("tollgate_worker_waiting", "vLLM waiting queue (scraped).",
                                    ["pool", "worker"], registry=r)
        self.worker_kv = Gauge("tollgate_worker_kv_cache_usage", "vLLM KV-cache usage 0-1 (scraped).",
                               ["pool", "worker"], registry=r)
        self.policy_reloads = Counter("tollgate_policy_reloads", "Policy reload attempts.", ["result"], registry=r)
        self.policy_ok = Gauge("tollgate_policy_last_reload_ok", "0 while the last policy offered was rejected.",
                               registry=r)
        self.policy_ok.set(1)
        self.cache_requests = Counter("tollgate_cache_requests", "Cache outcomes: hit-exact, hit-semantic, miss, "
                                      "bypass.", ["tier", "result"], registry=r)
        self.cache_bypass = Counter("tollgate_cache_bypass", "Requests the cache did not look up, by reason.",
                                    ["reason"], registry=r)
        self.cache_rejections = Counter("tollgate_cache_verifier_rejections", "Semantic candidates the near-miss "
                                        "verifier refused, by reason.", ["reason"], registry=r)
        self.cache_lookup = Histogram("tollgate_cache_lookup_seconds", "Cache lookup time on the request's path "
                                      "(the exact layer).", ["result"], buckets=FAST_BUCKETS, registry=r)
        self.cache_semantic = Histogram("tollgate_cache_semantic_seconds", "Semantic lookup time, beside the "
                                        "request (a hit is served only if it comes before the answer).", ["result"],
                                        buckets=FAST_BUCKETS, registry=r)
        self.cache_audits = Counter("tollgate_cache_audits", "Semantic hits asked again of the engine, by verdict "
                                    "(agreed, wrong, raised: the scope's threshold rose, off: its semantic layer "
                                    "turned off).", ["tenant", "model", "verdict"], registry=r)
        self.cache_audit_upper = Gauge("tollgate_cache_audit_false_hit_upper", "Upper confidence bound of a scope's "
                                       "audited false-hit rate.", ["tenant", "model", "scope"], registry=r)
        self.cache_audit_threshold = Gauge("tollgate_cache_audit_threshold", "The cosine a semantic hit needs in "
                                           "an audited scope (1: its semantic layer is off).",
                                           ["tenant", "model", "scope"], registry=r)
        self.cache_tokens_saved = Counter("tollgate_cache_tokens_saved", "Tokens answered from the cache.",
                                          ["tier", "direction"], registry=r)
        self.cache_store_up = Gauge("tollgate_cache_store_up", "0 while the cache store is unreachable.", registry=r)
        self.cache_store_errors = Counter("tollgate_cache_store_errors", "Cache writes deferred: store down.",
                                          registry=r)
        self.cache_entries = Gauge("tollgate_cache_entries", "Entries in this replica's semantic index.", registry=r)
        self.cache_bytes = Gauge("tollgate_cache_bytes", "Bytes this process holds for the response cache (entries "
                                 "in process, or this replica's index and buffered writes).", registry=r)
        self.cache_not_stored = Counter("tollgate_cache_not_stored", "Answers the cache did not keep, by reason.",
                                        ["reason"], registry=r)
        self.queue_depth = Gauge("tollgate_queue_depth", "Requests waiting in the gateway's queues.",
                                 ["pool", "class"], registry=r)
        self.scale_desired = Gauge("tollgate_scale_desired_workers", "Workers each pool should have by the "
                                   "scaling rules (KV, queue, TTFT p95 vs SLO; scale-in quiet period; cooldown).",
                                   ["pool"], registry=r)
        self.gateway_processes = Gauge("tollgate_gateway_processes", "Gateway processes splitting each worker's "
                                       "limit, this one included (replicas sharing Redis, or --workers N).",
                                       registry=r)
        self.cost = Counter("tollgate_cost_usd", "Spend recorded, by tenant and model.", ["tenant", "model"],
                            registry=r)
        self.budget_remaining = Gauge("tollgate_budget_remaining_usd", "Budget left this period (after "
                                      "reservations), per tenant with a budget.", ["tenant"], registry=r)
        self.anomalies = Counter("tollgate_cost_anomalies", "Cost anomalies, by kind and the action taken.",
                                 ["kind", "action"], registry=r)
        self.shed = Counter("tollgate_shed", "Requests answered 429 by the scheduler, by class and reason.",
                            ["class", "reason"], registry=r)
        self.loop_lag = Histogram("tollgate_event_loop_lag_seconds", "How late the event loop ran a 100 ms timer: "
                                  "a gateway starved of CPU or blocked by a long call shows here first.",
                                  buckets=FAST_BUCKETS, registry=r)
        self._children: dict[tuple[str, str], tuple[object, ...]] = {}
        self._labelled: dict[tuple[object, tuple[str, ...]], Any] = {}

    def stage_children(self, tier: str, model: str) -> tuple:  # type: ignore[type-arg]
        """Label lookups cost microseconds each; cache the children per (tier, model)."""
        key = (tier, model)
        children = self._children.get(key)
        if children is None:
            children = (self.queue_wait.labels(tier, model), self.upstream_connect.labels(tier, model),
                        self.ttft.labels(tier, model), self.tpot.labels(tier, model),
                        self.duration.labels(tier, model))
            self._children[key] = children
        return children

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: a lookup costs microseconds and a request makes several."""
        key = (metric, labels)
        found = self._labelled.get(key)
        if found is None:
            found = self._labelled[key] = metric.labels(*labels)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
