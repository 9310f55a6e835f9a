"""What traces cost a request, the exporter's thread included (python -m loadtest run tracing [--ratio 0.1]).

``Tracer.start`` and ``finish`` for many requests (``--requests 50000``) with stage timings like a real one's, the
exporter's thread encoding and sending them over OTLP/HTTP to a receiver in another process.

The CPU is this process's (``time.process_time``: the loop's part and the exporter thread's), per request; the
receiver's is not counted. The whole-request benchmarks (ab, the overhead harness) cannot resolve tens
of microseconds, so the path is timed here on its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.ops import tracing
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy, TracingPolicy
from workers.process import free_port, wait_ready

RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    do_GET = lambda self: (self.send_response(200), self.send_header("content-length", "0"), self.end_headers())
    def log_message(self, *args): pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def requests(n: int, snapshot: PolicySnapshot) -> list[RequestContext]:
    out = []
    for i in range(n):
        ctx = RequestContext(f"req-{i}", snapshot, CHAT)
        ctx.tenant, ctx.model = snapshot.tenants["acme"], "m"
        ctx.status, ctx.worker, ctx.attempts, ctx.route = 200, "http://10.0.0.1:8000", 1, "load"
        ctx.prompt_tokens, ctx.completion_tokens, ctx.max_tokens_applied = 412, 64, "default; value=512"
        ctx.cost_usd, ctx.service_class = 0.000123, "standard"
        t = ctx.timings
        t.queue_wait, t.dispatch_at, t.upstream_connect, t.ttft, t.total = 0.0004, 0.0009, 0.0002, 0.05, 0.4
        out.append(ctx)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--ratio", type=float, default=0.1)
    args = parser.parse_args()
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "receiver.log"
    with log.open("wb") as sink:
        receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)], stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_ready(receiver, f"http://127.0.0.1:{port}/", 10, log, "the OTLP receiver")
        policy = Policy.model_validate({"tenants": {"acme": {"tier": "standard"}}, "models": {"m": {"pool": "p"}},
                                        "pools": {"p": {"workers": ["http://10.0.0.1:8000"]}}})
        snapshot = PolicySnapshot.build(policy, "bench")
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_BSP_SCHEDULE_DELAY": "1000",
                   "OTEL_BSP_MAX_QUEUE_SIZE": "1000000",  # nothing dropped: every span costed
                   "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(args.ratio)}
        tracer = tracing.from_config(TracingPolicy(), environ)
        assert tracer is not None
        contexts = requests(args.requests, snapshot)
        cpu, wall = time.process_time(), time.perf_counter()
        sampled = 0
        for ctx in contexts:
            ctx.trace = tracer.start(None)
            sampled += ctx.trace is not None
            tracer.finish(ctx)
        loop_cpu = time.process_time() - cpu
        tracer.shutdown()  # the exporter's thread sends what is left
        total = time.process_time() - cpu
        print(f"{args.requests} requests, {sampled} sampled at {args.ratio:g}, exporter dropped "
              f"{tracer.exporter.dropped}: {total / args.requests * 1e6:.1f} us CPU per request "
              f"({loop_cpu / args.requests * 1e6:.1f} us on the request path, the rest encoding and sending; "
              f"{(time.perf_counter() - wall):.1f} s)")
    finally:
        receiver.kill()


if __name__ == "__main__":
    main()
