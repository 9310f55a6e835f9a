"""A cached answer served in the same shape as a fresh one: its API writes the body (JSON, or SSE chunks the
openai client reads); the cache marks its usage as served from the cache."""

from __future__ import annotations

from typing import Any

from gateway.cache.store import Entry
from gateway.endpoints.base import Endpoint


def usage(entry: Entry, layer: str) -> dict[str, Any]:
    """The original token counts, marked as served from the response cache in fields of its own.
    ``prompt_tokens_details.cached_tokens`` is the engine's prefix cache, which served nothing here: 0, as the
    ledger records it (a client that reads it as "prompt tokens billed at the cached rate" must not find them all)."""
    return {"prompt_tokens": entry.prompt_tokens, "completion_tokens": entry.completion_tokens,
            "total_tokens": entry.prompt_tokens + entry.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0}, "cached": True, "cache_layer": layer}


def json_body(endpoint: Endpoint, entry: Entry, model: str, layer: str) -> bytes:
    return endpoint.replay_json(entry.answer, entry.finish_reason, model, usage(entry, layer))


def sse_body(endpoint: Endpoint, entry: Entry, model: str, layer: str, include_usage: bool) -> bytes:
    """The whole replay as one body: there is nothing to wait for between chunks."""
    return endpoint.replay_sse(entry.answer, entry.finish_reason, model, usage(entry, layer) if include_usage else None)
