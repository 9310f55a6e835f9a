"""The rules of RFC 9112 that the workers' client keeps, each against a raw-socket worker that breaks it.

A connection to a worker serves one tenant's request after another, so every slip here hands one request's answer
to the next: an interim 1xx taken for the answer, bytes after an answer's end, bytes on an idle connection. The
other rules bound what one answer may take: its head and body in bytes as they arrive, its whole time.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.transport.http1 import BadResponse, Caps, Client, DeadlineExceeded, TooLarge
from tests.inprocess.transport.test_http1 import answer, in_loop, read_request, server


def client(caps: Caps | None = None) -> Client:
    return Client(8, 30.0, 2.0, 5.0, caps=caps or Caps())


async def ask(c: Client, url: str, body: bytes) -> tuple[int, bytes]:
    reply = await c.request(b"POST", url, "/", body)
    got = await reply.read()
    reply.release()
    return reply.status, got


@in_loop
async def test_interim_answers_are_skipped_and_the_connection_stays_in_step() -> None:
    """100 Continue, 103 Early Hints (with headers of its own), several in a row: the client waits for the final
    answer, takes none of the interim headers for it, and the next request on the connection gets its own."""
    interims = [b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n"]

    async def with_interims(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in range(6):
            _, body = await read_request(reader)
            writer.write(interims[i % 3])
            await writer.drain()  # apart from the answer: the client must wait on
            writer.write(answer(body))
            await writer.drain()

    async with server(with_interims) as (url, connections):
        c = client()
        for i in range(6):
            reply = await c.request(b"POST", url, "/", b"request %d" % i)
            assert reply.status == 200 and reply.header(b"link") is None
            assert await reply.read() == b"request %d" % i
            reply.release()
        c.close()
    assert len(connections) == 1, "interim answers do not cost the connection"


@in_loop
async def test_switching_protocols_unasked_is_a_bad_response() -> None:
    async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(upgrade) as (url, _):
        c = client()
        with pytest.raises(BadResponse):
            await c.request(b"POST", url, "/", b"{}")
        assert c.origins[url].open == 0


@in_loop
async def test_bytes_after_an_answer_close_the_connection_and_reach_no_request() -> None:
    """A stray answer written with the real one, or right behind it: the next request goes out on a new
    connection and gets its own answer, never the stray one."""
    stray = answer(b"STRAY")

    async def talkative(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        if body == b"same write":
            writer.write(answer(body) + stray)
        else:
            writer.write(answer(body))
            writer.write(stray)  # a write of its own, as a separate segment
        await writer.drain()
        await reader.read()

    async with server(talkative) as (url, connections):
        c = client()
        for first in (b"same write", b"next write"):
            assert await ask(c, url, first) == (200, first)
            assert await ask(c, url, b"mine") == (200, b"mine")
        c.close()
    assert len(connections) == 4, "each connection that spoke out of turn was closed"


@in_loop
async def test_a_byte_on_an_idle_connection_closes_it() -> None:
    speak, spoke = asyncio.Event(), asyncio.Event()

    async def speaks_while_idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        writer.write(answer(body))
        await writer.drain()
        await speak.wait()
        writer.write(answer(b"UNASKED"))
        await writer.drain()
        spoke.set()
        while True:
            _, body = await read_request(reader)  # were it reused, this answer would be one behind
            writer.write(answer(body))
            await writer.drain()

    async with server(speaks_while_idle) as (url, connections):
        c = client()
        assert await ask(c, url, b"one") == (200, b"one")
        origin = c.origins[url]
        assert len(origin.idle) == 1
        speak.set()
        await spoke.wait()
        # whether data_received saw the bytes already or the reuse check finds them, the next answer is its own
        assert await ask(c, url, b"two") == (200, b"two")
        c.close()
    assert len(connections) == 2


@in_loop
async def test_framing_that_contradicts_itself_is_refused() -> None:
    """Content-Length beside Transfer-Encoding, or two different lengths: no way to know where the answer ends,
    so none of it is taken, and the connection is not reused (a request smuggled behind it would be answered)."""
    heads = [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
             b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 50\r\n\r\nhello",
             b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"]

    for head in heads:
        async def contradicts(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes = head) -> None:
            await read_request(reader)
            writer.write(head)
            await writer.drain()
            await reader.read()

        async with server(contradicts) as (url, _):
            c = client()
            with pytest.raises(BadResponse):
                reply = await c.request(b"POST", url, "/", b"{}")
                await reply.read()
            assert c.origins[url].open == 0 and not c.origins[url].idle, head


@in_loop
async def test_a_head_that_never_ends_is_cut_at_its_cap_as_it_arrives() -> None:
    """A header value sent forever, or interim answers sent forever: both are head bytes, counted as they come,
    so the client stops at the cap instead of buffering (httptools keeps a header whole until it ends)."""
    async def sends_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        if body == b"value":
            writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
            piece = b"v" * 4096
        else:
            piece = b"HTTP/1.1 100 Continue\r\n\r\n" * 100
        for _ in range(4096):  # 16 MiB at most: far past the cap, and the test ends when the client hangs up
            writer.write(piece)
            await writer.drain()

    caps = Caps(head_bytes=16384)
    async with server(sends_forever) as (url, _):
        c = client(caps)
        for body in (b"value", b"interims"):
            with pytest.raises(TooLarge, match="head"):
                await c.request(b"POST", url, "/", body)
        assert c.origins[url].open == 0


@in_loop
async def test_a_head_just_under_its_cap_is_read_and_the_body_beside_it_does_not_count() -> None:
    caps = Caps(head_bytes=4096)
    filler = b"x-fill: " + b"f" * (4096 - 200) + b"\r\n"

    async def near_cap(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            writer.write(answer(body * 1000, filler))  # head and a large body in one write
            await writer.drain()

    async with server(near_cap) as (url, _):
        c = client(caps)
        assert await ask(c, url, b"0123456789") == (200, b"0123456789" * 1000)
        c.close()


@in_loop
async def test_a_body_over_its_cap_is_refused_and_nothing_of_it_is_kept() -> None:
    caps = Caps(body_bytes=100_000)

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            if body == b"chunked":  # no length to refuse at the head: counted as the chunks arrive
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                for _ in range(1000):
                    writer.write(b"%x\r\n%s\r\n" % (10_000, b"a" * 10_000))
                    await writer.drain()
                continue
            size = 50_000 if body == b"small" else 10_000_000
            writer.write(answer(b"a" * size))
            await writer.drain()

    async with server(large) as (url, _):
        c = client(caps)
        assert await ask(c, url, b"small") == (200, b"a" * 50_000)
        with pytest.raises(TooLarge, match="body"):  # its length says so: refused at the head
            await c.request(b"POST", url, "/", b"large")
        assert c.origins[url].open == 0

        reply = await c.request(b"POST", url, "/", b"chunked")  # read as a stream: the cap holds there too
        with pytest.raises(TooLarge):
            while await reply.readany():
                pass
        reply.close()
        assert c.origins[url].open == 0


@in_loop
async def test_a_trickling_answer_ends_at_its_deadline() -> None:
    """One byte every few milliseconds is never silent for the read timeout; the whole answer's deadline ends it."""
    caps = Caps(deadline_s=0.3)
    trickled = 0

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal trickled
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
        while True:
            writer.write(b"a")
            trickled += 1
            await writer.drain()
            await asyncio.sleep(0.005)  # the worker's pace, not the test's synchronisation

    async with server(trickle) as (url, _):
        c = client(caps)
        reply = await c.request(b"POST", url, "/", b"{}")
        with pytest.raises(DeadlineExceeded):
            while await reply.readany():
                pass
        reply.close()
    assert trickled > 0


@in_loop
async def test_an_answer_one_byte_over_its_cap_never_ends_as_a_success() -> None:
    """The read that passes the cap may also hold the answer's end: the answer still fails, whole and at once,
    whether its length was given (refused at the head) or it came in chunks (refused as they arrive)."""
    caps = Caps(body_bytes=1000)
    body = b"a" * 1001

    async def one_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, asked = await read_request(reader)
            if asked == b"length":
                writer.write(answer(body))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
                    len(body), body))
            await writer.drain()

    async with server(one_over) as (url, _):
        c = client(caps)
        with pytest.raises(TooLarge):
            await c.request(b"POST", url, "/", b"length")
        reply = await c.request(b"POST", url, "/", b"chunked")
        with pytest.raises(TooLarge):
            await reply.read()
        reply.close()
        assert c.origins[url].open == 0
        assert await ask(client(Caps(body_bytes=1001)), url, b"length") == (200, body), "at the cap: served"
