"""The server protocol's own limits, on a loopback socket in the test's event loop (uvicorn's protocol, no
server process): each class made by protocol_for keeps its own limits; an oversized request line, head or
header count is answered in OpenAI's error shape and the connection ended; a head that never ends is refused
at the head's limit; a silent connection is closed and a slow head or body gets a 408; a client that closes its
connection before its answer cancels the request's work; a sized answer goes out in one write, a stream's head
before its body."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.http.asgi import departure, until_disconnect
from gateway.http.server import Limits, protocol_for

LIMITS = Limits(max_request_line_bytes=256, max_header_bytes=1024, max_headers=8, idle_timeout_s=0.3,
                header_timeout_s=0.3, body_timeout_s=0.3)


async def echo_length(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers 200 with the size of the body it read."""
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    answer = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def serving(limits: Limits, app: Any = echo_length,
                  protocol: type[Any] | None = None) -> AsyncIterator[int]:
    """The guarded protocol (or ``protocol``) on 127.0.0.1:<free port>, as uvicorn would run it; yields the
    port."""
    config = uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning")
    config.load()
    state, protocol = ServerState(), protocol or protocol_for(limits)
    server = await asyncio.get_running_loop().create_server(
        lambda: protocol(config=config, server_state=state, app_state={}), "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for connection in list(state.connections):
            connection.shutdown()


async def exchange(port: int, *parts: bytes) -> bytes:
    """Send ``parts`` and read the answer until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in parts:
            writer.write(part)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()


def refusal(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split()[1]), orjson.loads(body)["error"]["code"]


def test_the_limits_refuse_in_openais_shape_each_protocol_class_its_own() -> None:
    async def main() -> None:
        roomy = dataclasses.replace(LIMITS, max_request_line_bytes=4096)
        async with serving(LIMITS) as port, serving(roomy) as roomy_port:
            long_line = b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            assert refusal(await exchange(port, long_line)) == (414, "request_line_too_long")
            assert b" 200 " in (await exchange(roomy_port, long_line)).split(b"\r\n")[0], "another class, its limit"

            big_head = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"v" * 1100 + b"\r\n\r\n"
            assert refusal(await exchange(port, big_head)) == (431, "headers_too_large")
            many = b"GET / HTTP/1.1\r\n" + b"".join(b"x-h%d: 1\r\n" % i for i in range(9)) + b"\r\n"
            assert refusal(await exchange(port, many)) == (431, "headers_too_large")
            never_ends = b"GET / HTTP/1.1\r\nx-endless: " + b"v" * (LIMITS.max_head_bytes + 10)  # no CRLF, ever
            assert refusal(await exchange(port, never_ends)) == (431, "headers_too_large")

            fine = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"
            assert (await exchange(port, fine)).endswith(b"\r\n\r\n5")
    asyncio.run(main())


def test_silent_slow_head_and_slow_body_are_each_timed_out() -> None:
    async def main() -> tuple[bytes, bytes, bytes]:
        async with serving(LIMITS) as port:
            return await asyncio.gather(
                exchange(port),  # connects and says nothing
                exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\n"),  # a head that stops half-way
                exchange(port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nab"))  # 2 of 10 bytes
    silent, slow_head, slow_body = asyncio.run(main())
    assert silent == b"", "an idle connection is closed without an answer"
    assert refusal(slow_head) == (408, "request_timeout") and refusal(slow_body) == (408, "request_timeout")


def test_a_client_that_closes_before_its_answer_cancels_the_work_in_the_requests_task() -> None:
    """The protocol tells the request's ``Departure`` when the connection is lost: the work, waiting on an
    answer that never comes, is cancelled in its own task (its ``finally`` runs) and the app learns the client
    left; a client that reads its answer leaves nothing cancelled."""
    outcomes: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the body
        forever = scope["path"] == "/forever"

        async def work() -> None:
            try:
                if forever:
                    await outcomes.put(("waiting", False))
                    await asyncio.Event().wait()
                await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
                await send({"type": "http.response.body", "body": b"ok"})
            finally:
                await outcomes.put(("released", False))
        left = await until_disconnect(work(), departure(scope))
        await outcomes.put(("left", left))

    async def main() -> None:
        async with serving(LIMITS, app) as port:
            answer = await exchange(port, b"GET /quick HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert answer.endswith(b"ok")
            assert [await outcomes.get(), await outcomes.get()] == [("released", False), ("left", False)]

            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /forever HTTP/1.1\r\nhost: x\r\n\r\n")
            await writer.drain()
            assert await asyncio.wait_for(outcomes.get(), 5) == ("waiting", False)
            writer.close()
            got = [await asyncio.wait_for(outcomes.get(), 5), await asyncio.wait_for(outcomes.get(), 5)]
            assert got == [("released", False), ("left", True)]
    asyncio.run(main())


class _Recorded:
    """A transport that keeps each write it is asked for, and passes everything on."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport, self._writes = transport, writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def recording(base: type[Any], writes: list[bytes]) -> type[Any]:
    class Recording(base):  # type: ignore[misc]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(_Recorded(transport, writes))
    return Recording


async def streamed(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for event in (b"data: 1\n\n", b"data: 2\n\n"):
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def test_a_sized_answer_is_one_write_and_a_streams_head_goes_first() -> None:
    """A head that declares its length leaves with its body in one write, pipelined answers each in theirs, in
    order; a stream's head (chunked) is written before its first event, never held. The positive control:
    uvicorn's own protocol writes a sized answer's head and body apart."""
    post = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc"
    last = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nab"

    async def writes_of(app: Any, protocol: type[Any], *parts: bytes) -> tuple[list[bytes], bytes]:
        writes: list[bytes] = []
        async with serving(LIMITS, app, recording(protocol, writes)) as port:
            answer = await exchange(port, *parts)
        return writes, answer

    async def main() -> None:
        guarded = protocol_for(LIMITS)
        writes, answer = await writes_of(echo_length, guarded, post + last)
        assert len(writes) == 2 and b"".join(writes) == answer, writes
        assert [w.startswith(b"HTTP/1.1 200") and w.endswith(b"\r\n\r\n" + body) for w, body in
                zip(writes, (b"3", b"2"), strict=True)] == [True, True], writes

        writes, answer = await writes_of(streamed, guarded, last)
        assert writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(b"\r\n\r\n"), writes
        assert b"data: 1" in writes[1] and answer.endswith(b"0\r\n\r\n")

        writes, _ = await writes_of(echo_length, HttpToolsProtocol, last)  # uvicorn's protocol as shipped
        assert len(writes) == 2 and writes[1] == b"2", writes
    asyncio.run(main())
