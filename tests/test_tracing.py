"""OpenTelemetry traces in-process: the W3C header, sampling, the span tree and the configuration
(tests/test_tracing_otlp.py exports them from a gateway process to real receivers)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.context import RequestContext
from gateway.ops import otlp, tracing
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
    """What the exporter sends, kept and decoded with OpenTelemetry's own protobuf classes."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def exporter(self) -> otlp.Exporter:
        return otlp.Exporter(self.sent.append, otlp.resource_of("tollgate-test", {"OTEL_RESOURCE_ATTRIBUTES":
                                                                                 "deployment.environment=test"}),
                             otlp.scope_of(), delay_s=60)

    def requests(self) -> list[Any]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        return [ExportTraceServiceRequest.FromString(body) for body in self.sent]


def tracer(ratio: float, recorder: Recorder | None = None) -> tracing.Tracer:
    return tracing.Tracer((recorder or Recorder()).exporter(), ratio)


def test_sampling_follows_the_caller_then_the_ratio() -> None:
    never, always = tracer(0.0), tracer(1.0)
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
    tenth = tracer(0.1)
    share = sum(tenth.start(None) is not None for _ in range(20_000)) / 20_000
    assert 0.08 < share < 0.12


def test_a_sampled_request_makes_a_server_span_with_its_stages_as_children() -> None:
    """Encoded by hand (gateway.ops.otlp), decoded here by OpenTelemetry's protobuf classes: the wire format
    is the collector's."""
    recorder = Recorder()
    traced = tracer(1.0, recorder)
    policy = Policy.model_validate({"tenants": {"acme": {"tier": "standard"}}, "models": {"m": {"pool": "p"}},
                                    "pools": {"p": {"workers": ["http://w1"]}}})
    snapshot = PolicySnapshot.build(policy, "test")
    ctx = RequestContext("req-1", snapshot, "chat")
    ctx.tenant, ctx.model, ctx.status, ctx.worker = snapshot.tenants["acme"], "m", 200, "http://w1"
    ctx.prompt_tokens, ctx.completion_tokens, ctx.max_tokens_applied = 12, 30, "default; value=512"
    ctx.cache, ctx.cost_usd = "miss", 0.25
    t = ctx.timings
    t.cache_at, t.cache, t.queue_wait, t.dispatch_at, t.total = 0.001, 0.002, 0.010, 0.015, 0.250
    ctx.trace = traced.start(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode())
    traced.finish(ctx)
    failed = RequestContext("req-2", snapshot, "chat")
    failed.status, failed.error = 429, "rate_limited"
    failed.trace = traced.start(None)
    traced.finish(failed)
    traced.shutdown()
    [request] = recorder.requests()
    [resource_spans] = request.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "tollgate-test" and resource["deployment.environment"] == "test"
    [scope_spans] = resource_spans.scope_spans
    assert scope_spans.scope.name == "tollgate"
    by_name = {s.name: s for s in scope_spans.spans}
    assert set(by_name) == {"chat m", "cache lookup", "queue wait", "chat upstream", "chat"}
    server = by_name["chat m"]
    assert server.parent_span_id.hex() == CALLER_SPAN and server.trace_id.hex() == CALLER_TRACE
    assert server.kind == server.SPAN_KIND_SERVER and by_name["chat upstream"].kind == server.SPAN_KIND_CLIENT
    assert all(s.parent_span_id == server.span_id and s.trace_id == server.trace_id
               for n, s in by_name.items() if n not in ("chat m", "chat"))
    assert int.from_bytes(by_name["chat upstream"].span_id, "big") == ctx.trace.upstream_id  # type: ignore[union-attr]
    attributes = {a.key: a.value for a in server.attributes}
    assert (attributes["gen_ai.operation.name"].string_value, attributes["gen_ai.request.model"].string_value) == (
        "chat", "m")
    assert (attributes["gen_ai.usage.input_tokens"].int_value, attributes["gen_ai.usage.output_tokens"].int_value) \
        == (12, 30)
    assert attributes["gen_ai.request.max_tokens"].int_value == 512
    assert attributes["tollgate.tenant"].string_value == "acme" and attributes["tollgate.cost_usd"].double_value == 0.25
    queue = by_name["queue wait"]
    assert (queue.end_time_unix_nano - queue.start_time_unix_nano) == pytest.approx(10_000_000, abs=2)
    assert queue.end_time_unix_nano == by_name["chat upstream"].start_time_unix_nano <= server.end_time_unix_nano
    assert server.status.code == server.status.STATUS_CODE_UNSET
    refused = by_name["chat"]
    assert not refused.parent_span_id and len(refused.trace_id) == 16
    assert (refused.status.code, refused.status.message) == (refused.status.STATUS_CODE_ERROR, "rate_limited")


def test_tracing_is_off_unless_configured_and_reads_the_standard_variables() -> None:
    assert tracing.from_config(TracingPolicy(), {}) is None, "off by default"
    on = tracing.from_config(TracingPolicy(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                               "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                                               "OTEL_TRACES_SAMPLER_ARG": "0.1"})
    assert on is not None and on.ratio == 0.1
    on.shutdown()
    assert on.exporter.delay_s == 5.0, "OTEL_BSP_SCHEDULE_DELAY's default"
    grpc = tracing.from_config(TracingPolicy(endpoint="http://127.0.0.1:4317", protocol="grpc"), {})
    assert grpc is not None and grpc.exporter.send.__qualname__.startswith("grpc_sender")
    grpc.shutdown()
    assert tracing.from_config(TracingPolicy(endpoint="http://x:4318"), {"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.from_config(TracingPolicy(endpoint="http://x:4318"), {"OTEL_TRACES_EXPORTER": "none"}) is None
