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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from workers.sim import tokenizer
from workers.sim.engine import Engine, EngineConfig, Sequence, block_hashes
from workers.sim.metrics import SimMetrics
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


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


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
                text = tokenizer.chat_prompt_text(_messages(body))
                count = tokenizer.count_chat(_messages(body))
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
                _check_int(dimensions, "dimensions", minimum=1)
            if dimensions is not None and dimensions > EMBEDDING_DIM:
                raise BadRequest(f"dimensions must be at most {EMBEDDING_DIM}.", param="dimensions")
            _cache_salt(body)  # accepted as vLLM accepts it on pooling requests; nothing is cached here
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
            conversation = self.responses.messages(body)
            seq = self._sequence(chat_body(body, conversation), chat=True)
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
            seq = self._sequence(body, chat)
        except BadRequest as exc:
            return error_response(str(exc), exc.status, exc.param)
        self.engine.submit(seq)
        stream_options = body.get("stream_options") or {}
        include_usage = bool(isinstance(stream_options, dict) and stream_options.get("include_usage"))
        return Generation(self, seq, chat=chat, stream=bool(body.get("stream")), include_usage=include_usage,
                          continuous_usage=include_usage and bool(stream_options.get("continuous_usage_stats")))

    def _sequence(self, body: dict[str, Any], chat: bool) -> Sequence:
        model = body.get("model")
        if model != self.model:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "model")
        if chat:
            messages = _messages(body)
            prompt_tokens = tokenizer.count_chat(messages)
            prompt_text = tokenizer.chat_prompt_text(messages)
            asked = next((tokenizer.message_text(m.get("content")) for m in reversed(messages)
                          if m.get("role") == "user"), "")
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise BadRequest("'prompt' must be a non-empty string.", param="prompt")
            prompt_tokens, prompt_text = tokenizer.count_text(prompt), prompt
            asked = prompt
        if body.get("n", 1) != 1:
            raise BadRequest("The simulator supports n=1 only.", param="n")
        max_len = self.config.max_model_len
        if prompt_tokens >= max_len:
            raise BadRequest(
                f"This model's maximum context length is {max_len} tokens. However, your prompt contains at least "
                f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please "
                f"reduce the length of the input prompt. (parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens")
        # vLLM 0.32: chat defaults to the rest of the context, completions to 16 (OpenAI's default)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = max_len - prompt_tokens if chat else 16
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}. "
                             f"(parameter=max_tokens, value={max_tokens})", param="max_tokens")
        _check_int(max_tokens, "max_tokens", minimum=1)
        if max_tokens > max_len:
            raise BadRequest(f"max_tokens={max_tokens} cannot be greater than max_model_len={max_len}. Please "
                             f"request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                             param="max_tokens")
        max_tokens = min(max_tokens, max_len - prompt_tokens)  # vLLM caps silently to what fits
        min_tokens = body.get("min_tokens", 0)
        _check_int(min_tokens, "min_tokens", minimum=0)
        priority = body.get("priority", 0)
        _check_int(priority, "priority", minimum=None)
        if priority and self.config.scheduling_policy != "priority":
            raise BadRequest("Priority scheduling is not enabled.", param="priority")
        for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
            value = body.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not low <= value <= high):
                raise BadRequest(f"'{name}' must be a number between {low} and {high}.", param=name)
        stop = body.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        if not all(isinstance(s, str) and s for s in stop):
            raise BadRequest("'stop' must be a string or a list of non-empty strings.", param="stop")
        seed = body.get("seed")
        words = tokenizer.topic(asked)
        return Sequence(
            request_id=uuid.uuid4().hex, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
            rng=tokenizer.output_rng(seed if isinstance(seed, int) else self.config.seed,
                                     tokenizer.meaning(prompt_text, asked, words)),
            min_tokens=min_tokens, ignore_eos=bool(body.get("ignore_eos")), stop=tuple(stop), priority=priority,
            block_hashes=block_hashes(tokenizer.token_ids(prompt_text), self.config.block_size,
                                      _cache_salt(body)),
            topic=words,
        )


