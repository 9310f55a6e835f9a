"""The OpenAI request surface: parse a body, have its API validate it (``ctx.endpoint``, gateway.endpoints),
resolve the model, apply the max_tokens policy and the engine's cache_salt, and write the body for the worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from gateway import tags
from gateway.context import RequestContext
from gateway.endpoints.checks import bad, echo
from gateway.errors import InvalidRequest, NotFound, NotPermitted
from gateway.policy.loader import TenantView
from gateway.policy.schema import ModelRoute
from gateway.state.secret import GATEWAY_SECRET

LARGE_BODY = 64 * 1024  # parse and serialise bodies above this off the event loop


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


def apply_max_tokens(body: dict[str, Any], tenant: TenantView, field: str) -> str:
    """Enforce the tier's default and cap on the output bound ``field`` in place; returns what was applied, for a
    response header."""
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


async def prepare(ctx: RequestContext, raw: bytes, tags_header: bytes | None = None) -> Call:
    """Parse and validate the body, resolve the model, apply the tier's max_tokens policy (ctx.tenant is set).
    The cost centres come first (``tags_header``: the X-Tollgate-Tags header, if any), so a request refused
    further on is still recorded under them."""
    assert ctx.tenant is not None
    endpoint = ctx.endpoint
    body = await parse_json(raw)
    ctx.tags = tags.derive(body, tags_header)
    model = endpoint.validate(body)
    route = ctx.snapshot.policy.models.get(model)
    if route is None:
        raise NotFound(f"The model '{echo(model)}' does not exist.", "model_not_found", param="model")
    ctx.model = model
    if not ctx.tenant.may_use(model):
        raise NotPermitted(f"Tenant '{ctx.tenant.name}' may not use model '{model}'.", "model_not_allowed",
                           param="model")
    if route.kind != endpoint.model_kind:
        what = "embeddings" if route.kind == "embed" else "chat and completions"
        raise InvalidRequest(f"The model '{model}' serves {what} only.", "model_not_supported", param="model")
    salt = cache_salt(ctx.tenant, body)
    pool = ctx.snapshot.policy.pools.get(route.pool)
    engine_priority = pool is not None and pool.engine_priority
    field = endpoint.output_field(body)
    if field is None:  # no output tokens (embeddings): its cost is its input, known in full
        return Call(body, route, False, False, engine_priority, len(raw), 0, "max_tokens", endpoint.sequences(body),
                    cache_salt=salt)
    ctx.max_tokens_applied = apply_max_tokens(body, ctx.tenant, field)
    ctx.stream = bool(body.get("stream"))
    sequences = endpoint.sequences(body)
    if pool is not None:
        # the prompt at its bound (a byte a token): dense punctuation comes near it, and an echo repeats it
        fits(body, endpoint.answer_bytes(body, int(body[field]) * sequences, sequences, len(raw), ctx.stream),
             pool.max_answer_bytes, field)
    wants_usage, wants_continuous = endpoint.ask_usage(body, ctx.stream)
    return Call(body, route, wants_usage, wants_continuous, engine_priority, len(raw), int(body[field]), field,
                sequences, cache_salt=salt)


def fits(body: dict[str, Any], need: int, cap: int, field: str) -> None:
    """Refuse, before any worker generates it, an answer larger than the gateway relays (the pool's
    ``max_answer_bytes``): a worker would make it whole, and the gateway would have to drop it."""
    if need <= cap:
        return
    named = (("n", 2), ("best_of", 2), (field, 1), ("logprobs", True), ("top_logprobs", 1), ("prompt_logprobs", -1))
    asked = [f"{name}={orjson.dumps(body[name]).decode()}" for name, least in named
             if body.get(name) is not None and body[name] is not False and body[name] >= least]
    raise InvalidRequest(f"The answer to this request could take about {need / _MIB:,.0f} MiB "
                         f"({', '.join(asked)}), over the {cap / _MIB:g} MiB this gateway relays in one answer: "
                         "lower n, max_tokens or the number of log-probabilities.", "answer_too_large", param=field)


_MIB = 1 << 20


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
        raise bad("cache_salt", "'cache_salt' must be a non-empty string.")
    scope = tenant.name if tenant.prefix_cache == "salted" else None
    if asked is None:
        return None if scope is None else GATEWAY_SECRET.derive_kept(b"cache_salt", orjson.dumps([scope, None])).hex()
    return GATEWAY_SECRET.derive(b"cache_salt", orjson.dumps([scope, asked])).hex()


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
