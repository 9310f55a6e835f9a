"""A vLLM-compatible OpenAI server over the simulated engine (Starlette routes, uvicorn).

Response shapes, error JSON and metric names follow vLLM (0.10+) so that the gateway, the
load generator and the conformance suite cannot tell it from a real worker by API alone.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import functools
import math
import random
import struct
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from workers.sim import params, tokenizer
from workers.sim.answers import Generation
from workers.sim.engine import Engine, EngineConfig
from workers.sim.metrics import SimMetrics
from workers.sim.params import BadRequest, check_cache_salt, check_int, check_messages
from workers.sim.responses import BadInput, ResponseGeneration, Responses, chat_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError",
                500: "InternalServerError", 502: "BadGatewayError", 503: "ServiceUnavailableError"}


METRICS_FAULTS = ("ok", "missing", "hang", "huge")
RUNNERS = ("generate", "pooling")
EMBEDDING_DIM = 384  # all-MiniLM-L6-v2's, a common small embedding model
HEAVY_BYTES = 1 << 16  # a request body larger than this is parsed and planned off the event loop
STRUCTURED = ("tools", "response_format", "structured_outputs", "guided_json")


@functools.cache
def _junk() -> bytes:
    """50 MB of series nobody asked for. Built once, off the event loop: building it takes 0.6 s of CPU, and an
    engine stalled that long fails its own /health (the fault is a page too large, not a stalled engine)."""
    return b"".join(b"sim_junk_series{n=\"%d\"} 1\n" % i for i in range(2_000_000))


async def _pieces(head: bytes, junk: bytes, size: int = 1 << 20) -> AsyncIterator[bytes]:
    yield head
    view = memoryview(junk)
    for start in range(0, len(junk), size):
        yield bytes(view[start:start + size])


@dataclass
class Faults:
    """Failure injection for tests; settable by flags and at run time through POST /sim/faults."""

    error_rate: float = 0.0
    error_statuses: tuple[int, ...] = (500,)
    hang_after: int | None = None
    drop_after: int | None = None
    ready_at: float = 0.0  # monotonic time before which /health answers 503
    metrics: str = "ok"  # ok | missing (404, as an engine without vLLM's metrics) | hang | huge (50 MB)
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def injected_status(self) -> int | None:
        if self.error_rate and self.rng.random() < self.error_rate:
            return self.error_statuses[int(self.rng.random() * len(self.error_statuses))]
        return None

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at


def error_response(message: str, status: int, param: str | None = None) -> Response:
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status, "APIError"), "param": param,
                      "code": status}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class SimServer:
    def __init__(self, config: EngineConfig, model: str, faults: Faults | None = None,
                 runner: str = "generate") -> None:
        self.model = model
        self.runner = runner
        self.traceparents: collections.deque[str] = collections.deque(maxlen=256)  # as received, for tests
        self.responses = Responses(self)
        self.config = config
        self.faults = faults or Faults()
        self.metrics = SimMetrics(model)
        self.engine = Engine(config, on_finish=self.metrics.on_finish, on_token_gap=self.metrics.itl.observe)
        self.created = int(time.time())
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/responses", self.create_response, methods=["POST"]),
                Route("/v1/responses/{response_id}", self.responses.retrieve, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics_endpoint, methods=["GET"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/sim/faults", self.set_faults, methods=["POST"]),
                Route("/sim/traceparents", self.seen_traceparents, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.faults.metrics == "huge":
            await asyncio.to_thread(_junk)
        self.engine.start()
        yield
        await self.engine.stop()

    # -- plain endpoints -------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.faults.ready else 503)

    async def models(self, request: Request) -> Response:
        card = {"id": self.model, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": self.model, "parent": None, "max_model_len": self.config.max_model_len}
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type="application/json")

    async def metrics_endpoint(self, request: Request) -> Response:
        fault = self.faults.metrics
        if fault == "missing":
            return error_response("Not Found", 404)
        if fault == "hang":
            await asyncio.Event().wait()  # until the client gives up
        body = self.metrics.render(self.engine)
        media_type = "text/plain; version=0.0.4; charset=utf-8"
        if fault == "huge":  # a broken exporter, sent in pieces (no 50 MB copy per read either)
            junk = await asyncio.to_thread(_junk)
            return StreamingResponse(_pieces(body, junk), media_type=media_type)
        return Response(body, media_type=media_type)

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            if "messages" in body:
                text = tokenizer.chat_prompt_text(check_messages(body))
                count = tokenizer.count_chat(check_messages(body))
                ids = tokenizer.token_ids(text)[:count]
            elif isinstance(body.get("prompt"), str):
                ids = tokenizer.token_ids(body["prompt"])
                count = len(ids)
            else:
                raise BadRequest("Either 'prompt' (a string) or 'messages' is required.", param="prompt")
        except BadRequest as exc:
            return error_response(str(exc), exc.status, exc.param)
        payload = {"count": count, "max_model_len": self.config.max_model_len, "tokens": ids, "token_strs": None}
        return Response(orjson.dumps(payload), media_type="application/json")

    async def seen_traceparents(self, request: Request) -> Response:
        """The W3C traceparent headers of the latest requests, oldest first (a gateway should forward one)."""
        return Response(orjson.dumps(list(self.traceparents)), media_type="application/json")

    async def set_faults(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            self.faults = faults_from_mapping(body, self.faults)
        except (BadRequest, TypeError, ValueError) as exc:
            return error_response(str(exc), 400)
        return Response(b"{}", media_type="application/json")

    # -- generation --------------------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        """vLLM's /v1/embeddings for a pooling model: one vector per input, the same for the same text (a
        random unit vector seeded by it: similar texts are not near each other), after the input's prefill time."""
        refusal = self._refusal(request, "pooling", "Embeddings API")
        if refusal is not None:
            return refusal
        try:
            body = await _json_body(request)
            if body.get("model") != self.model:
                raise BadRequest(f"The model `{body.get('model')}` does not exist.", 404, "model")
            texts = _embedding_texts(body.get("input"))
            dimensions = body.get("dimensions")
            if dimensions is not None:
                check_int(dimensions, "dimensions", minimum=1)
            if dimensions is not None and dimensions > EMBEDDING_DIM:
                raise BadRequest(f"dimensions must be at most {EMBEDDING_DIM}.", param="dimensions")
            check_cache_salt(body)  # accepted as vLLM accepts it on pooling requests; nothing is cached here
            encoding = body.get("encoding_format") or "float"
            if encoding not in ("float", "base64"):
                raise BadRequest("encoding_format must be 'float' or 'base64'.", param="encoding_format")
        except BadRequest as exc:
            return error_response(str(exc), exc.status, exc.param)
        tokens = [tokenizer.count_text(t) for t in texts]
        if max(tokens) > self.config.max_model_len:
            return error_response(f"This model's maximum context length is {self.config.max_model_len} tokens.",
                                  400, "input")
        await asyncio.sleep(sum(tokens) * self.config.prefill_per_token_s)
        data = [{"object": "embedding", "index": i, "embedding": _vector(text, dimensions or EMBEDDING_DIM, encoding)}
                for i, text in enumerate(texts)]
        usage = {"prompt_tokens": sum(tokens), "total_tokens": sum(tokens), "completion_tokens": 0,
                 "prompt_tokens_details": None}
        return Response(orjson.dumps({"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                                      "model": self.model, "data": data, "usage": usage}),
                        media_type="application/json")

    def _refusal(self, request: Request, runner: str, api: str) -> Response | None:
        """What an endpoint answers before its work: vLLM's 404 for an API this runner does not serve, a
        startup 503, or an injected failure."""
        if self.runner != runner:
            return error_response(f"The model does not support {api}", 404)
        traceparent = request.headers.get("traceparent")
        if traceparent:
            self.traceparents.append(traceparent)
        if not self.faults.ready:
            return error_response("The server is starting up.", 503)
        status = self.faults.injected_status()
        if status:
            self.metrics.injected_errors.labels(str(status)).inc()
            return error_response(f"Injected failure ({status}).", status)
        return None

    async def create_response(self, request: Request) -> Response | ResponseGeneration:
        """POST /v1/responses: the conversation (a previous response's, if named) run as a chat on the engine."""
        refusal = self._refusal(request, "generate", "Responses API")
        if refusal is not None:
            return refusal
        try:
            body = await _json_body(request)
            self._check_model(body)
            conversation = self.responses.messages(body)
            seq = params.single(chat_body(body, conversation), self.config)
        except (BadRequest, BadInput) as exc:
            return error_response(str(exc), exc.status, exc.param)
        self.engine.submit(seq)
        return ResponseGeneration(self, self.responses, seq, body, conversation)

    async def chat_completions(self, request: Request) -> Response | Generation:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response | Generation:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool) -> Response | Generation:
        refusal = self._refusal(request, "generate", "Chat Completions API" if chat else "Completions API")
        if refusal is not None:
            return refusal
        try:
            body = await _json_body(request)
            self._check_model(body)
            if _heavy(body, len(await request.body())):  # the body is read already: its length, not a copy
                ask, prompts, choices = await asyncio.to_thread(params.plan, body, chat, self.config)
            else:
                ask, prompts, choices = params.plan(body, chat, self.config)
        except BadRequest as exc:
            return error_response(str(exc), exc.status, exc.param)
        for choice in choices:
            self.engine.submit(choice.seq)
        return Generation(self, ask, prompts, choices)

    def _check_model(self, body: dict[str, Any]) -> None:
        if body.get("model") != self.model:
            raise BadRequest(f"The model `{body.get('model')}` does not exist.", 404, "model")


def _heavy(body: dict[str, Any], size: int) -> bool:
    """A request whose planning may take a while, so it is planned off the event loop (/health and the other
    requests' streams go on): structured output or tools (the first answer is written up to its budget to find
    an unsatisfiable schema), many answers, or a large body (a long prompt to tokenize)."""
    n = body.get("n")
    return (any(body.get(key) is not None for key in STRUCTURED) or (isinstance(n, int) and n > 16)
            or size > HEAVY_BYTES)


def _embedding_texts(value: object) -> list[str]:
    """The texts of an embeddings input: a string, strings, token ids, or lists of token ids (as text)."""
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, str) and v for v in value):
            return list(value)
        if all(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    raise BadRequest("'input' must be a non-empty string, list of strings, or list of token ids.", param="input")


def _vector(text: str, dimensions: int, encoding: str) -> list[float] | str:
    rng = random.Random(zlib.crc32(text.encode()))
    vector = [rng.random() - 0.5 for _ in range(EMBEDDING_DIM)][:dimensions]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    vector = [v / norm for v in vector]
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


async def _json_body(request: Request) -> dict[str, Any]:
    if not request.headers.get("content-type", "").startswith("application/json"):
        raise BadRequest("1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed")
    raw = await request.body()
    try:
        body = orjson.loads(raw) if len(raw) <= HEAVY_BYTES else await asyncio.to_thread(orjson.loads, raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def faults_from_mapping(data: dict[str, Any], base: Faults) -> Faults:
    """Apply the given fields over ``base``; unknown fields are an error, not a silent no-op."""
    known = {"error_rate", "error_statuses", "hang_after", "drop_after", "slow_start", "metrics"}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown fault fields: {sorted(unknown)}")
    changes: dict[str, Any] = {}
    if "error_rate" in data:
        rate = float(data["error_rate"])
        if not 0.0 <= rate <= 1.0:
            raise ValueError("error_rate must be between 0 and 1")
        changes["error_rate"] = rate
    if "error_statuses" in data:
        statuses = tuple(int(s) for s in data["error_statuses"])
        if not statuses or not all(400 <= s <= 599 for s in statuses):
            raise ValueError("error_statuses must be HTTP error codes (400-599)")
        changes["error_statuses"] = statuses
    for name in ("hang_after", "drop_after"):
        if name in data:
            value = data[name]
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or null")
            changes[name] = value
    if "metrics" in data:
        if data["metrics"] not in METRICS_FAULTS:
            raise ValueError(f"metrics must be one of {', '.join(METRICS_FAULTS)}")
        changes["metrics"] = data["metrics"]
    if "slow_start" in data:
        changes["ready_at"] = time.monotonic() + float(data["slow_start"])
    return replace(base, **changes)