class Generation:
    """The ASGI response for one sequence: streams chunks or answers once, and aborts on disconnect."""

    def __init__(self, server: SimServer, seq: Sequence, chat: bool, stream: bool, include_usage: bool,
                 continuous_usage: bool = False) -> None:
        self.server = server
        self.seq = seq
        self.chat = chat
        self.stream = stream
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage  # vLLM's continuous_usage_stats: usage on every chunk
        prefix = "chatcmpl-" if chat else "cmpl-"
        self.id = prefix + seq.request_id
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await answer_until_gone(self.server.engine, self.seq, self._stream(send) if self.stream
                                else self._answer(send), receive)

    async def _answer(self, send: Send) -> None:
        seq = self.seq
        while seq.finish_reason is None:
            seq.wake.clear()
            await seq.wake.wait()
        if seq.finish_reason == "abort":
            return
        text = seq.text
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": seq.finish_reason, "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": seq.finish_reason,
                      "stop_reason": None}
            obj = "text_completion"
        body = orjson.dumps({"id": self.id, "object": obj, "created": self.created, "model": self.server.model,
                             "choices": [choice], "usage": self._usage()})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _stream(self, send: Send) -> None:
        seq = self.seq
        faults = self.server.faults
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache")]})
        head = orjson.dumps({"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                             "created": self.created, "model": self.server.model})[:-1]
        # Like vLLM, the chat role chunk goes out with the first token, not before it.
        opening = (b"data: " + head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                   b'"logprobs":null,"finish_reason":null}]' + self._chunk_usage(0) + b"}\n\n") if self.chat else b""
        sent = 0
        while True:
            seq.wake.clear()
            if seq.finish_reason is None and len(seq.output) == sent:
                await seq.wake.wait()
            if seq.finish_reason == "abort":
                return
            new = seq.output[sent:]
            sent += len(new)
            if faults.drop_after is not None and sent >= faults.drop_after:
                raise ConnectionAbortedError("injected: connection dropped mid-stream")
            done = seq.finish_reason is not None
            parts = [self._chunk(head, piece, seq.finish_reason if done and i == len(new) - 1 else None,
                                 sent - len(new) + i + 1) for i, piece in enumerate(new)]
            if done and self.include_usage:
                parts.append(b"data: " + head + b',"choices":[],"usage":' + orjson.dumps(self._usage()) + b"}\n\n")
            if done:
                parts.append(b"data: [DONE]\n\n")
            if opening:
                parts.insert(0, opening)
                opening = b""
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": not done})
            if done:
                return
            if faults.hang_after is not None and sent >= faults.hang_after:
                await asyncio.Event().wait()  # until the client leaves

    def _chunk(self, head: bytes, piece: str, finish: str | None, completion: int) -> bytes:
        reason = b"null" if finish is None else b'"' + finish.encode() + b'"'
        text = orjson.dumps(piece)
        usage = self._chunk_usage(completion)
        if self.chat:
            return (b"data: " + head + b',"choices":[{"index":0,"delta":{"content":' + text
                    + b'},"logprobs":null,"finish_reason":' + reason + b"}]" + usage + b"}\n\n")
        return (b"data: " + head + b',"choices":[{"index":0,"text":' + text
                + b',"logprobs":null,"finish_reason":' + reason + b',"stop_reason":null}]' + usage + b"}\n\n")

    def _chunk_usage(self, completion: int) -> bytes:
        """With continuous usage, every chunk carries the prompt tokens and the completion tokens so far."""
        if not self.continuous_usage:
            return b""
        prompt = self.seq.prompt_tokens
        return b',"usage":' + orjson.dumps({"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                            "completion_tokens": completion})

    def _usage(self) -> dict[str, Any]:
        seq = self.seq
        completion = len(seq.output)
        usage: dict[str, Any] = {"prompt_tokens": seq.prompt_tokens, "total_tokens": seq.prompt_tokens + completion,
                                 "completion_tokens": completion}
        if seq.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": seq.cached_tokens}
        return usage


def _embedding_texts(value: object) -> list[str]:
    """The texts of an embeddings input: a string, strings, token ids, or lists of token ids (as text)."""
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, str) and v for v in value):
            return list(value)  # type: ignore[arg-type]
        if all(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value):
            return [" ".join(map(str, v)) for v in value]  # type: ignore[union-attr]
    raise BadRequest("'input' must be a non-empty string, list of strings, or list of token ids.", param="input")


def _vector(text: str, dimensions: int, encoding: str) -> list[float] | str:
    rng = random.Random(zlib.crc32(text.encode()))
    vector = [rng.random() - 0.5 for _ in range(EMBEDDING_DIM)][:dimensions]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    vector = [v / norm for v in vector]
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


async def answer_until_gone(engine: Engine, seq: Sequence, produce: Coroutine[Any, Any, None],
                            receive: Receive) -> None:
    """Run one sequence's answer until it ends or the client leaves; a sequence left unfinished is aborted."""
    answering = asyncio.ensure_future(produce)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait((answering, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not answering.done():
            answering.cancel()
        if seq.finish_reason is None:
            engine.abort(seq)
    if answering.done() and not answering.cancelled() and answering.exception():
        raise answering.exception()  # type: ignore[misc]


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json_body(request: Request) -> dict[str, Any]:
    if not request.headers.get("content-type", "").startswith("application/json"):
        raise BadRequest("1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed")
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if isinstance(messages, list) and not messages:
        raise BadRequest("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("'messages' must be a list of message objects.", param="messages")
    return messages


def _cache_salt(body: dict[str, Any]) -> str | None:
    """A request's ``cache_salt``, checked as vLLM 0.32 checks it (validate_cache_salt)."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    if len(salt) > 128 or any(char in "@/\\\x00" for char in salt):
        raise BadRequest("Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', "
                         "'\\\\', or NUL.", param="cache_salt")
    return salt


def _check_int(value: object, name: str, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise BadRequest(f"'{name}' must be an integer{bound}, got {value!r}.", param=name)


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
