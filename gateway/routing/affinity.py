"""Prefix-cache affinity: what a request says about the worker that most likely still holds its prefix in its KV
cache.

An engine with prefix caching (vLLM's automatic prefix caching, SGLang's radix cache) skips the prefill of
every leading block of a prompt it has seen recently; a system prompt of a few hundred tokens, or a
conversation's history, is then almost free on the worker that holds it and full price on any other. So:

- the prompt as the engine renders it (role and content of each message in order, or the completion
  prompt) is cut into blocks of ``BLOCK_BYTES`` (about 16 tokens, vLLM's block size, without a tokenizer on
  the hot path: the boundaries need not match the engine's, only be the same for the same prefix), each named
  by a running CRC-32 of everything before it, so a block's name stands for its whole prefix; the chain starts
  from the request's ``cache_salt``, as the engine's does, so the same prompt from two tenants (two salts, two
  sets of blocks in the engine) is two prefixes here too;
- each pool remembers which worker recently took which blocks (``prefixes.PrefixIndex``), and the deciders
  (``deciders``) send a request where its longest prefix is, to where its conversation or its new prefix hashes,
  within a load bound;
- a request that names a conversation (the OpenAI ``user`` field or an ``X-Session-Id`` header) is pinned the
  same way by that name.

CRC-32 over a 2 KB prompt costs about a microsecond; the index costs one dict lookup and one update per block.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

BLOCK_BYTES = 64
MAX_BLOCKS = 512  # the first 32 KB of a prompt: where shared prefixes are


@dataclass(frozen=True, slots=True)
class Affinity:
    """What a request says about where it would run best: its prompt's block names, and a conversation."""

    blocks: tuple[int, ...]
    session: str | None = None


def of_request(body: dict[str, Any], session: str | None = None) -> Affinity | None:
    """The affinity of a body as the worker gets it, its ``cache_salt`` set (None when it says nothing usable)."""
    text = _rendered(body)
    blocks: list[int] = []
    salt = body.get("cache_salt")
    running = zlib.crc32(salt.encode()) if isinstance(salt, str) else 0
    end = min(len(text), BLOCK_BYTES * MAX_BLOCKS)
    for start in range(0, end - BLOCK_BYTES + 1, BLOCK_BYTES):
        running = zlib.crc32(text[start:start + BLOCK_BYTES], running)
        blocks.append(running)
    user = body.get("user")
    session = session or (user if isinstance(user, str) and user else None)
    if not blocks and session is None:
        return None
    return Affinity(tuple(blocks), session)


def _rendered(body: dict[str, Any]) -> bytes:
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str))
            parts.append(f"{message.get('role')}\n{content if isinstance(content, str) else ''}\x00")
        return "".join(parts).encode()
    if "input" in body:  # the Responses API: instructions, then the input as text or items
        value = body.get("input")
        items = [{"role": "user", "content": value}] if isinstance(value, str) else value
        head = f"system\n{body.get('instructions')}\x00" if body.get("instructions") else ""
        return (head + _rendered({"messages": items}).decode()).encode()
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    return prompt.encode() if isinstance(prompt, str) else repr(prompt).encode()
