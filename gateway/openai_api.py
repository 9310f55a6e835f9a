"""The OpenAI request surface: parse and validate bodies, apply the max_tokens policy.

Validation is hand-written over plain dicts rather than pydantic models: it runs once per
request on the hot path, and the body is forwarded to vLLM with unknown fields intact
(``top_k``, ``min_p``, ``ignore_eos`` ... are vLLM's to accept).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.context import RequestContext
from gateway.errors import InvalidRequest, NotFound, NotPermitted
from gateway.policy.loader import TenantView
from gateway.policy.schema import ModelRoute
from gateway.state.secret import GATEWAY_SECRET

# The endpoints the gateway serves, by the name a request context carries, and their paths (on the HTTP edge,
# in batch files, and on the workers alike).
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings",
         "responses": "/v1/responses"}
ENDPOINT_OF_PATH = {path: name for name, path in PATHS.items()}
LARGE_BODY = 64 * 1024  # parse and serialise bodies above this off the event loop
ECHO_LIMIT = 64  # characters of a client-chosen value echoed back in an error
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


async def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = await asyncio.to_thread(orjson.loads, raw) if len(raw) > LARGE_BODY else orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", "invalid_json")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:  # a C-speed count; only then a trial write, also in C
        try:
            await asyncio.to_thread(orjson.dumps, body) if len(raw) > LARGE_BODY else orjson.dumps(body)
        except orjson.JSONEncodeError:
            raise InvalidRequest(f"The request body nests deeper than {MAX_DEPTH} levels.", "invalid_json") from None
    return body


MAX_DEPTH = 255  # orjson reads 1,024 levels but writes 255: a deeper body could not be forwarded


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, "invalid_value", param=param)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(name, f"'{name}' must be a number between {low:g} and {high:g}, got {value!r}.")


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"between {low} and {high}"
        raise _bad(name, f"'{name}' must be an integer {limit}, got {value!r}.")


def validate_common(body: dict[str, Any]) -> str:
    """Checks shared by both endpoints; returns the model name."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", "missing_model", param="model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be a boolean.")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("stream_options", "'stream_options' must be an object.")
        if not stream:
            raise _bad("stream_options", "'stream_options' is only allowed when 'stream' is true.")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    _integer(body, "n", 1, 128)
    _integer(body, "best_of", 1, 128)
    _integer(body, "max_tokens", 1)
    _integer(body, "max_completion_tokens", 1)
    _integer(body, "seed", -(2**63), 2**64 - 1)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad("stop", "'stop' must be a string or a list of strings.")
    return model


def validate_chat(body: dict[str, Any]) -> str:
    model = validate_common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "'messages' must be a non-empty array of message objects.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}]", f"messages[{i}] must be an object.")
        role = message.get("role")
        if role not in _ROLES:
            raise _bad(f"messages[{i}].role", f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}.")
        content = message.get("content")
        if content is None:
            if role != "assistant" or not message.get("tool_calls"):
                raise _bad(f"messages[{i}].content", f"messages[{i}].content is required.")
        elif isinstance(content, list):
            _parts(content, f"messages[{i}].content")
        elif not isinstance(content, str):
            raise _bad(f"messages[{i}].content", f"messages[{i}].content must be a string or an array of parts.")
    return model


def _parts(parts: list[Any], param: str) -> None:
    """Content parts are objects with a string ``type``, and a text part's ``text`` is a string: the prefix
    index, the cache key and the prompt estimate read them, and the worker would refuse anything else."""
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _bad(f"{param}[{j}]", f"{param}[{j}] must be an object with a string 'type'.")
        if "text" in part and not isinstance(part["text"], str):
            raise _bad(f"{param}[{j}].text", f"{param}[{j}].text must be a string.")


