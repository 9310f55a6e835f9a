"""Per-request state: built at the edge, filled in by each pipeline step, closed by accounting.Finish.

Each field has one writer (named beside it), so a reader knows where a value came from. No I/O here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.endpoints.base import Endpoint
from gateway.policy.loader import PolicySnapshot, TenantView

if TYPE_CHECKING:
    from gateway.policy.schema import Tier

Headers = list[tuple[bytes, bytes]]
# x-tollgate-cache's value: an outcome, then parameters whose values are tokens (a reason) or a similarity.
CACHE_HEADER = re.compile(r"(hit-exact|hit-semantic|miss|bypass|off)(; [a-z]+=[A-Za-z0-9_.:-]+)*")
_TOKEN = re.compile(r"[A-Za-z0-9_.:-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")


class Charged(Protocol):
    """What the rate limiter charged a request (gateway.ratelimit.Charge, a layer above this leaf): the answer
    carries its headroom as headers."""

    def headers(self) -> Headers: ...
STAGES = ("queue_wait", "cache", "upstream_connect", "ttft", "tpot", "total")


@dataclass(slots=True)
class Trace:
    """One request's place in an OpenTelemetry trace (gateway.ops.tracing): ids fixed when it arrives, so the
    worker's header names the upstream span before that span is built."""

    trace_id: int
    parent_id: int | None  # the caller's span, if it sent a traceparent
    server_id: int
    upstream_id: int
    sampled: bool
    wall_start_ns: int = 0  # the request's arrival on the wall clock (sampled requests only)
    state: bytes | None = None  # the caller's tracestate, passed on beside the traceparent

    def traceparent(self) -> str:
        """The header for the worker: the upstream span as parent (or, unsampled, the caller's own span)."""
        return f"00-{self.trace_id:032x}-{self.upstream_id:016x}-{'01' if self.sampled else '00'}"

    def headers(self) -> Headers:
        """The W3C Trace Context headers for the worker: traceparent, and the caller's tracestate if any."""
        out = [(b"traceparent", self.traceparent().encode("ascii"))]
        if self.state:
            out.append((b"tracestate", self.state))
        return out


@dataclass(slots=True)
class Timings:
    """Stage durations in seconds; None where a stage did not happen.

    queue_wait: the scheduler's hold before dispatch; cache: the cache lookup; upstream_connect: dispatch until
    the request head is written to the worker (pool wait + TCP connect, if any); ttft: arrival until the first
    byte of the answer (the first upstream body byte, or the cached answer); tpot: mean gap between output
    tokens after the first; total: arrival until the last byte was sent.
    """

    start: float = field(default_factory=time.perf_counter)
    queue_wait: float | None = None  # scheduling.controller.admit
    cache: float | None = None  # cache.decision.decide
    cache_at: float | None = None  # cache.decision.decide: when the lookup began (seconds after start)
    dispatch_at: float | None = None  # upstream.dispatch: when the first try began (after the queue wait)
    upstream_connect: float | None = None  # upstream.dispatch
    ttft: float | None = None  # first_byte()
    tpot: float | None = None  # pipeline (from the relay's token timing)
    total: float | None = None  # accounting (Finish)

    def first_byte(self) -> float:
        """Stamp TTFT: called by whatever produces the answer's first byte (the relay or a cache hit). Returns it."""
        self.ttft = ttft = time.perf_counter() - self.start
        return ttft

    def server_timing(self, whole: bool = False) -> bytes:
        """The stages so far as Server-Timing entries. ``whole``: the answer is in hand and goes out with these
        headers, so ``total`` is known now (arrival until the headers; the body follows in the same write). It is
        read, never stored: ``total`` is stamped once, by accounting, when the last byte has gone."""
        parts = []
        for name in STAGES:
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name};dur={value * 1000:.3f}")
        if whole and self.total is None:
            parts.append(f"total;dur={(time.perf_counter() - self.start) * 1000:.3f}")
        return ", ".join(parts).encode()


