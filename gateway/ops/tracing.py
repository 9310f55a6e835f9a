"""OpenTelemetry traces of requests, after the GenAI semantic conventions: one server span per request, with child
spans for the queue wait, the cache lookup and the upstream exchange; a caller's ``traceparent`` continued, and
the upstream span's sent on to the worker (vLLM started with ``--otlp-traces-endpoint`` continues it).

Off unless configured (the standard ``OTEL_*`` variables, or the policy's ``tracing`` section): the request path
then pays one ``is None`` test. On, a request is sampled when it arrives (by the caller's sampled flag when it
sent a ``traceparent``, else at the configured ratio); an unsampled one costs one random draw, and one with a
caller's ``traceparent`` forwards it unchanged. A sampled request's spans are built once, when it ends, from the
stage timings every request keeps anyway, and handed to the SDK's batch processor, which exports them from its
own thread: no span object lives while the request runs, and the SDK is imported only when tracing is on.
"""

from __future__ import annotations

import functools
import os
import random
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.context import RequestContext, Trace
from gateway.policy.schema import TracingPolicy

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

_TRACEPARENT = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$")
OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
_NS = 1_000_000_000


def parse_traceparent(value: bytes | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C traceparent header; None when absent or not valid."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or match[1] == b"ff" or (match[1] == b"00" and len(value.strip()) != 55):
        return None
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(match[4], 16) & 1)


class Tracer:
    """Samples requests and exports the spans of the sampled ones (see the module docstring)."""

    def __init__(self, exporter: SpanExporter, ratio: float, service_name: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.ratio = ratio
        self.processor = BatchSpanProcessor(exporter)
        self.resource = Resource.create({"service.name": service_name})
        self.scope = InstrumentationScope("tollgate")
        self._random = random.Random()

    def start(self, traceparent: bytes | None) -> Trace | None:
        """The trace of an arriving request; None when it is neither sampled nor part of a caller's trace."""
        parent = parse_traceparent(traceparent)
        bits = self._random.getrandbits
        if parent is not None:
            trace_id, parent_id, sampled = parent
            if not sampled:  # the caller decided: forward its header as it came
                return Trace(trace_id, parent_id, 0, parent_id, False)
        elif self.ratio > 0 and self._random.random() < self.ratio:
            trace_id, parent_id = bits(128) or 1, None
        else:
            return None
        return Trace(trace_id, parent_id, bits(64) or 1, bits(64) or 1, True, time.time_ns())

    def finish(self, ctx: RequestContext) -> None:
        """Build the ended request's spans and queue them for export (sampled requests only)."""
        trace = ctx.trace
        if trace is None or not trace.sampled:
            return
        for span in spans(ctx, trace, self.resource, self.scope):
            self.processor.on_end(span)

    def shutdown(self) -> None:
        """Export what is queued (blocking: call it off the event loop)."""
        self.processor.shutdown()


@functools.cache
def _sdk() -> tuple[Any, ...]:
    """The SDK's span types, imported on the first sampled request (tracing off imports nothing)."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    return ReadableSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags


def spans(ctx: RequestContext, trace: Trace, resource: Any, scope: Any) -> list[Any]:
    """The request's spans: the server span, and a child per stage that happened."""
    ReadableSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags = _sdk()
    t = ctx.timings
    flags = TraceFlags(TraceFlags.SAMPLED)

    def at(offset: float) -> int:
        return trace.wall_start_ns + int(offset * _NS)

    def context(span_id: int) -> SpanContext:
        return SpanContext(trace.trace_id, span_id, is_remote=False, trace_flags=flags)

    server = context(trace.server_id)
    parent = SpanContext(trace.trace_id, trace.parent_id, is_remote=True, trace_flags=flags) \
        if trace.parent_id is not None else None
    operation = OPERATIONS.get(ctx.endpoint, ctx.endpoint)
    failed = ctx.status >= 400 or ctx.status == 0
    status = Status(StatusCode.ERROR, ctx.error) if failed else Status(StatusCode.UNSET)
    out = [ReadableSpan(f"{operation} {ctx.model}" if ctx.model else operation, server, parent, resource,
                        server_attributes(ctx, operation), kind=SpanKind.SERVER, status=status,
                        start_time=at(0.0), end_time=at(t.total or 0.0), instrumentation_scope=scope)]
    if t.cache is not None and t.cache_at is not None:
        out.append(ReadableSpan("cache lookup", context(random.getrandbits(64) or 1), server, resource,
                                {"tollgate.cache": ctx.cache or ""}, kind=SpanKind.INTERNAL,
                                start_time=at(t.cache_at), end_time=at(t.cache_at + t.cache),
                                instrumentation_scope=scope))
    if t.dispatch_at is not None:
        if t.queue_wait is not None:
            out.append(ReadableSpan("queue wait", context(random.getrandbits(64) or 1), server, resource,
                                    {"tollgate.class": ctx.service_class}, kind=SpanKind.INTERNAL,
                                    start_time=at(t.dispatch_at - t.queue_wait), end_time=at(t.dispatch_at),
                                    instrumentation_scope=scope))
        upstream = {"server.address": ctx.worker or "", "tollgate.attempts": ctx.attempts,
                    "tollgate.route": ctx.route or "", "gen_ai.operation.name": operation}
        out.append(ReadableSpan(f"{operation} upstream", context(trace.upstream_id), server, resource, upstream,
                                kind=SpanKind.CLIENT, status=status, start_time=at(t.dispatch_at),
                                end_time=at(t.total or t.dispatch_at), instrumentation_scope=scope))
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
    from_env = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not from_env and not policy.endpoint:
        return None
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or policy.protocol).strip().lower()
    endpoint = None if from_env else policy.endpoint  # the exporters read the variables themselves
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter: SpanExporter = GrpcExporter(endpoint=endpoint, insecure=True if endpoint and
                                              endpoint.startswith("http://") else None)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        exporter = HttpExporter(endpoint=endpoint.rstrip("/") + "/v1/traces" if endpoint else None)
    return Tracer(exporter, sample_ratio(policy, environ), environ.get("OTEL_SERVICE_NAME") or policy.service_name)


def sample_ratio(policy: TracingPolicy, environ: Mapping[str, str]) -> float:
    """OTEL_TRACES_SAMPLER (always_on, always_off, traceidratio, and their parentbased_ forms: a caller's flag
    always decides here) with OTEL_TRACES_SAMPLER_ARG, else the policy's sample_ratio."""
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower().removeprefix("parentbased_")
    if sampler == "always_on":
        return 1.0
    if sampler == "always_off":
        return 0.0
    if sampler == "traceidratio":
        try:
            return min(1.0, max(0.0, float(environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))))
        except ValueError:
            return 1.0
    return policy.sample_ratio
