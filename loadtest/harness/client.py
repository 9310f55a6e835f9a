"""One request, measured from the client's side: TTFT, inter-token gaps, TPOT, total, status.

aiohttp, because the client must not be the bottleneck: measured here it costs 0.06-0.10 ms of CPU
per request against httpx's 0.55-1.50 ms. SSE is split by gateway.sse (byte searches); only the usage event is
parsed as JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from gateway import sse
from loadtest.harness.workload import PreparedRequest


@dataclass(slots=True)
class Result:
    cls: str
    kind: str
    stream: bool
    start: float  # seconds since the run began
    status: int = 0
    error: str | None = None
    ttft: float | None = None  # seconds to the first content token (streams) or the answer
    total: float | None = None
    tpot: float | None = None
    gaps: list[float] = field(default_factory=list)
    output_tokens: int = 0
    server: dict[str, float] = field(default_factory=dict)  # Server-Timing, in ms
    cache: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def parse_server_timing(header: str) -> dict[str, float]:
    """'queue_wait;dur=0.01, ttft;dur=3.2' -> {'queue_wait': 0.01, 'ttft': 3.2} (milliseconds)."""
    stages: dict[str, float] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                try:
                    stages[name] = float(value)
                except ValueError:
                    pass
    return stages


def make_session(limit: int = 0) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, ttl_dns_cache=None, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


async def execute(session: aiohttp.ClientSession, target: str, request: PreparedRequest, t0: float,
                  timeout_s: float) -> Result:
    cls = request.cls
    started = time.perf_counter()
    result = Result(cls.name, request.kind, cls.stream, started - t0)
    headers = {"content-type": "application/json"}
    if cls.api_key:
        headers["authorization"] = f"Bearer {cls.api_key}"
    try:
        async with session.post(target + request.path, data=request.body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            result.status = response.status
            result.server = parse_server_timing(response.headers.get("server-timing", ""))
            shown = response.headers.get("x-tollgate-cache")  # <outcome>[; key=value]*: the outcome is counted
            result.cache = shown.split(";", 1)[0] if shown else None
            if response.status != 200:
                body = await response.read()
                result.error = _error_code(body, response.status)
            elif cls.stream:
                await _read_stream(response, result, started)
            else:
                body = await response.read()
                result.ttft = time.perf_counter() - started
                usage = orjson.loads(body).get("usage") or {}
                result.output_tokens = int(usage.get("completion_tokens") or 0)
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        result.error = type(exc).__name__
    result.total = time.perf_counter() - started
    if result.ttft is not None and result.output_tokens > 1 and cls.stream and result.gaps:
        result.tpot = sum(result.gaps) / len(result.gaps)
    return result


async def _read_stream(response: aiohttp.ClientResponse, result: Result, started: float) -> None:
    splitter = sse.EventSplitter()
    last: float | None = None
    tokens = 0
    async for chunk in response.content.iter_any():
        now = time.perf_counter()
        for payload in sse.payloads(splitter.feed(chunk)):
            if payload == sse.DONE:
                continue
            if b'"error"' in payload and b'"choices"' not in payload:
                result.error = _error_code(payload, 200)
                continue
            if b'"choices":[]' in payload or b'"choices": []' in payload:
                usage = orjson.loads(payload).get("usage") or {}
                result.output_tokens = int(usage.get("completion_tokens") or 0)
                continue
            if b'"role":"assistant"' in payload and tokens == 0 and b'"content":""' in payload:
                continue  # the role-only opening chunk carries no token
            tokens += 1
            if last is None:
                result.ttft = now - started
            else:
                result.gaps.append(now - last)
            last = now
    if not result.output_tokens:
        result.output_tokens = tokens


def _error_code(body: bytes, status: int) -> str:
    try:
        error = orjson.loads(body).get("error") or {}
        return str(error.get("code") or error.get("type") or f"http_{status}")
    except (orjson.JSONDecodeError, AttributeError):
        return f"http_{status}"