def validate_completion(body: dict[str, Any]) -> str:
    model = validate_common(body)
    prompt = body.get("prompt")
    ok = (isinstance(prompt, str) and prompt) or (
        isinstance(prompt, list) and prompt and all(isinstance(p, str | int | list) for p in prompt))
    if not ok:
        raise _bad("prompt", "'prompt' must be a non-empty string, array of strings, or array of token ids.")
    return model


def validate_responses(body: dict[str, Any]) -> str:
    """A Responses API body: ``input`` a non-empty string or array of input items."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", "missing_model", param="model")
    value = body.get("input")
    if not ((isinstance(value, str) and value) or (isinstance(value, list) and value and all(
            isinstance(item, dict) for item in value))):
        raise _bad("input", "'input' must be a non-empty string or array of input items.")
    for i, item in enumerate(value if isinstance(value, list) else ()):
        content = item.get("content")
        if isinstance(content, list):
            _parts(content, f"input[{i}].content")
        elif content is not None and not isinstance(content, str):
            raise _bad(f"input[{i}].content", f"input[{i}].content must be a string or an array of parts.")
    for name in ("instructions", "previous_response_id"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise _bad(name, f"'{name}' must be a string.")
    for name in ("stream", "store", "background"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise _bad(name, f"'{name}' must be a boolean.")
    if body.get("background"):
        raise _bad("background", "Background responses are not supported through this gateway: the worker answers "
                                 "'queued' with no usage and generates afterwards, outside the request, so the "
                                 "tokens could not be metered, limited or billed. Leave 'background' unset.")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _integer(body, "max_output_tokens", 1)
    return model


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the inputs of one embeddings request
_ENCODINGS = frozenset({"float", "base64"})


def validate_embeddings(body: dict[str, Any]) -> str:
    """An embeddings body: ``input`` is a string, an array of strings, an array of token ids or an array of
    such arrays (each non-empty), at most MAX_EMBEDDING_INPUTS of them."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", "missing_model", param="model")
    if embedding_inputs(body) == 0:
        raise _bad("input", "'input' must be a non-empty string, array of strings, array of token ids, or array "
                            "of token id arrays.")
    if embedding_inputs(body) > MAX_EMBEDDING_INPUTS:
        raise _bad("input", f"'input' may hold at most {MAX_EMBEDDING_INPUTS} items.")
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in _ENCODINGS:
        raise _bad("encoding_format", f"'encoding_format' must be 'float' or 'base64', got {echo(encoding)!r}.")
    _integer(body, "dimensions", 1)
    if body.get("stream"):
        raise _bad("stream", "Embeddings are not streamed.")
    return model


def embedding_inputs(body: dict[str, Any]) -> int:
    """How many inputs an embeddings body holds; 0 when ``input`` is not one of its shapes."""
    value = body.get("input")
    if isinstance(value, str):
        return 1 if value else 0
    if not isinstance(value, list) or not value:
        return 0
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return 1
    if all(isinstance(v, str) and v for v in value) or all(
            isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
            for v in value):
        return len(value)
    return 0


def output_field(endpoint: str, body: dict[str, Any]) -> str:
    """The body field that bounds the output: the Responses API's max_output_tokens, or the one of max_tokens
    and max_completion_tokens the client used."""
    if endpoint == "responses":
        return "max_output_tokens"
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"


def apply_max_tokens(body: dict[str, Any], tenant: TenantView, endpoint: str = "chat") -> str:
    """Enforce the tier's default and cap in place; returns what was applied, for a response header."""
    field = output_field(endpoint, body)
    asked = body.get(field)
    cap = tenant.max_tokens_cap
    if asked is None:
        value = min(tenant.max_tokens_default, cap)
        body[field] = value
        return f"default; value={value}"
    if asked <= cap:
        return f"requested; value={asked}"
    if tenant.on_exceed == "reject":
        raise InvalidRequest(f"'{field}' is {asked}, above this tier's cap of {cap}.", "max_tokens_exceeded",
                             param=field)
    body[field] = cap
    return f"clamped; requested={asked}; value={cap}"


