"""OpenTelemetry traces in-process: the W3C header, sampling, the span tree and the configuration
(tests/process/test_tracing_otlp.py exports them from a gateway process to real receivers)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway import pipeline
from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.ops import otlp, tracing
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy, TracingPolicy
from gateway.sink import BufferSink
from tests.fakes import FakeWorker, chat, completion_json, json_of, running_gateway

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
    (f"00-{'0' * 32}-{'0' * 16}-01".encode(), None),
    (f"00-{CALLER_TRACE.upper()}-{CALLER_SPAN}-01".encode(), None),  # W3C ids are lower-case hex
    (f"00-{CALLER_TRACE[:-1]}g-{CALLER_SPAN}-01".encode(), None),
    (f"00-{CALLER_TRACE}0-{CALLER_SPAN}-01".encode(), None),  # a digit too many
    (f"00-{CALLER_TRACE}-{CALLER_SPAN[:-1]}-01".encode(), None),  # one too few
    (f"00-{CALLER_TRACE}-{CALLER_SPAN}-1".encode(), None),
    (f"00-{CALLER_TRACE}-{CALLER_SPAN}-01\n".encode(), None),
    (f"01-{CALLER_TRACE}-{CALLER_SPAN}-01x".encode(), None),  # a later version's extra fields follow a dash
    (f"0-{CALLER_TRACE}-{CALLER_SPAN}-01".encode(), None),
    (f" 00-{CALLER_TRACE}-{CALLER_SPAN}-01 ".encode(), (int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), True)),
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


def test_our_sampler_decides_unless_it_is_parent_based() -> None:
    """always_off is off whatever the caller asked; always_on and traceidratio decide for a caller's trace too;
    a parentbased_ sampler (and the policy's ratio) follows the caller's flag."""
    caller_sampled = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode()
    caller_unsampled = f"00-{CALLER_TRACE}-{CALLER_SPAN}-00".encode()

    def configured(sampler: str, arg: str = "") -> tracing.Tracer:
        environ = {"OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": arg} if sampler else {}
        ratio, follow = tracing.sampler(TracingPolicy(sample_ratio=0.5), environ)
        return tracing.Tracer(Recorder().exporter(), ratio, follow)

    off = configured("always_off").start(caller_sampled)
    assert off is not None and not off.sampled, "our always_off wins over the caller's sampled flag"
    assert off.traceparent() == f"00-{CALLER_TRACE}-{CALLER_SPAN}-00", "the worker is told not to record either"
    assert configured("always_off").start(None) is None
    followed = configured("parentbased_always_off").start(caller_sampled)
    assert followed is not None and followed.sampled
    on = configured("always_on").start(caller_unsampled)
    assert on is not None and on.sampled and on.trace_id == int(CALLER_TRACE, 16)
    assert not configured("parentbased_always_on").start(caller_unsampled).sampled  # type: ignore[union-attr]
    assert configured("").start(caller_sampled).sampled, "the policy's ratio is parent based"  # type: ignore[union-attr]
    low, high = f"00-{'0' * 16}{'0' * 15}1-{CALLER_SPAN}-00".encode(), f"00-{'f' * 32}-{CALLER_SPAN}-01".encode()
    ratio = configured("traceidratio", "0.5")
    assert ratio.start(low).sampled and not ratio.start(high).sampled, "by the trace id, as OpenTelemetry's"  # type: ignore[union-attr]


def test_a_callers_tracestate_goes_on_beside_its_traceparent() -> None:
    traced = tracer(1.0)
    header = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode()
    trace = traced.start(header, b"congo=t61rcWkgMzE, rojo=00f067aa0ba902b7")
    assert trace is not None
    assert trace.headers() == [(b"traceparent", trace.traceparent().encode()),
                               (b"tracestate", b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")]
    unsampled = traced.start(header.replace(b"-01", b"-00"), b"congo=t61rcWkgMzE")
    assert unsampled is not None and dict(unsampled.headers())[b"tracestate"] == b"congo=t61rcWkgMzE"
    fresh = traced.start(header.upper(), b"congo=t61rcWkgMzE")
    assert fresh is not None and fresh.trace_id != int(CALLER_TRACE, 16), "a malformed traceparent: a new trace"
    assert fresh.headers() == [(b"traceparent", fresh.traceparent().encode())], "and its tracestate is dropped"


def members(count: int, value: bytes = b"v") -> bytes:
    return b",".join(b"k%d=%s" % (i, value) for i in range(count))


@pytest.mark.parametrize("header,forwarded", [
    (b"a=1,b=2", b"a=1,b=2"),
    (b"a=1,,BAD=2, c=3 ,d", b"a=1,c=3"),  # invalid members are dropped, the valid ones kept in order
    (b"a=1,a=2", b"a=1"),  # a key once
    (b"tenant@vendor=x,k=\xff", b"tenant@vendor=x"),
    (b"k=v\r\nx: y", None),
    (members(40), members(32)),  # at most 32 members
    (members(5, b"v" * 200), members(2, b"v" * 200)),  # at most 512 bytes, in whole members
    (b"x" * 100_000, None), (b"", None), (None, None),
])
def test_a_tracestate_is_passed_on_within_w3c_bounds(header: bytes | None, forwarded: bytes | None) -> None:
    assert tracing.parse_tracestate(header) == forwarded
    assert forwarded is None or len(forwarded) <= tracing.STATE_BYTES


def test_a_sampled_request_makes_a_server_span_with_its_stages_as_children() -> None:
    """Encoded by hand (gateway.ops.otlp), decoded here by OpenTelemetry's protobuf classes: the wire format
    is the collector's."""
    recorder = Recorder()
    traced = tracer(1.0, recorder)
    policy = Policy.model_validate({"tenants": {"acme": {"tier": "standard"}}, "models": {"m": {"pool": "p"}},
                                    "pools": {"p": {"workers": ["http://w1"]}}})
    snapshot = PolicySnapshot.build(policy, "test")
    ctx = RequestContext("req-1", snapshot, CHAT)
    ctx.tenant, ctx.model, ctx.status, ctx.worker = snapshot.tenants["acme"], "m", 200, "http://w1"
    ctx.prompt_tokens, ctx.completion_tokens, ctx.max_tokens_applied = 12, 30, "default; value=512"
    ctx.cache, ctx.cost_usd = "miss", 0.25
    t = ctx.timings
    t.cache_at, t.cache, t.queue_wait, t.dispatch_at, t.total = 0.001, 0.002, 0.010, 0.015, 0.250
    ctx.trace = traced.start(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode())
    traced.finish(ctx)
    failed = RequestContext("req-2", snapshot, CHAT)
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


class HungCollector:
    """A collector that accepts connections and reads, and never answers."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.reading = threading.Event()  # an export is in flight
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(connection)
            if connection.recv(1):
                self.reading.set()

    def close(self) -> None:
        self.listener.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture
def hung() -> Iterator[HungCollector]:
    collector = HungCollector()
    yield collector
    collector.close()


def finishes_within(call: Any, seconds: float) -> bool:
    """Run ``call`` in a thread; did it return within ``seconds``?"""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def span(i: int = 0) -> otlp.SpanRecord:
    return otlp.SpanRecord(f"s{i}", i + 1, None, otlp.INTERNAL, 1, 2, {})


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_shutdown_takes_at_most_the_export_timeout_when_the_collector_hangs(hung: HungCollector,
                                                                            protocol: str) -> None:
    """50 batches queued for a collector that never answers: one export timeout, not 50."""
    traced = tracing.from_config(TracingPolicy(endpoint=f"http://127.0.0.1:{hung.port}", protocol=protocol), {
        "OTEL_EXPORTER_OTLP_TIMEOUT": "300", "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1", "OTEL_BSP_SCHEDULE_DELAY": "10"})
    assert traced is not None and traced.exporter.timeout_s == 0.3
    for i in range(50):
        traced.exporter.add(i + 1, [span(i)])
    assert hung.reading.wait(10), "the first export reached the collector"
    assert finishes_within(traced.shutdown, 0.3 + 5.0), "shutdown returned within its timeout (and a margin)"


def test_shutdown_leaves_a_hung_send_and_sends_nothing_after_it(hung: HungCollector) -> None:
    send = otlp.http_sender(f"http://127.0.0.1:{hung.port}/v1/traces", {}, 60.0, False)
    exporter = otlp.Exporter(send, b"", b"", delay_s=0.01, max_batch=1, timeout_s=0.2)
    for i in range(3):
        exporter.add(i + 1, [span(i)])
    assert hung.reading.wait(10)
    assert finishes_within(exporter.shutdown, 0.2 + 5.0), "not the send's 60 s"
    hung.close()  # the send in flight fails now; what was still queued is dropped, not sent
    exporter._thread.join(10)
    assert not exporter._thread.is_alive() and exporter.dropped == 2 and len(hung.connections) == 1


def test_the_queue_count_agrees_with_the_queue_under_threads() -> None:
    """Spans added from several threads while the export thread takes them: each one sent or counted dropped."""
    recorder = Recorder()
    exporter = otlp.Exporter(recorder.sent.append, b"", b"", delay_s=0.001, max_queue=256, max_batch=7)
    adders = [threading.Thread(target=lambda: [exporter.add(1, [span(i)]) for i in range(5_000)])
              for _ in range(4)]
    for adder in adders:
        adder.start()
    for adder in adders:
        adder.join()
    exporter.shutdown(timeout=30)
    sent = sum(len(scope.spans) for request in recorder.requests() for resource in request.resource_spans
               for scope in resource.scope_spans)
    assert sent + exporter.dropped == 20_000 and exporter._spans == 0 and not exporter._pending


def test_the_worker_gets_the_callers_tracestate_beside_the_traceparent() -> None:
    """Through the pipeline to a worker: the Trace Context the edge parsed is what the worker's request carries."""
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as w, running_gateway([w.url]) as gw:
            ctx = RequestContext("traced", gw.store.current, CHAT)
            ctx.tenant = gw.store.current.tenants["demo"]
            ctx.trace = tracer(1.0).start(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01".encode(), b"congo=t61rcWkgMzE")
            sink = BufferSink()
            async with pipeline.Lifecycle(gw, ctx, sink):
                await pipeline.run(gw, ctx, orjson.dumps(chat()), sink)
            assert sink.status == 200
            head = w.heads[-1]
            assert head["tracestate"] == "congo=t61rcWkgMzE"
            assert head["traceparent"].startswith(f"00-{CALLER_TRACE}-") and head["traceparent"].endswith("-01")
    asyncio.run(main())
