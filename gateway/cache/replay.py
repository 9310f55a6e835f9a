"""A cached answer served in the same shape as a fresh one: JSON, or SSE chunks the openai client reads."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import orjson

from gateway import sse
from gateway.cache.store import Entry

_PIECE = re.compile(r"\s*\S+|\s+$")


def usage(entry: Entry, layer: str) -> dict[str, Any]:
    """The original token counts, marked as served from the cache (nothing was generated for them)."""
    return {"prompt_tokens": entry.prompt_tokens, "completion_tokens": entry.completion_tokens,
            "total_tokens": entry.prompt_tokens + entry.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": entry.prompt_tokens}, "cached": True, "cache_layer": layer}


def json_body(entry: Entry, model: str, layer: str) -> bytes:
    if entry.endpoint == "embeddings":  # the answer is the response's data array, as the worker wrote it
        return (b'{"object":"list","data":' + entry.answer.encode() + b',"model":' + orjson.dumps(model)
                + b',"usage":' + orjson.dumps(usage(entry, layer)) + b"}")
    created = int(time.time())
    if entry.endpoint == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": entry.answer}, "logprobs": None,
                  "finish_reason": entry.finish_reason}
        return orjson.dumps({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": created,
                             "model": model, "choices": [choice], "usage": usage(entry, layer)})
    choice = {"index": 0, "text": entry.answer, "logprobs": None, "finish_reason": entry.finish_reason}
    return orjson.dumps({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": created,
                         "model": model, "choices": [choice], "usage": usage(entry, layer)})


def sse_body(entry: Entry, model: str, layer: str, include_usage: bool) -> bytes:
    """The whole replay as one body: there is nothing to wait for between chunks."""
    chat = entry.endpoint == "chat"
    head = orjson.dumps({"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                         "object": "chat.completion.chunk" if chat else "text_completion",
                         "created": int(time.time()), "model": model})[:-1]
    parts = []
    pieces = _PIECE.findall(entry.answer) or [""]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        reason = orjson.dumps(entry.finish_reason) if last else b"null"
        if chat:
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            choice = b'{"index":0,"delta":' + orjson.dumps(delta) + b',"logprobs":null,"finish_reason":' + reason + b"}"
        else:
            choice = (b'{"index":0,"text":' + orjson.dumps(piece) + b',"logprobs":null,"finish_reason":' + reason
                      + b"}")
        parts.append(sse.event(head + b',"choices":[' + choice + b"]}"))
    if include_usage:
        parts.append(sse.event(head + b',"choices":[],"usage":' + orjson.dumps(usage(entry, layer)) + b"}"))
    parts.append(sse.DONE_EVENT)
    return b"".join(parts)


def answer_from_json(endpoint: str, body: bytes) -> tuple[str, str, dict[str, Any]] | None:
    """(text, finish_reason, usage) of a complete non-streamed answer, or None if it is not cacheable."""
    data = orjson.loads(body)
    if endpoint == "embeddings":
        vectors = data.get("data")
        if not isinstance(vectors, list) or not vectors or not isinstance(data.get("usage"), dict):
            return None
        return orjson.dumps(vectors).decode(), "stop", data["usage"]
    choices = data.get("choices") or []
    if len(choices) != 1 or not isinstance(data.get("usage"), dict):
        return None
    choice = choices[0]
    text = (choice.get("message") or {}).get("content") if endpoint == "chat" else choice.get("text")
    if not isinstance(text, str) or (endpoint == "chat" and (choice.get("message") or {}).get("tool_calls")):
        return None
    return text, choice.get("finish_reason") or "stop", data["usage"]


def answer_from_sse(endpoint: str, events: bytes) -> tuple[str, str, dict[str, Any]] | None:
    """Assemble a streamed answer; None unless it ran to [DONE] with a finish reason and usage."""
    text: list[str] = []
    finish: str | None = None
    usage_seen: dict[str, Any] | None = None
    done = False
    for payload in sse.payloads(events):
        if payload == sse.DONE:
            done = True
            continue
        data = orjson.loads(payload)
        if "error" in data:
            return None
        if isinstance(data.get("usage"), dict):
            usage_seen = data["usage"]
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                return None
            piece = (choice.get("delta") or {}).get("content") if endpoint == "chat" else choice.get("text")
            if (choice.get("delta") or {}).get("tool_calls"):
                return None
            if piece:
                text.append(piece)
            finish = choice.get("finish_reason") or finish
    if not done or finish is None or usage_seen is None:
        return None
    return "".join(text), finish, usage_seen
