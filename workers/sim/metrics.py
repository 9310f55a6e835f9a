"""Prometheus metrics with vLLM's names, so the gateway's scraper and dashboards see a real-looking worker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from workers.sim.engine import Engine, Sequence

# vLLM's own bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class SimMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        r = self.registry
        self._running = Gauge("vllm:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self._waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r)
        self._kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", labels, registry=r)
        self._prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r)
        self._generation = Counter("vllm:generation_tokens", "Generation tokens processed.", labels, registry=r)
        self._preemptions = Counter("vllm:num_preemptions", "Cumulative preemptions.", labels, registry=r)
        self._prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                       labels, registry=r)
        self._prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels,
                                    registry=r)
        self._success = Counter("vllm:request_success", "Finished requests.", [*labels, "finished_reason"],
                                registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r).labels(model_name, "0")
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", labels,
                             buckets=ITL_BUCKETS, registry=r).labels(model_name, "0")
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
                             buckets=E2E_BUCKETS, registry=r).labels(model_name, "0")
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time spent waiting in the queue.", labels,
                               buckets=E2E_BUCKETS, registry=r).labels(model_name, "0")
        self._held_max = Gauge("tollgate_sim_requests_held_max", "Most requests the engine held at once "
                               "(running + waiting) since it started.", registry=r)
        self.connections = Counter("tollgate_sim_connections_accepted", "TCP connections accepted.", registry=r)
        self.aborted = Counter("tollgate_sim_requests_aborted", "Requests aborted by a client disconnect.",
                               registry=r)
        self.injected_errors = Counter("tollgate_sim_injected_errors", "Errors injected on purpose.", ["status"],
                                       registry=r)
        self._model = model_name
        for metric in (self._running, self._waiting, self._kv, self._prompt, self._generation, self._preemptions,
                       self._prefix_queries, self._prefix_hits):
            metric.labels(model_name, "0")  # exported from the start, as vLLM does
        for reason in ("stop", "length", "abort", "error"):
            self._success.labels(model_name, "0", reason)
        self._seen = {"prompt": 0, "generation": 0, "preemptions": 0, "aborted": 0, "prefix_queries": 0,
                      "prefix_hits": 0}

    def on_finish(self, seq: Sequence) -> None:
        """Called by the engine when a sequence ends. Like vLLM 0.32, a client abort is not a 'success' of any
        reason; it is counted in tollgate_sim_requests_aborted_total only."""
        if seq.finish_reason == "abort":
            return
        self._success.labels(self._model, "0", seq.finish_reason).inc()
        end = seq.last_token_at or seq.arrival
        self.e2e.observe(end - seq.arrival)
        if seq.scheduled_at is not None:
            self.queue.observe(seq.scheduled_at - seq.arrival)
        if seq.first_token_at is not None:
            self.ttft.observe(seq.first_token_at - seq.arrival)

    def render(self, engine: Engine) -> bytes:
        """Bring gauges and engine counters up to date, then render the text format."""
        m = (self._model, "0")
        stats = engine.stats
        self._running.labels(*m).set(len(engine.running))
        self._waiting.labels(*m).set(engine.num_waiting)
        self._kv.labels(*m).set(engine.kv_usage)
        self._held_max.set(stats.held_max)
        for name, counter, value in (
            ("prompt", self._prompt, stats.prompt_tokens),
            ("generation", self._generation, stats.generation_tokens),
            ("preemptions", self._preemptions, stats.preemptions),
            ("prefix_queries", self._prefix_queries, stats.prefix_queries),
            ("prefix_hits", self._prefix_hits, stats.prefix_hits),
            ("aborted", None, stats.aborted),
        ):
            delta = value - self._seen[name]
            if delta:
                (counter.labels(*m) if counter else self.aborted).inc(delta)
                self._seen[name] = value
        return generate_latest(self.registry)