def echo(value: object) -> str:
    """A client-chosen value, cut short for an error message or a log line."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= ECHO_LIMIT else text[:ECHO_LIMIT] + "..."


@dataclass(slots=True)
class Call:
    """A validated request, ready for the cache and the workers."""

    body: dict[str, Any]
    route: ModelRoute
    wants_usage: bool  # the client asked for the usage event in its stream
    wants_continuous_usage: bool  # ... and for usage on every chunk (vLLM's continuous_usage_stats)
    engine_priority: bool  # the pool's workers run --scheduling-policy priority
    size: int  # bytes as received
    max_output: int  # output tokens per sequence (max_tokens or max_completion_tokens), read once in prepare;
    # 0 for embeddings
    max_output_field: str  # which of the two the body carries
    sequences: int  # sequences it generates: each prompt of a list, times max(n, best_of); embeddings: inputs
    cache_salt: str | None = None  # the engine's cache_salt (see cache_salt()), written into the body by serialise

    # tokens of the stored conversation the worker puts before this prompt (a Responses API follow-up naming
    # previous_response_id): the pipeline sets it from what the previous response used
    carried: int = 0

    @property
    def prompt_estimate(self) -> int:
        """Prompt tokens as usually written (4 bytes a token, plus the conversation carried), for the scheduler's
        fair shares, the anomaly rule's sense of a tenant's normal size, and a cut request's estimated usage: a
        guess, not a bound."""
        return self.size // 4 + self.carried

    @property
    def prompt_bound(self) -> int:
        """Prompt tokens this request can use at most, whatever the body holds: every byte of the body as a
        token (a byte-level BPE never makes more tokens than bytes, and the JSON around each message outweighs
        the chat template's few tokens per message; dense punctuation comes near one token a byte), plus the
        conversation carried, which the body does not show."""
        return self.size + self.carried

    @property
    def worst_tokens(self) -> int:
        """Tokens this request can use at most: the prompt bound plus max_tokens for every sequence. Budgets
        reserve it and the tokens-per-minute limit charges it, then both settle to the usage the worker
        reports."""
        return self.prompt_bound + self.max_output * self.sequences

    @property
    def cost(self) -> int:
        """Tokens it will likely use, for fair shares between tenants: the prompt estimate plus max_tokens for
        every sequence."""
        return self.prompt_estimate + self.max_output * self.sequences


_VALIDATORS = {"chat": validate_chat, "completions": validate_completion, "embeddings": validate_embeddings,
               "responses": validate_responses}


async def prepare(ctx: RequestContext, raw: bytes) -> Call:
    """Parse and validate the body, resolve the model, apply the tier's max_tokens policy (ctx.tenant is set)."""
    assert ctx.tenant is not None
    body = await parse_json(raw)
    model = _VALIDATORS[ctx.endpoint](body)
    route = ctx.snapshot.policy.models.get(model)
    if route is None:
        raise NotFound(f"The model '{echo(model)}' does not exist.", "model_not_found", param="model")
    ctx.model = model
    if not ctx.tenant.may_use(model):
        raise NotPermitted(f"Tenant '{ctx.tenant.name}' may not use model '{model}'.", "model_not_allowed",
                           param="model")
    if (route.kind == "embed") != (ctx.endpoint == "embeddings"):
        what = "embeddings" if route.kind == "embed" else "chat and completions"
        raise InvalidRequest(f"The model '{model}' serves {what} only.", "model_not_supported", param="model")
    salt = cache_salt(ctx.tenant, body)
    pool = ctx.snapshot.policy.pools.get(route.pool)
    engine_priority = pool is not None and pool.engine_priority
    if ctx.endpoint == "embeddings":  # no output tokens: its cost is its input, known in full
        return Call(body, route, False, False, engine_priority, len(raw), 0, "max_tokens", embedding_inputs(body),
                    cache_salt=salt)
    ctx.max_tokens_applied = apply_max_tokens(body, ctx.tenant, ctx.endpoint)
    ctx.stream = bool(body.get("stream"))
    field = output_field(ctx.endpoint, body)
    if ctx.endpoint == "responses":  # the usage comes in the response object itself, streamed or not
        return Call(body, route, True, True, engine_priority, len(raw), int(body[field]), field, 1,
                    cache_salt=salt)
    wants_usage = wants_continuous = False
    if ctx.stream:
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        wants_usage = bool(options.get("include_usage"))
        wants_continuous = wants_usage and bool(options.get("continuous_usage_stats"))
        # the ledger needs the usage, and on every chunk, so that a stream cut anywhere is still counted exactly
        body["stream_options"] = {**options, "include_usage": True, "continuous_usage_stats": True}
    return Call(body, route, wants_usage, wants_continuous, engine_priority, len(raw), int(body[field]), field,
                sequences(body), cache_salt=salt)


def cache_salt(tenant: TenantView, body: dict[str, Any]) -> str | None:
    """The engine's ``cache_salt`` for a request (vLLM's, on all four endpoints): requests share prefix-cache
    blocks only when their salts are equal, and a tenant that sees from its TTFT that a prompt's prefix was cached
    learns what another sent. A salted tenant's salt is an HMAC of its name under the gateway's key: the same for
    all its requests (its system prompts still hit), on every replica, and not one anybody else can name. A
    client's own salt is folded in, never sent as it is, so it can only narrow the sharing. A shared tenant
    sends none (the engine-wide cache), or with a salt of its client's, one shared with every shared tenant
    that sends that salt."""
    asked = body.get("cache_salt")
    if asked is not None and (not isinstance(asked, str) or not asked):
        raise _bad("cache_salt", "'cache_salt' must be a non-empty string.")
    scope = tenant.name if tenant.prefix_cache == "salted" else None
    if asked is None:
        return None if scope is None else GATEWAY_SECRET.derive_kept(b"cache_salt", orjson.dumps([scope, None])).hex()
    return GATEWAY_SECRET.derive(b"cache_salt", orjson.dumps([scope, asked])).hex()


def sequences(body: dict[str, Any]) -> int:
    """How many sequences a validated body asks the engine for: each prompt of a completions list (strings, or
    lists of token ids), times the larger of n and best_of."""
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return prompts * max(body.get("n") or 1, body.get("best_of") or 1)


def clamp_output(ctx: RequestContext, call: Call, tokens: int, why: str) -> None:
    """Lower a prepared request's output tokens (the cost-anomaly clamp): in the body the worker gets, in the
    Call, and in the header that tells the client why."""
    call.body[call.max_output_field] = tokens
    call.max_output = tokens
    ctx.max_tokens_applied = f"{why}; value={tokens}"


def retarget(call: Call, model: str, route: ModelRoute) -> None:
    """Send a prepared request to another model (a fallback): its route, and the name in the body."""
    call.route = route
    call.body["model"] = model


ENGINE_PRIORITY = {"premium": 0, "standard": 1, "batch": 2}  # vLLM's priority: lower runs first


async def serialise(call: Call, service_class: str = "standard") -> bytes:
    """The body for the worker. JSON the client sent but that cannot be written back (orjson writes at most
    255 levels of nesting, reads 1,024) is the client's error, not the gateway's. The model is renamed here, for
    the workers only: the cache keys on the name the client asked for."""
    if call.route.upstream_model:
        call.body["model"] = call.route.upstream_model
    if call.engine_priority:
        call.body["priority"] = ENGINE_PRIORITY[service_class]
    if call.cache_salt is None:
        call.body.pop("cache_salt", None)
    else:
        call.body["cache_salt"] = call.cache_salt
    try:
        if call.size <= LARGE_BODY:
            return orjson.dumps(call.body)
        return await asyncio.to_thread(orjson.dumps, call.body)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequest(f"The request body cannot be forwarded: {exc}", "invalid_json") from None
