"""OpenTelemetry traces of requests, after the GenAI semantic conventions: one server span per request, with child
spans for the queue wait, the cache lookup and the upstream exchange; a caller's ``traceparent`` continued, and
the upstream span's sent on to the worker (vLLM started with ``--otlp-traces-endpoint`` continues it), the
caller's ``tracestate`` beside it in ``Trace.headers`` (W3C Trace Context). A ``traceparent`` that is not valid
W3C (wrong length, upper-case or non-hex digits, an all-zero id, version ff) starts a new trace, and its
``tracestate`` is dropped.

Off unless configured (the standard ``OTEL_*`` variables, or the policy's ``tracing`` section): the request path
then pays one ``is None`` test. On, a request is sampled when it arrives, by the configured sampler: a
``parentbased_*`` one (and the policy's ratio) follows the caller's sampled flag when it sent a ``traceparent``,
while ``always_on``, ``always_off`` and ``traceidratio`` decide whatever the caller asked. An unsampled request
costs one random draw, and one in a caller's trace forwards the caller's ids marked unsampled. A sampled
request's spans are built once, when it ends, from the stage timings every request keeps anyway, as plain
records handed to gateway.ops.otlp, which encodes and exports them from its own thread: no span object lives
while the request runs.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.context import RequestContext, Trace
from gateway.ops import otlp
from gateway.ops.otlp import SpanRecord
from gateway.policy.schema import TracingPolicy

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x20-\x7e]*)?")
_STATE_MEMBER = re.compile(rb"(?:[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13}|[a-z][a-z0-9_*/-]{0,255})"
                           rb"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
STATE_BYTES, STATE_MEMBERS = 512, 32  # what W3C asks a vendor to pass on at least, and at most
_STATE_SCAN = 4 * STATE_MEMBERS  # list members looked at: a header of junk costs no more than this
_NS = 1_000_000_000
_LOW_64 = (1 << 64) - 1


def parse_traceparent(value: bytes | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C traceparent header; None when absent or not valid, so that
    the request starts a trace of its own."""
    if not value:
        return None
    value = value.strip(b" \t")
    match = _TRACEPARENT.fullmatch(value)
    if match is None or match[1] == b"ff" or (match[1] == b"00" and match[5] is not None):
        return None  # version ff is invalid; version 00 has exactly four fields, later versions may add more
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(match[4], 16) & 1)


def parse_tracestate(value: bytes | None) -> bytes | None:
    """The caller's tracestate as it goes on to the worker: its valid list members, in order, each key once, at
    most STATE_MEMBERS of them and STATE_BYTES in all (W3C lets a vendor drop members from the end)."""
    if not value:
        return None
    kept: list[bytes] = []
    keys: set[bytes] = set()
    size = -1
    for member in value.split(b",", _STATE_SCAN)[:_STATE_SCAN]:
        member = member.strip(b" \t")
        if not _STATE_MEMBER.fullmatch(member):
            continue
        key = member.partition(b"=")[0]
        if key in keys:
            continue
        if size + 1 + len(member) > STATE_BYTES or len(kept) == STATE_MEMBERS:
            break
        keys.add(key)
        kept.append(member)
        size += 1 + len(member)
    return b",".join(kept) or None


class Tracer:
    """Samples requests and hands the spans of the sampled ones to the exporter (see the module docstring)."""

    def __init__(self, exporter: otlp.Exporter, ratio: float, follow_parent: bool = True) -> None:
        self.ratio = ratio
        self.follow_parent = follow_parent  # a parentbased_ sampler: the caller's sampled flag decides
        self.exporter = exporter
        self._random = random.Random()

    def start(self, traceparent: bytes | None, tracestate: bytes | None = None) -> Trace | None:
        """The trace of an arriving request; None when it is neither sampled nor part of a caller's trace."""
        parent = parse_traceparent(traceparent)
        bits = self._random.getrandbits
        state = None
        if parent is not None:
            trace_id, parent_id, sampled = parent
            state = parse_tracestate(tracestate)
            if not self.follow_parent:  # as OpenTelemetry's TraceIdRatioBased: the same answer for the same trace
                sampled = self.ratio >= 1 or (trace_id & _LOW_64) < self.ratio * (1 << 64)
            if not sampled:  # the caller's ids go on, marked unsampled, so the worker does not record either
                return Trace(trace_id, parent_id, 0, parent_id, False, state=state)
        elif self.ratio > 0 and self._random.random() < self.ratio:
            trace_id, parent_id = bits(128) or 1, None
        else:
            return None
        return Trace(trace_id, parent_id, bits(64) or 1, bits(64) or 1, True, time.time_ns(), state)

    def finish(self, ctx: RequestContext) -> None:
        """Queue the ended request's spans for export (sampled requests only)."""
        trace = ctx.trace
        if trace is None or not trace.sampled:
            return
        self.exporter.add(trace.trace_id, spans(ctx, trace, self._random.getrandbits))

    def shutdown(self) -> None:
        """Export what is queued, within the export timeout (blocking: call it off the event loop)."""
        self.exporter.shutdown()


