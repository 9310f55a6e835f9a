"""OpenTelemetry traces from a gateway process: a caller's trace continued through the gateway into the worker,
exported over OTLP to a real receiver on loopback (HTTP/protobuf and gRPC) that decodes the spans."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.conftest import DEMO_KEY, policy_dict, wait_for
from tests.inprocess.ops.test_tracing import CALLER_SPAN, CALLER_TRACE
from workers.process import free_port


class Receiver:
    """An OTLP receiver on loopback (HTTP/protobuf on /v1/traces, or gRPC) keeping the decoded spans."""

    def __init__(self, protocol: str) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.spans: list[Any] = []
        self.port = free_port()
        receiver = self

        def keep(request: Any) -> None:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    receiver.spans.extend((resource.resource, span) for span in scope.spans)

        if protocol == "grpc":
            import grpc

            class Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
                def Export(self, request: Any, context: Any) -> Any:
                    keep(request)
                    return trace_service_pb2.ExportTraceServiceResponse()

            self.server = grpc.server(futures.ThreadPoolExecutor(2))
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
            self.server.add_insecure_port(f"127.0.0.1:{self.port}")
            self.server.start()
            self.stop: Callable[[], None] = lambda: self.server.stop(0)
        else:
            class Handler(BaseHTTPRequestHandler):
                def do_POST(self) -> None:
                    body = self.rfile.read(int(self.headers["content-length"]))
                    if self.path == "/v1/traces":
                        request = trace_service_pb2.ExportTraceServiceRequest()
                        request.ParseFromString(body)
                        keep(request)
                    self.send_response(200 if self.path == "/v1/traces" else 404)
                    self.send_header("content-type", "application/x-protobuf")
                    self.send_header("content-length", "0")
                    self.end_headers()

                def log_message(self, *args: Any) -> None:
                    pass

            http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
            threading.Thread(target=http.serve_forever, daemon=True).start()
            self.stop = http.shutdown


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[str, Receiver]]:
    found = Receiver(request.param)
    yield request.param, found
    found.stop()


def test_a_callers_trace_goes_through_the_gateway_into_the_worker(
        receiver: tuple[str, Receiver], start_sim: Callable[..., Any], start_gateway: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    protocol, otlp = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{otlp.port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "tollgate-under-test")
    sim = start_sim()
    gw = start_gateway(policy_dict([sim.url]))
    reply = httpx.post(gw.url + "/v1/chat/completions", timeout=30, json={
        "model": "sim-llama-8b", "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 5,
        "stream": True}, headers={"authorization": f"Bearer {DEMO_KEY}",
                                  "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert reply.status_code == 200
    assert wait_for(lambda: len(otlp.spans) >= 3, timeout=20), otlp.spans
    spans = {span.name: (resource, span) for resource, span in otlp.spans}
    assert {"chat sim-llama-8b", "queue wait", "chat upstream"} <= set(spans), sorted(spans)
    resource, server = spans["chat sim-llama-8b"]
    assert any(a.key == "service.name" and a.value.string_value == "tollgate-under-test"
               for a in resource.attributes)
    assert server.trace_id.hex() == CALLER_TRACE and server.parent_span_id.hex() == CALLER_SPAN
    for name in ("queue wait", "chat upstream"):
        assert spans[name][1].trace_id == server.trace_id and spans[name][1].parent_span_id == server.span_id
    attributes = {a.key: a.value for a in server.attributes}
    assert attributes["gen_ai.request.model"].string_value == "sim-llama-8b"
    assert attributes["gen_ai.response.model"].string_value == "sim-llama-8b"
    assert attributes["gen_ai.usage.output_tokens"].int_value == 5
    assert attributes["gen_ai.usage.input_tokens"].int_value > 0
    assert attributes["gen_ai.request.max_tokens"].int_value == 5
    assert attributes["tollgate.tenant"].string_value == "demo"
    assert attributes["tollgate.worker"].string_value == sim.url
    seen = httpx.get(sim.url + "/sim/traceparents", timeout=5).json()
    upstream = spans["chat upstream"][1]
    assert seen[-1] == f"00-{CALLER_TRACE}-{upstream.span_id.hex()}-01", "the worker continues the same trace"

    malformed = f"00-{CALLER_TRACE.upper()}-{CALLER_SPAN}-01"
    assert httpx.post(gw.url + "/v1/chat/completions", timeout=30, json={
        "model": "sim-llama-8b", "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 5},
        headers={"authorization": f"Bearer {DEMO_KEY}", "traceparent": malformed}).status_code == 200
    fresh = httpx.get(sim.url + "/sim/traceparents", timeout=5).json()[-1]
    assert fresh.endswith("-01") and CALLER_TRACE not in fresh.lower(), "a malformed traceparent starts a new trace"


def test_always_off_wins_over_a_callers_sampled_flag(start_sim: Callable[..., Any],
                                                     start_gateway: Callable[..., Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    otlp = Receiver("http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{otlp.port}")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    sim = start_sim()
    gw = start_gateway(policy_dict([sim.url]))
    try:
        reply = httpx.post(gw.url + "/v1/chat/completions", timeout=30, json={
            "model": "sim-llama-8b", "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 5},
            headers={"authorization": f"Bearer {DEMO_KEY}", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        assert reply.status_code == 200
        seen = httpx.get(sim.url + "/sim/traceparents", timeout=5).json()
        assert seen[-1] == f"00-{CALLER_TRACE}-{CALLER_SPAN}-00", "the caller's trace goes on, unsampled"
        gw.stop()  # a clean stop exports whatever was queued
        assert gw.process.returncode in (0, -signal.SIGTERM)
        assert otlp.spans == [], "nothing was recorded"
    finally:
        otlp.stop()