@dataclass(slots=True)
class RequestContext:
    request_id: str
    snapshot: PolicySnapshot
    endpoint: Endpoint  # http.app (the route), or batches.runner (the batch's url): one of gateway.endpoints
    timings: Timings = field(default_factory=Timings)
    tenant: TenantView | None = None  # http.app (auth), or batches.runner for a line
    key_id: str | None = None  # http.app (auth): a short id of the key's hash, never the key
    model: str | None = None  # openai_api.prepare: only a model the policy routes
    stream: bool = False  # openai_api.prepare
    batch: str | None = None  # batches.runner: the batch this request is a line of
    probe: bool = False  # http.app (auth): an operator's probe (tollgate diagnose), out of the cost-anomaly rule
    tags: str | None = None  # openai_api.prepare: cost centres from metadata, user and X-Tollgate-Tags (gateway.tags)
    # pipeline.run: the tenant's tier, or a lower class the request asked for; then what spend.admit returns
    # (batch, for the cost-anomaly action "downgrade"), before the scheduler reads it
    service_class: Tier = "standard"  # pipeline (as above)
    max_tokens_applied: str | None = None  # openai_api: prepare, or clamp_output (the anomaly clamp)
    cache: str | None = None  # cache.decision.decide: hit-exact | hit-semantic | miss | bypass (| off)
    cache_similarity: float | None = None  # cache.decision.decide
    cache_reason: str | None = None  # cache.decision.decide: why a bypass (or an off, or a miss's language)
    cache_nearest: float | None = None  # cache.decision: a miss's best cosine in its (the tenant's own) scope
    worker: str | None = None  # upstream.dispatch
    route: str | None = None  # upstream.dispatch: why that worker (prefix 12/25 | session | hash | load)
    attempts: int = 0  # upstream.dispatch
    # admitted past this process's part of the limit (premium that waited half its deadline): it may wait in the
    # engine, so its latency says nothing of the engine's capacity
    past_limit: bool = False  # scheduling.controller
    prompt_tokens: int | None = None  # pipeline.run
    completion_tokens: int | None = None  # pipeline.run
    cached_tokens: int | None = None  # pipeline.run: prompt tokens the worker's prefix cache served
    usage_estimated: bool = False  # pipeline.run: the worker took it but sent no usage; tokens are estimates
    reservation: object | None = None  # spend.service (Spend.admit): the budget reservation to settle
    charge: Charged | None = None  # pipeline.run: what the rate limiter charged, to settle (and its headroom headers)
    cost_usd: float = 0.0  # accounting (Finish)
    price_version: str | None = None  # accounting (Finish)
    error: str | None = None  # pipeline.fail: the outcome's code
    trace: Trace | None = None  # http.app: the request's place in a trace (ops.tracing), if traced
    answered_by: str | None = None  # pipeline.run: the model that answered, when a fallback did
    status: int = 0  # pipeline.Lifecycle: the status the client got (499 if it left, or got none)

    @property
    def served_model(self) -> str | None:
        """The model that answered: the one asked for, or the fallback that took the request."""
        return self.answered_by or self.model

    @property
    def label(self) -> str:
        """The class this request ran in, as metrics label it ("none" before authentication)."""
        return self.service_class if self.tenant else "none"

    def server_timing(self, whole: bool = False) -> bytes:
        """The stages so far (``total`` too for a ``whole`` answer: Timings.server_timing), and the routing choice
        (as a Server-Timing description, no duration)."""
        stages = self.timings.server_timing(whole)
        return stages + b', route;desc="' + self.route.encode() + b'"' if self.route else stages

    def cache_header(self) -> bytes:
        """``x-tollgate-cache``: ``<outcome>[; key=value]*`` (CACHE_HEADER is its grammar). The outcome is
        hit-exact, hit-semantic, miss, bypass or off (the audit turned the scope's semantic layer off); ``reason``
        says why a bypass or an off (or a miss's language the semantic layer does not serve), ``nearest`` a miss's
        best similarity among its tenant's entries. A hit is bare: its similarity has a header of its own."""
        outcome, reason, nearest = self.cache or "", self.cache_reason, self.cache_nearest
        if (reason is None and nearest is None and outcome != "off") or outcome.startswith("hit"):
            return outcome.encode()
        if outcome == "off" or (reason is not None and reason.startswith("audit")):
            outcome, reason = "off", reason or "audit"
        value = outcome
        if reason is not None:
            value += "; reason=" + (reason if _TOKEN.fullmatch(reason) else _UNSAFE.sub("_", reason) or "unknown")
        if nearest is not None and outcome == "miss":
            value += f"; nearest={nearest:.4f}"
        return value.encode()

    def response_headers(self) -> Headers:
        """The gateway's own headers on every answer, from what the steps so far decided."""
        headers = [(b"x-request-id", self.request_id.encode())]
        if self.max_tokens_applied is not None:
            headers.append((b"x-tollgate-max-tokens", self.max_tokens_applied.encode()))
        if self.cache is not None:  # bare (most answers): no call; else with its parameters
            bare = self.cache_reason is None and self.cache_nearest is None and self.cache != "off"
            headers.append((b"x-tollgate-cache", self.cache.encode() if bare else self.cache_header()))
        if self.cache_similarity is not None:
            headers.append((b"x-tollgate-cache-similarity", f"{self.cache_similarity:.4f}".encode()))
        if self.answered_by is not None:
            headers.append((b"x-tollgate-model", self.answered_by.encode()))
        if self.charge is not None:
            headers += self.charge.headers()
        return headers