def spans(ctx: RequestContext, trace: Trace, bits: Callable[[int], int] = random.getrandbits) -> list[SpanRecord]:
    """The request's spans: the server span, and a child per stage that happened."""
    t = ctx.timings
    start = trace.wall_start_ns

    def at(offset: float) -> int:
        return start + int(offset * _NS)

    operation = ctx.endpoint.operation
    error = (ctx.error or f"HTTP {ctx.status}") if ctx.status >= 400 or ctx.status == 0 else None
    server = trace.server_id
    out = [SpanRecord(f"{operation} {ctx.model}" if ctx.model else operation, server, trace.parent_id, otlp.SERVER,
                      start, at(t.total or 0.0), server_attributes(ctx, operation), error)]
    if t.cache is not None and t.cache_at is not None:
        out.append(SpanRecord("cache lookup", bits(64) or 1, server, otlp.INTERNAL, at(t.cache_at),
                              at(t.cache_at + t.cache), {"tollgate.cache": ctx.cache or ""}))
    if t.dispatch_at is not None:
        if t.queue_wait is not None:
            out.append(SpanRecord("queue wait", bits(64) or 1, server, otlp.INTERNAL, at(t.dispatch_at - t.queue_wait),
                                  at(t.dispatch_at), {"tollgate.class": ctx.service_class}))
        upstream = {"server.address": ctx.worker or "", "tollgate.attempts": ctx.attempts,
                    "tollgate.route": ctx.route or "", "gen_ai.operation.name": operation}
        out.append(SpanRecord(f"{operation} upstream", trace.upstream_id, server, otlp.CLIENT, at(t.dispatch_at),
                              at(t.total or t.dispatch_at), upstream, error))
    return out


def server_attributes(ctx: RequestContext, operation: str) -> dict[str, Any]:
    """The GenAI semantic conventions' request and usage attributes, and the gateway's own."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation, "http.request.method": "POST", "http.response.status_code": ctx.status,
        "tollgate.request_id": ctx.request_id, "tollgate.class": ctx.label, "tollgate.cost_usd": ctx.cost_usd,
    }
    optional = {
        "gen_ai.request.model": ctx.model, "gen_ai.response.model": ctx.served_model,
        "gen_ai.usage.input_tokens": ctx.prompt_tokens, "gen_ai.usage.output_tokens": ctx.completion_tokens,
        "gen_ai.request.max_tokens": _max_tokens(ctx.max_tokens_applied),
        "tollgate.tenant": ctx.tenant.name if ctx.tenant else None, "tollgate.worker": ctx.worker,
        "tollgate.cache": ctx.cache, "error.type": ctx.error,
    }
    attributes.update((k, v) for k, v in optional.items() if v is not None)
    return attributes


def _max_tokens(applied: str | None) -> int | None:
    """The max_tokens value the request ran with, from its header's text ("clamped; requested=9000; value=4096")."""
    if not applied or "value=" not in applied:
        return None
    value = applied.rsplit("value=", 1)[1]
    return int(value) if value.isdigit() else None


def from_config(policy: TracingPolicy, environ: Mapping[str, str] = os.environ) -> Tracer | None:
    """The tracer the standard OTEL_* variables (first) and the policy ask for; None when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return None
    traces_endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or policy.endpoint
    if not traces_endpoint and not endpoint:
        return None

    def setting(name: str, default: str = "") -> str:
        return (environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or environ.get(f"OTEL_EXPORTER_OTLP_{name}")
                or default).strip()

    protocol = setting("PROTOCOL", policy.protocol).lower()
    headers = otlp.parse_headers(setting("HEADERS"))
    timeout_s = _number(setting("TIMEOUT"), 10_000) / 1000  # milliseconds, as the specification says
    gzipped = setting("COMPRESSION").lower() == "gzip"
    certificate = setting("CERTIFICATE") or None
    if protocol == "grpc":
        send = otlp.grpc_sender(traces_endpoint or endpoint or "", headers, timeout_s, gzipped,
                                setting("INSECURE").lower() == "true", certificate)
    else:  # http/protobuf; a signal-specific endpoint is used as it is, a general one gets /v1/traces
        url = traces_endpoint or (endpoint or "").rstrip("/") + "/v1/traces"
        send = otlp.http_sender(url, headers, timeout_s, gzipped, certificate)
    service = environ.get("OTEL_SERVICE_NAME") or policy.service_name
    exporter = otlp.Exporter(send, otlp.resource_of(service, environ), otlp.scope_of(),
                             delay_s=_number(environ.get("OTEL_BSP_SCHEDULE_DELAY", ""), 5000) / 1000,
                             max_queue=int(_number(environ.get("OTEL_BSP_MAX_QUEUE_SIZE", ""), 2048)),
                             max_batch=int(_number(environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", ""), 512)),
                             timeout_s=timeout_s)
    return Tracer(exporter, *sampler(policy, environ))


def _number(text: str, default: float) -> float:
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value > 0 else default


def sampler(policy: TracingPolicy, environ: Mapping[str, str]) -> tuple[float, bool]:
    """(ratio, follow the caller's sampled flag) from OTEL_TRACES_SAMPLER (always_on, always_off, traceidratio,
    and their parentbased_ forms) with OTEL_TRACES_SAMPLER_ARG, else the policy's sample_ratio (parent based)."""
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    kind = name.removeprefix("parentbased_")
    follow = kind != name
    if kind == "always_on":
        return 1.0, follow
    if kind == "always_off":
        return 0.0, follow
    if kind == "traceidratio":
        try:
            return min(1.0, max(0.0, float(environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")))), follow
        except ValueError:
            return 1.0, follow
    return policy.sample_ratio, True
