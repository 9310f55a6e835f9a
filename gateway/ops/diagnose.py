"""`tollgate diagnose URL --key KEY [--direct WORKER_URL]`: the sources' latency checklist as a command.

It sends a few real requests and reads the gateway's and the worker's own metrics, then names the stage where
the time goes and the fix the sources give for it:

- TTFT through the gateway against direct to a worker (the proxy's own cost);
- buffering: tokens that should trickle in arrive together (a proxy holding the stream back);
- upstream keep-alive reuse, from the gateway's count of connections opened per request;
- short prompts behind long ones: short TTFT alone against with long prompts in flight (prefill crowding);
- the slowest stage of the gateway's requests (queue wait, connect, engine) from its stage histograms;
- the worker's engine: its own queue time and idle gaps (running 0 while requests wait);
- the gateway's event-loop lag (CPU starvation coalesces tokens and adds TTFT).

It is a client of the gateway (HTTP only), so it works against any deployment the caller can reach. Its
requests measure the path, not the cache: each asks ``Cache-Control: no-cache, no-store`` and carries a prompt
of its own (a fixed prompt at temperature 0 is answered from the gateway's cache from the second probe on, and
a long prompt sent twice is a prefix-cache hit in the engine). They carry ``X-Tollgate-Tags: source=diagnose``,
so reports show them apart (``group_by=tag``), and, given the metrics or admin token, ``X-Tollgate-Probe`` with
it, so the gateway keeps them out of the tenant's cost-anomaly rule. What it cannot measure it says.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

SHORT = "Name three colours."
LONG = "Summarise the following notes. " + "The quarterly report covers revenue, costs and hiring plans. " * 120
_count = itertools.count()


def fresh(prompt: str) -> str:
    """The prompt, made its own: a marker at its start (so not even a prefix of it is cached in the engine)."""
    return f"[probe {os.getpid():x}-{time.time_ns():x}-{next(_count)}] {prompt}"


def probe_headers(key: str | None, probe_token: str | None) -> dict[str, str]:
    headers = {"Cache-Control": "no-cache, no-store", "X-Tollgate-Tags": "source=diagnose"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if probe_token:
        headers["X-Tollgate-Probe"] = probe_token
    return headers


@dataclass
class Probe:
    ttft: float | None = None
    total: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # seconds after the request, per content event
    status: int = 0


class Reading(Enum):
    """What a check found: fine, a problem (with its fix), or nothing it could measure (and why)."""

    OK = "ok"
    PROBLEM = "PROBLEM"
    NOT_MEASURED = "not measured"


def judged(problem: bool) -> Reading:
    return Reading.PROBLEM if problem else Reading.OK


# (factor, seconds): a time is flagged when it is past this factor of its reference and by more than these
# seconds (below them, a sixteenth of the 800 ms TTFT objective: a busy host's noise, which no user notices)
PROXY_BOUND = (1.5, 0.05)
CROWDING_BOUND = (2.0, 0.05)


def differs(seen: float, reference: float, factor: float, floor_s: float) -> bool:
    return seen > factor * reference and seen - reference > floor_s


def bound_text(factor: float, floor_s: float) -> str:
    return f"flagged past {factor:g}x and +{floor_s * 1000:.0f} ms"


@dataclass
class Finding:
    check: str
    reading: Reading
    detail: str
    fix: str = ""

    @property
    def problem(self) -> bool:
        return self.reading is Reading.PROBLEM


@dataclass
class Report:
    findings: list[Finding]
    figures: dict[str, float] = field(default_factory=dict)  # what was measured, in ms (for --json and benchmarks)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]

    def text(self) -> str:
        lines = []
        unmeasured = [f.check for f in self.findings if f.reading is Reading.NOT_MEASURED]
        if self.problems:
            lines.append(f"Where the time goes: {self.problems[0].check}. {self.problems[0].fix}")
        elif unmeasured:
            lines.append("Where the time goes: nothing stands out in what was measured; not measured: "
                         f"{', '.join(unmeasured)} (see below).")
        else:
            lines.append("Where the time goes: nothing stands out; every check passed.")
        lines.append("")
        for f in self.findings:
            lines.append(f"[{f.reading.value}] {f.check}: {f.detail}")
            if f.problem and f.fix:
                lines.append(f"        fix: {f.fix}")
        return "\n".join(lines)


async def stream(client: httpx.AsyncClient, base: str, key: str | None, model: str, prompt: str,
                 max_tokens: int, probe_token: str | None = None) -> Probe:
    """One streamed chat request, its prompt made its own; when each content event arrived."""
    probe = Probe()
    started = time.perf_counter()
    headers = probe_headers(key, probe_token)
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": fresh(prompt)}]}
    async with client.stream("POST", base.rstrip("/") + "/v1/chat/completions", json=body, headers=headers) as r:
        probe.status = r.status_code
        async for line in r.aiter_lines():
            if line.startswith("data:") and '"content":"' in line.replace(" ", "") and \
                    '"content":""' not in line.replace(" ", ""):
                now = time.perf_counter() - started
                probe.arrivals.append(now)
                if probe.ttft is None:
                    probe.ttft = now
    probe.total = time.perf_counter() - started
    return probe


def metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lab, v in m.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


async def fetch_metrics(client: httpx.AsyncClient, base: str, token: str | None) -> dict[str, Any] | None:
    try:
        r = await client.get(base.rstrip("/") + "/metrics",
                             headers={"Authorization": f"Bearer {token}"} if token else {})
    except httpx.HTTPError:
        return None
    return metrics(r.text) if r.status_code == 200 else None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def run(url: str, key: str | None, model: str, direct: str | None = None, metrics_token: str | None = None,
              samples: int = 6, tokens: int = 48) -> Report:
    findings: list[Finding] = []
    async with httpx.AsyncClient(timeout=120) as client:
        before = await fetch_metrics(client, url, metrics_token)
        worker_before = await fetch_metrics(client, direct, None) if direct else None

        via = [await stream(client, url, key, model, SHORT, tokens, metrics_token) for _ in range(samples)]
        bad = [p.status for p in via if p.status != 200]
        if bad:
            return Report([Finding("requests fail", Reading.PROBLEM, f"HTTP {bad[0]} from {url}",
                                   "check the key, the model name and /readyz")])
        via_ttft = median([p.ttft for p in via if p.ttft is not None])
        figures = {"total_p50_ms": round(median([p.total for p in via]) * 1000, 3)}
        if not math.isnan(via_ttft):
            figures["ttft_p50_ms"] = round(via_ttft * 1000, 3)
        sequential = await fetch_metrics(client, url, metrics_token)  # keep-alive is judged on one-at-a-time requests

        # 1. the proxy's own cost
        if not direct:
            findings.append(Finding("proxy overhead", Reading.NOT_MEASURED, "give --direct WORKER_URL to compare "
                                    "TTFT through the gateway with TTFT straight to a worker"))
        if direct:
            straight = [await stream(client, direct, None, model, SHORT, tokens) for _ in range(samples)]
            direct_ttft = median([p.ttft for p in straight if p.ttft is not None])
            extra = via_ttft - direct_ttft
            if math.isnan(extra):  # answers that decoded to no text on one side: no first token to time
                findings.append(Finding("proxy overhead", Reading.NOT_MEASURED, "the answers carried no text to time"))
            else:
                figures["direct_ttft_p50_ms"] = round(direct_ttft * 1000, 3)
                findings.append(Finding(
                    "proxy overhead", judged(differs(via_ttft, direct_ttft, *PROXY_BOUND)),
                    f"TTFT p50 {via_ttft * 1000:.0f} ms through the gateway vs {direct_ttft * 1000:.0f} ms direct "
                    f"(+{extra * 1000:.0f} ms; {bound_text(*PROXY_BOUND)})",
                    "keep the gateway on its own cores, keep-alive to the workers, no extra hops; see the stages "
                    "below"))

        # 2. buffering: tokens arriving together, the first one only near the end
        held = [p for p in via if p.ttft is not None and len(p.arrivals) >= 8 and p.total > 0.05
                and p.ttft / p.total > 0.8]
        spread = [(p.arrivals[-1] - p.arrivals[0]) / max(p.total, 1e-9) for p in via if len(p.arrivals) > 1]
        first = [p.ttft / p.total for p in via if p.ttft is not None and p.total > 0]
        if not spread or not first:
            # a tiny random-weights model's answers can decode to one text event or none: nothing to spread
            most = max((len(p.arrivals) for p in via), default=0)
            findings.append(Finding("buffering", Reading.NOT_MEASURED, f"each answer carried at most {most} "
                                    "text event(s), too few to see whether they were held back"))
        else:
            findings.append(Finding(
                "buffering", judged(len(held) > len(via) / 2),
                f"first token at {median(first) * 100:.0f}% of the stream's time; "
                f"tokens spread over {median(spread) * 100:.0f}% of it",
                "turn proxy buffering off on every hop (nginx: proxy_buffering off; X-Accel-Buffering: no), "
                "no gzip on text/event-stream"))

        # 3. short prompts behind long ones
        alone = [await stream(client, url, key, model, SHORT, 8, metrics_token) for _ in range(3)]
        longs = [asyncio.create_task(stream(client, url, key, model, LONG, 16, metrics_token)) for _ in range(4)]
        await asyncio.sleep(0.05)
        beside = await asyncio.gather(*(stream(client, url, key, model, SHORT, 8, metrics_token) for _ in range(3)))
        worker_during = await fetch_metrics(client, direct, None) if direct else None
        await asyncio.gather(*longs)
        alone_ttft = median([p.ttft for p in alone if p.ttft is not None])
        beside_ttft = median([p.ttft for p in beside if p.ttft is not None])
        if math.isnan(alone_ttft) or math.isnan(beside_ttft):
            # seen on a tiny random-weights model: 8 tokens that decode to no text give no event to time; and on
            # a busy gateway that turned the short requests away (429)
            statuses = sorted({p.status for p in (*alone, *beside) if p.status != 200})
            why = f"answered {', '.join(map(str, statuses))}" if statuses else "carried no text to time"
            findings.append(Finding("long prompts crowd short ones", Reading.NOT_MEASURED,
                                    f"the short answers {why}"))
        else:
            findings.append(Finding(
                "long prompts crowd short ones", judged(differs(beside_ttft, alone_ttft, *CROWDING_BOUND)),
                f"short-prompt TTFT {alone_ttft * 1000:.0f} ms alone vs {beside_ttft * 1000:.0f} ms beside long "
                f"prompts ({beside_ttft / max(alone_ttft, 1e-9):.1f}x; {bound_text(*CROWDING_BOUND)})",
                "chunked prefill (vLLM --enable-chunked-prefill, a smaller --max-num-batched-tokens), or route long "
                "prompts to their own pool, so prefill does not stall the others' decoding"))

        after = await fetch_metrics(client, url, metrics_token)
        if before is not None and after is not None and sequential is not None:
            findings.append(_keep_alive(before, sequential))
            findings += _gateway_findings(before, after)
        else:
            findings.append(Finding("gateway metrics", Reading.NOT_MEASURED,
                                    "/metrics not readable (give --metrics-token if it is set)"))
        if not direct:
            findings.append(Finding("worker engine", Reading.NOT_MEASURED, "give --direct WORKER_URL to read the "
                                    "worker's own queue and idle gaps"))
        elif worker_before is None:
            findings.append(Finding("worker engine", Reading.NOT_MEASURED, f"{direct}/metrics did not answer"))
        if not metrics_token:
            findings.append(Finding("cost anomalies", Reading.OK, "these requests were not marked as probes (give "
                                    "--metrics-token): the tenant's cost-anomaly rule counted them"))
        if worker_before is not None:
            worker_after = await fetch_metrics(client, direct, None) if direct else None
            if worker_after is not None:
                findings += _worker_findings(worker_before, worker_after, worker_during)
    findings.sort(key=lambda f: not f.problem)
    return Report(findings, figures)


def _keep_alive(before: dict[str, Any], after: dict[str, Any]) -> Finding:
    """Requests sent one at a time need one connection between them when keep-alive works."""
    requests = total(after, "tollgate_requests_total") - total(before, "tollgate_requests_total")
    opened = (total(after, "tollgate_upstream_connections_opened_total")
              - total(before, "tollgate_upstream_connections_opened_total"))
    return Finding(
        "upstream keep-alive", judged(requests >= 3 and opened / requests > 0.5),
        f"{opened:.0f} connections opened to workers for {requests:.0f} requests sent one at a time "
        f"({max(0.0, 1 - opened / max(requests, 1)) * 100:.0f}% reuse)",
        "keep connections to the workers alive (pool keepalive_s well above the gap between requests; no "
        "'Connection: close' on the way); a new connection per request adds a handshake to every TTFT")


def _gateway_findings(before: dict[str, Any], after: dict[str, Any]) -> list[Finding]:
    out = []
    stages = {}
    for stage, name in (("queue wait", "tollgate_queue_wait_seconds"), ("connect", "tollgate_upstream_connect_seconds"),
                        ("ttft", "tollgate_ttft_seconds")):
        count = total(after, name + "_count") - total(before, name + "_count")
        spent = total(after, name + "_sum") - total(before, name + "_sum")
        stages[stage] = spent / count if count else 0.0
    engine = max(0.0, stages["ttft"] - stages["queue wait"] - stages["connect"])
    parts = {"gateway queue wait": stages["queue wait"], "upstream connect": stages["connect"],
             "worker (engine queue + prefill)": engine}
    slowest = max(parts, key=lambda k: parts[k])
    out.append(Finding("slowest stage", Reading.OK, f"of a mean TTFT of {stages['ttft'] * 1000:.0f} ms: " + ", ".join(
        f"{k} {v * 1000:.0f} ms" for k, v in parts.items()) + f"; most is {slowest}"))
    # lag during this run only (bucket deltas): a slow start-up long ago is not today's problem
    lag_count = (total(after, "tollgate_event_loop_lag_seconds_count")
                 - total(before, "tollgate_event_loop_lag_seconds_count"))
    then = {lab["le"]: v for lab, v in before.get("tollgate_event_loop_lag_seconds_bucket", [])}
    lag_buckets = sorted((float(lab["le"]), v - then.get(lab["le"], 0.0))
                         for lab, v in after.get("tollgate_event_loop_lag_seconds_bucket", []))
    p99 = next((le for le, v in lag_buckets if lag_count and v >= 0.99 * lag_count), 0.0)
    out.append(Finding(
        "gateway event-loop lag", judged(p99 > 0.02),
        f"p99 {p99 * 1000:.0f} ms (how late a 100 ms timer runs)",
        "give the gateway its own cores (a neighbour starving it coalesces tokens and adds TTFT); keep CPU work "
        "such as embeddings and logging off the loop"))
    return out


def _worker_findings(before: dict[str, Any], after: dict[str, Any], during: dict[str, Any] | None) -> list[Finding]:
    out = []
    count = (total(after, "vllm:request_queue_time_seconds_count")
             - total(before, "vllm:request_queue_time_seconds_count"))
    spent = total(after, "vllm:request_queue_time_seconds_sum") - total(before, "vllm:request_queue_time_seconds_sum")
    if count:
        out.append(Finding("worker queue", judged(spent / count > 0.2),
                           f"mean {spent / count * 1000:.0f} ms waiting inside the engine",
                           "the engine is full: scale out (see /admin/scale) or lower max_tokens"))
    if during is not None:
        running = total(during, "vllm:num_requests_running")
        waiting = total(during, "vllm:num_requests_waiting")
        out.append(Finding("idle engine with work waiting", judged(running == 0 and waiting > 0),
                           f"running {running:.0f}, waiting {waiting:.0f} under load",
                           "the engine is blocked (KV cache full or a stuck prefill): check KV usage and preemptions"))
    return out
