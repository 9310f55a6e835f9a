"""OpenTelemetry traces in-process: the W3C header, sampling, the span tree and the configuration
(tests/test_tracing_otlp.py exports them from a gateway process to real receivers)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.context import RequestContext
from gateway.ops import tracing
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy, TracingPolicy

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize("header,parsed", [
    (f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode(), (int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), True)),
    (f"00-{CALLER_TRACE}-{CALLER_SPAN}-00".encode(), (int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), False)),
    (f"01-{CALLER_TRACE}-{CALLER_SPAN}-01-extra".encode(), (int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), True)),
    (f"00-{CALLER_TRACE}-{CALLER_SPAN}-01-extra".encode(), None),  # version 00 has exactly four fields
    (f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01".encode(), None),
    (f"00-{'0' * 32}-{CALLER_SPAN}-01".encode(), None),
    (f"00-{CALLER_TRACE}-{'0' * 16}-01".encode(), None),
    (b"00-xyz-abc-01", None), (b"", None), (None, None),
])
def test_a_traceparent_is_read_as_w3c_says(header: bytes | None, parsed: tuple[int, int, bool] | None) -> None:
    assert tracing.parse_traceparent(header) == parsed


class Recorder:
    """A span exporter that keeps what it is given (the SDK's interface)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def test_sampling_follows_the_caller_then_the_ratio() -> None:
    never = tracing.Tracer(Recorder(), 0.0, "t")  # type: ignore[arg-type]
    always = tracing.Tracer(Recorder(), 1.0, "t")  # type: ignore[arg-type]
    assert never.start(None) is None, "no caller trace and a ratio of 0: nothing, not even a header"
    sampled = never.start(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode())
    assert sampled is not None and sampled.sampled, "the caller's sampled flag decides"
    assert sampled.trace_id == int(CALLER_TRACE, 16) and sampled.parent_id == int(CALLER_SPAN, 16)
    assert sampled.traceparent().startswith(f"00-{CALLER_TRACE}-") and not sampled.traceparent().endswith(
        f"{CALLER_SPAN}-01"), "the worker's parent is the gateway's upstream span"
    unsampled = always.start(f"00-{CALLER_TRACE}-{CALLER_SPAN}-00".encode())
    assert unsampled is not None and not unsampled.sampled
    assert unsampled.traceparent() == f"00-{CALLER_TRACE}-{CALLER_SPAN}-00", "forwarded as it came"
    fresh = always.start(None)
    assert fresh is not None and fresh.sampled and fresh.parent_id is None
    tenth = tracing.Tracer(Recorder(), 0.1, "t")  # type: ignore[arg-type]
    share = sum(tenth.start(None) is not None for _ in range(20_000)) / 20_000
    assert 0.08 < share < 0.12


def test_a_sampled_request_makes_a_server_span_with_its_stages_as_children() -> None:
    recorder = Recorder()
    tracer = tracing.Tracer(recorder, 1.0, "tollgate-test")  # type: ignore[arg-type]
    policy = Policy.model_validate({"tenants": {"acme": {"tier": "standard"}}, "models": {"m": {"pool": "p"}},
                                    "pools": {"p": {"workers": ["http://w1"]}}})
    snapshot = PolicySnapshot.build(policy, "test")
    ctx = RequestContext("req-1", snapshot, "chat")
    ctx.tenant, ctx.model, ctx.status, ctx.worker = snapshot.tenants["acme"], "m", 200, "http://w1"
    ctx.prompt_tokens, ctx.completion_tokens, ctx.max_tokens_applied = 12, 30, "default; value=512"
    ctx.cache = "miss"
    t = ctx.timings
    t.cache_at, t.cache, t.queue_wait, t.dispatch_at, t.total = 0.001, 0.002, 0.010, 0.015, 0.250
    ctx.trace = tracer.start(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode())
    tracer.finish(ctx)
    tracer.shutdown()
    by_name = {s.name: s for s in recorder.spans}
    assert set(by_name) == {"chat m", "cache lookup", "queue wait", "chat upstream"}
    server = by_name["chat m"]
    assert server.parent.span_id == int(CALLER_SPAN, 16) and server.context.trace_id == int(CALLER_TRACE, 16)
    assert all(s.parent.span_id == server.context.span_id for n, s in by_name.items() if n != "chat m")
    assert by_name["chat upstream"].context.span_id == ctx.trace.upstream_id  # type: ignore[union-attr]
    attributes = server.attributes
    assert (attributes["gen_ai.operation.name"], attributes["gen_ai.request.model"]) == ("chat", "m")
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (12, 30)
    assert attributes["gen_ai.request.max_tokens"] == 512 and attributes["tollgate.tenant"] == "acme"
    queue = by_name["queue wait"]
    assert (queue.end_time - queue.start_time) == pytest.approx(10_000_000, abs=2)
    assert queue.end_time == by_name["chat upstream"].start_time <= server.end_time


def test_tracing_is_off_unless_configured_and_reads_the_standard_variables() -> None:
    assert tracing.from_config(TracingPolicy(), {}) is None, "off by default"
    on = tracing.from_config(TracingPolicy(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                               "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                                               "OTEL_TRACES_SAMPLER_ARG": "0.1"})
    assert on is not None and on.ratio == 0.1
    on.shutdown()
    grpc = tracing.from_config(TracingPolicy(endpoint="http://127.0.0.1:4317", protocol="grpc"), {})
    assert grpc is not None and "grpc" in type(grpc.processor._batch_processor._exporter).__module__
    grpc.shutdown()
    assert tracing.from_config(TracingPolicy(endpoint="http://x:4318"), {"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.from_config(TracingPolicy(endpoint="http://x:4318"), {"OTEL_TRACES_EXPORTER": "none"}) is None
