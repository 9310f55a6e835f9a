"""The workers' HTTP/1.1 client (gateway.transport.http1) against raw asyncio servers on loopback: each server
says exactly which bytes go back and when it closes, so reuse, limits, timeouts and ends are seen as they are."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.transport.http1 import Client, ConnectFailed, Disconnected, ReadTimeout


def in_loop(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())  # type: ignore[arg-type]
    return run


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(serve: Serve) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free port; yields its URL and a list with one entry per connection it accepted."""
    connections: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        srv.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: its head and body (by content-length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head, await reader.readexactly(length)


def answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


async def echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        _, body = await read_request(reader)
        writer.write(answer(body))
        await writer.drain()


@in_loop
async def test_a_connection_is_reused_and_the_request_arrives_whole() -> None:
    opened: list[int] = []
    async with server(echo_forever) as (url, connections):
        client = Client(8, 30.0, 2.0, 5.0, on_connect=lambda: opened.append(1))
        for i in range(3):
            reply = await client.request(b"POST", url, "/v1/chat/completions", b'{"n":%d}' % i,
                                         [(b"x-request-id", b"r%d" % i)])
            assert (reply.status, await reply.read()) == (200, b'{"n":%d}' % i)
            assert reply.header(b"content-type") == b"application/json"
            reply.release()
        client.close()
    assert len(connections) == 1 and len(opened) == 1, "one keep-alive connection for three requests"


@in_loop
async def test_a_connection_the_worker_closed_while_idle_is_replaced_without_an_error() -> None:
    """vLLM (uvicorn) closes a connection idle for 5 s; the next request goes out on a new one."""
    async def one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        writer.write(answer(body))  # keep-alive promised, then closed: as a server's idle timeout does
        await writer.drain()

    async with server(one_per_connection) as (url, connections):
        client = Client(8, 30.0, 2.0, 5.0)
        for i in range(3):
            reply = await client.request(b"POST", url, "/", b"%d" % i)
            assert await reply.read() == b"%d" % i
            reply.release()
        client.close()
    assert len(connections) == 3


@in_loop
async def test_a_silent_worker_times_out_and_its_connection_is_dropped() -> None:
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # until the client closes
        closed.set()

    async with server(silent) as (url, _):
        client = Client(8, 30.0, 2.0, 0.2)
        with pytest.raises(ReadTimeout):
            await client.request(b"POST", url, "/", b"{}")
        await asyncio.wait_for(closed.wait(), 5)


@in_loop
async def test_a_stream_is_read_as_it_comes_and_closing_it_early_drops_the_connection() -> None:
    go_on, closed = asyncio.Event(), asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"7\r\ndata: 1\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"7\r\ndata: 2\r\n")
        await writer.drain()
        await reader.read()
        closed.set()

    async with server(chunked) as (url, _):
        client = Client(8, 30.0, 2.0, 5.0)
        reply = await client.request(b"POST", url, "/", b"{}")
        assert await reply.readany() == b"data: 1"  # before the worker sent more
        go_on.set()
        assert await reply.readany() == b"data: 2"
        reply.close()  # the client left mid-stream: the worker must see it (vLLM aborts the request)
        await asyncio.wait_for(closed.wait(), 5)
    assert client.origins[url].open == 0


@in_loop
async def test_a_body_that_ends_with_its_connection_and_one_cut_short() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()

    client = Client(8, 30.0, 2.0, 5.0)
    async with server(until_close) as (url, _):
        reply = await client.request(b"POST", url, "/", b"{}")
        assert await reply.read() == b"all of it"
        reply.release()
    async with server(cut) as (url, _):
        reply = await client.request(b"POST", url, "/", b"{}")
        with pytest.raises(Disconnected):
            await reply.read()
        reply.close()


@in_loop
async def test_requests_beyond_the_limit_wait_for_a_connection_within_the_connect_timeout() -> None:
    release, holding = asyncio.Event(), asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            if body == b"hold":
                holding.set()
                await release.wait()
            writer.write(answer(body))
            await writer.drain()

    async with server(held) as (url, connections):
        client = Client(1, 30.0, 0.3, 5.0)
        first = asyncio.ensure_future(client.request(b"POST", url, "/", b"hold"))
        await holding.wait()  # it has the one connection
        with pytest.raises(ConnectFailed, match="no free connection"):
            await client.request(b"POST", url, "/", b"late")
        waiting = asyncio.ensure_future(client.request(b"POST", url, "/", b"next"))
        release.set()
        reply = await first
        assert await reply.read() == b"hold"
        reply.release()  # handed straight to the waiting request
        reply = await waiting
        assert await reply.read() == b"next"
        client.close()  # retired while an answer is in hand: its connection closes when it is released
        reply.release()
        assert client.origins[url].open == 0 and not client.origins[url].idle
    assert len(connections) == 1


@in_loop
async def test_a_large_body_is_read_whole_through_the_high_water_mark() -> None:
    big = bytes(range(256)) * 8192  # 2 MB

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(big))
        await writer.drain()

    async with server(large) as (url, _):
        client = Client(8, 30.0, 2.0, 5.0)
        reply = await client.request(b"POST", url, "/", b"{}")
        assert await reply.read() == big
        reply.release()
        client.close()


@in_loop
async def test_a_refused_connection_is_a_connect_failure() -> None:
    async with server(echo_forever) as (url, _):
        pass  # closed: nothing listens there now
    with pytest.raises(ConnectFailed):
        await Client(8, 30.0, 2.0, 5.0).request(b"POST", url, "/", b"{}")
