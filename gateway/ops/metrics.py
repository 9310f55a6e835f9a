"""The gateway's Prometheus metrics: stage histograms by tier and model, counters, worker gauges.

The families every request writes (its stages, its status, tokens and cost) are ``LeanHistogram`` and
``LeanCounter``: plain numbers a request adds to with one Python call, written into the exposition at each
scrape; prometheus_client's own types cost four calls an ``inc`` and five an ``observe`` (guarded by
tests/inprocess/test_call_budget.py). The rest, written per scrape or per event, stay prometheus_client's.
"""

from __future__ import annotations

import abc
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: past every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # a bound is inclusive (le)
        self.sum += value


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Lean(abc.ABC):
    """A labelled family kept as plain numbers (``labels(...)`` as prometheus_client's), and its own collector.
    Written and read on the event loop; a scrape copies the children before it writes them out."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.children: dict[tuple[str, ...], Any] = {}
        registry.register(self)

    def labels(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self._child()
        return child

    @abc.abstractmethod
    def _child(self) -> Any:
        """A new child: the numbers one label set keeps."""

    def describe(self) -> list[Metric]:
        return [self._family()]

    @abc.abstractmethod
    def collect(self) -> Iterator[Metric]:
        """The family with every child's numbers (a prometheus_client Collector)."""

    @abc.abstractmethod
    def _family(self) -> Any:
        """The family, empty."""


class LeanHistogram(_Lean):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        super().__init__(name, documentation, labelnames, registry)

    def _child(self) -> _HistogramChild:
        return _HistogramChild(self.bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in list(self.children.items()):
            running, buckets = 0, []
            for bound, count in zip((*self.bounds, float("inf")), list(child.counts), strict=True):
                running += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            family.add_metric(values, buckets, child.sum)
        yield family


class LeanCounter(_Lean):
    def _child(self) -> _CounterChild:
        return _CounterChild()

    def add(self, values: tuple[str, ...], amount: float = 1.0) -> None:
        """``labels(*values).inc(amount)`` in one call."""
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = _CounterChild()
        child.value += amount

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in list(self.children.items()):
            family.add_metric(values, child.value)
        yield family

# Fine at the low end: the gateway's own share is measured in microseconds to milliseconds.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        tm = ["tier", "model"]
        self.ttft = LeanHistogram("tollgate_ttft_seconds", "Arrival to first upstream byte.", tm,
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = LeanHistogram("tollgate_tpot_seconds", "Mean time per output token after the first.", tm,
                                  buckets=TPOT_BUCKETS, registry=r)
        self.queue_wait = LeanHistogram("tollgate_queue_wait_seconds", "Time held by the scheduler before "
                                        "dispatch.", tm, buckets=FAST_BUCKETS, registry=r)
        self.upstream_connect = LeanHistogram("tollgate_upstream_connect_seconds", "Dispatch until the request "
                                              "head is written to the worker (pool wait + TCP connect).", tm,
                                              buckets=FAST_BUCKETS, registry=r)
        self.duration = LeanHistogram("tollgate_request_duration_seconds", "Arrival to last byte sent.", tm,
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.requests = LeanCounter("tollgate_requests", "Requests answered.", [*tm, "status"], registry=r)
        self.errors = LeanCounter("tollgate_errors", "Requests that ended in an error.", [*tm, "kind"], registry=r)
        self.tokens = LeanCounter("tollgate_tokens", "Tokens by direction.", [*tm, "direction"], registry=r)
        self.upstream_connections = Counter("tollgate_upstream_connections_opened", "Connections opened to "
                                            "workers (few per request means keep-alive reuse).", ["pool"],
                                            registry=r)
        self.retries = Counter("tollgate_upstream_retries", "Requests retried on another worker.", ["pool"],
                               registry=r)
        window = ("over 15 whole minutes ending two to three minutes ago, fleet-wide (the same on every replica: "
                  "aggregate with max; a request longer than a minute counts its last one to two minutes)")
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
        self.cost = LeanCounter("tollgate_cost_usd", "Spend recorded, by tenant and model.", ["tenant", "model"],
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
        self._stages: dict[tuple[str, str], tuple[_HistogramChild, ...]] = {}
        self._labelled: dict[tuple[object, tuple[str, ...]], Any] = {}

    def observe_stages(self, tier: str, model: str, stages: Sequence[float | None]) -> None:
        """A request's stages (queue wait, upstream connect, TTFT, TPOT, total; None: not reached) into their
        histograms, in one call."""
        children = self._stages.get((tier, model))
        if children is None:
            children = self._stages[(tier, model)] = tuple(
                family.labels(tier, model) for family in (self.queue_wait, self.upstream_connect, self.ttft,
                                                          self.tpot, self.duration))
        for child, value in zip(children, stages, strict=True):
            if value is not None:
                child.counts[bisect_left(child.bounds, value)] += 1
                child.sum += value

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: a lookup costs microseconds and a request makes several."""
        key = (metric, labels)
        found = self._labelled.get(key)
        if found is None:
            found = self._labelled[key] = metric.labels(*labels)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
