"""The relay's reading of a worker's answer (gateway.upstream.relay), against raw-socket workers: the usage of a
whole answer without parsing a large one whole, and the cache's copy of a stream bounded by what it would store."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.fleet.worker import Worker
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy
from gateway.sink import BufferSink
from gateway.transport.http1 import Client
from gateway.upstream.relay import CAPTURE_PER_ENTRY, Relayed, relay_stream, usage_of
from tests.conftest import policy_dict
from tests.fakes import chunk, usage_event
from tests.inprocess.transport.test_http1 import in_loop, read_request, server

USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9, "prompt_tokens_details": {"cached_tokens": 3}}


def embeddings(inputs: int, usage: dict[str, object] | None = USAGE, text: str = "") -> bytes:
    body: dict[str, object] = {"object": "list", "model": "m", "note": text, "data": [
        {"object": "embedding", "index": i, "embedding": [0.125] * 384} for i in range(inputs)]}
    if usage is not None:
        body["usage"] = usage
    return orjson.dumps(body)


def test_the_usage_of_a_whole_answer_small_or_large() -> None:
    small, large = embeddings(1), embeddings(400)
    assert len(small) < 64 * 1024 < len(large)
    assert usage_of(small) == USAGE and usage_of(large) == USAGE
    assert usage_of(embeddings(400, usage=None)) is None
    assert usage_of(embeddings(400, usage=None, text='say "usage": {"prompt_tokens": 99}')) is None, \
        "a key inside a string is escaped, never taken for the answer's"
    assert usage_of(b"  " + large + b"\n") == USAGE
    for broken in (b"[1, 2]", b"not json", b"[" + large + b"]", large[1:]):
        with pytest.raises(ValueError):
            usage_of(broken)


@in_loop
async def test_the_caches_copy_of_a_stream_stops_past_what_the_cache_would_store() -> None:
    """A stream is relayed whole either way; the copy kept for the cache is dropped once it passes
    CAPTURE_PER_ENTRY times the largest entry the cache stores."""
    policy = policy_dict(["http://127.0.0.1:1"])
    policy["cache"] = {"enabled": True, "max_tenant_bytes": 256 * 1024, "max_bytes": 1 << 20}
    snapshot = PolicySnapshot.build(Policy.model_validate(policy), "test")
    room = CAPTURE_PER_ENTRY * snapshot.policy.cache.max_entry_bytes

    def stream_of(size: int) -> bytes:
        events = b"".join(chunk("x" * 1000) for _ in range(size // 1100 + 1)) + usage_event(7, 2) + \
            b"data: [DONE]\n\n"
        return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (
            len(events), events)

    async def streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            writer.write(stream_of(int(body)))
            await writer.drain()

    async with server(streams) as (url, _):
        client = Client(8, 30.0, 2.0, 5.0)
        for size, kept in ((room // 2, True), (room * 2, False)):
            ctx = RequestContext("r", snapshot, CHAT)
            sink, relayed = BufferSink(), Relayed()
            response = await client.request(b"POST", url, "/", b"%d" % size)
            await relay_stream(ctx, Worker(url, "main"), response, sink, relayed, (False, False), 1.0, capture=True)
            assert sink.complete and len(sink.body) > size, "relayed whole"
            assert (relayed.captured is not None) == kept, size
        client.close()
