"""The workers' connection as one state machine (gateway.transport.http1.State): every step TRANSITIONS allows is
taken by some exchange with a raw-socket worker, every other step is refused (raised under STRICT, as the tests
run; in production the request fails and the connection closes, and the loop goes on), and a streamed event's
read takes no step and makes no more calls than before the states were named."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import Counter
from types import FrameType
from typing import Any

import pytest

from gateway.transport import http1
from gateway.transport.http1 import TRANSITIONS, BadResponse, Caps, Client, ReadTimeout, State, StateError, _Connection
from tests.inprocess.transport.test_http1 import answer, read_request, server

IDLE, HEAD, INTERIM, BODY = State.IDLE, State.HEAD, State.INTERIM, State.BODY
COMPLETE, BROKEN, CLOSED = State.COMPLETE, State.BROKEN, State.CLOSED

ALLOWED = {(here, to) for here, nexts in TRANSITIONS.items() for to in nexts}
REFUSED = sorted(set(itertools.product(State, State)) - ALLOWED, key=lambda step: (step[0].value, step[1].value))


class FakeTransport(asyncio.Transport):
    """A transport that keeps what is written and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def connected() -> tuple[http1.OriginPool, _Connection, FakeTransport]:
    pool = http1.OriginPool("http://127.0.0.1:9", 8, 30.0, None, Caps())
    conn, transport = _Connection(pool), FakeTransport()
    pool.open += 1
    conn.connection_made(transport)
    return pool, conn, transport


def reached(start: State) -> set[State]:
    """The states the table leads to from ``start`` (itself included)."""
    seen, frontier = {start}, [start]
    while frontier:
        for to in TRANSITIONS[frontier.pop()] - seen:
            seen.add(to)
            frontier.append(to)
    return seen


def test_the_table_names_every_state_and_each_leads_to_closed() -> None:
    assert set(TRANSITIONS) == set(State)
    assert TRANSITIONS[CLOSED] == frozenset(), "closed is the end"
    assert reached(IDLE) == set(State), "every state is reached from a fresh connection"
    assert all(CLOSED in reached(state) for state in State), "and every one can close"


def test_every_allowed_step_is_taken_by_some_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker, one behaviour per request body: a plain answer kept alive, an interim answer before it, a 101
    nobody asked for, a bad chunk, a stray answer in the same write, ``connection: close``, a stream closed early,
    silence past the read timeout; then the client closes its idle connections."""
    taken: set[tuple[State, State]] = set()
    move = _Connection._move

    def recorded(conn: _Connection, to: State) -> bool:
        here = conn.state
        moved = move(conn, to)
        if moved:
            taken.add((here, to))
        return moved

    monkeypatch.setattr(_Connection, "_move", recorded)

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            if body == b"interim":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(body))
            elif body == b"upgrade":
                writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
            elif body == b"bad chunk":
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
            elif body == b"stray":
                writer.write(answer(body) + answer(b"STRAY"))
            elif body == b"close":
                writer.write(answer(body, b"connection: close\r\n"))
            elif body == b"stream":
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            elif body != b"silent":
                writer.write(answer(body))
            await writer.drain()

    async def main() -> None:
        async with server(worker) as (url, _):
            c = Client(8, 30.0, 2.0, 0.3, caps=Caps())

            async def ask(body: bytes) -> bytes:
                reply = await c.request(b"POST", url, "/", body)
                got = await reply.read()
                reply.release()
                return got

            assert await ask(b"plain") == b"plain"
            assert await ask(b"interim") == b"interim"
            with pytest.raises(BadResponse):
                await ask(b"upgrade")
            with pytest.raises(BadResponse):
                await ask(b"bad chunk")
            assert await ask(b"stray") == b"stray"
            assert await ask(b"close") == b"close"
            reply = await c.request(b"POST", url, "/", b"stream")
            assert await reply.readany() == b"first"
            reply.close()
            with pytest.raises(ReadTimeout):
                await ask(b"silent")
            assert await ask(b"plain") == b"plain"
            assert c.origins[url].idle
            c.close()
            assert c.origins[url].open == 0
        # the stray answer again, fed by hand: one read for certain, whatever the sockets do with the write above
        _, conn, _ = await connected()
        head = conn.send(b"POST / HTTP/1.1\r\n\r\n", 5.0)
        conn.data_received(answer(b"mine") + answer(b"STRAY"))
        assert await (await head).read() == b"mine"
    asyncio.run(main())
    assert taken == ALLOWED, f"never taken: {sorted((a.name, b.name) for a, b in ALLOWED - taken)}"


@pytest.mark.parametrize(("here", "to"), REFUSED, ids=[f"{a.name}->{b.name}" for a, b in REFUSED])
def test_a_step_the_table_does_not_allow_is_refused(here: State, to: State, monkeypatch: pytest.MonkeyPatch) -> None:
    """Strict (the tests): it raises. In production: False, the request under way failed with the same error,
    the connection closed and out of its pool (once), nothing raised into the loop."""
    async def main(strict: bool) -> None:
        monkeypatch.setattr(http1, "STRICT", strict)
        pool, conn, transport = await connected()
        head = conn.send(b"POST / HTTP/1.1\r\n\r\n", 5.0)
        response = conn.response
        assert response is not None
        if here is CLOSED:
            conn.drop()
        conn.state = here  # the one place a state is set by hand: to stand where the step starts
        open_before = pool.open
        if strict:
            with pytest.raises(StateError, match=f"from {here.name} to {to.name}"):
                conn._move(to)
        else:
            assert conn._move(to) is False
        assert conn.state is CLOSED and transport.closed
        assert pool.open == open_before - (here is not CLOSED), "out of its pool once"
        if here is not CLOSED:
            with pytest.raises(StateError):
                head.result()
            with pytest.raises(StateError):
                await response.read()
        assert conn.timer is None
    for strict in (True, False):
        asyncio.run(main(strict))


def test_a_refused_step_fails_its_request_and_the_next_one_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """In production a refused step inside a read (here: a table without HEAD -> BODY) ends that request with a
    StateError, not the loop; with the table whole again the next request is served on a new connection."""
    monkeypatch.setattr(http1, "STRICT", False)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            writer.write(answer(body))
            await writer.drain()

    async def main() -> None:
        async with server(echo) as (url, connections):
            c = Client(8, 30.0, 2.0, 5.0)
            with monkeypatch.context() as m:
                m.setitem(TRANSITIONS, HEAD, TRANSITIONS[HEAD] - {BODY})
                with pytest.raises(StateError, match="from HEAD to BODY"):
                    await c.request(b"POST", url, "/", b"one")
            assert c.origins[url].open == 0
            reply = await c.request(b"POST", url, "/", b"two")
            assert await reply.read() == b"two"
            reply.release()
            c.close()
        assert len(connections) == 2
    asyncio.run(main())


def test_a_streamed_event_takes_no_step_and_no_more_calls() -> None:
    """The data path of a stream (data_received -> on_body -> Response._feed, then Response.readany) makes these
    four calls of this module an event, and the state moves only at the send, the head, the end and the
    release."""
    event = b'data: {"choices": [{"delta": {"content": " word"}}]}\n\n'
    chunk = b"%x\r\n%s\r\n" % (len(event), event)
    calls: Counter[str] = Counter()

    def profiler(frame: FrameType, what: str, arg: object) -> None:
        if what == "call" and frame.f_code.co_filename == http1.__file__:
            calls[frame.f_code.co_qualname] += 1

    async def main() -> None:
        pool, conn, _ = await connected()
        sys.setprofile(profiler)
        try:
            head = conn.send(b"POST / HTTP/1.1\r\n\r\n", 5.0)
            conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            reply = await head
        finally:
            sys.setprofile(None)
        assert calls["_Connection._move"] == 2 and conn.state is BODY, "the send and the head"
        for _ in range(3):
            conn.data_received(chunk)
            assert await reply.readany() == event
        calls.clear()
        sys.setprofile(profiler)
        try:
            for _ in range(10):
                conn.data_received(chunk)
                assert await reply.readany() == event
        finally:
            sys.setprofile(None)
        assert calls == {"_Connection.data_received": 10, "_Connection.on_body": 10, "Response._feed": 10,
                         "Response.readany": 10}
        calls.clear()
        sys.setprofile(profiler)
        try:
            conn.data_received(b"0\r\n\r\n")
            assert await reply.readany() == b""
            reply.release()
        finally:
            sys.setprofile(None)
        assert calls["_Connection._move"] == 2 and conn.state is IDLE and pool.idle[-1] is conn, "the end, the release"
    asyncio.run(main())


def test_interim_heads_and_a_broken_answer_step_as_the_table_says() -> None:
    """Fed by hand, in one read each: two interim answers then the final one (HEAD, INTERIM, HEAD, INTERIM, HEAD,
    BODY, COMPLETE), and an answer with a stray message behind it in the same read (COMPLETE, BROKEN, CLOSED)."""
    async def main() -> None:
        _, conn, transport = await connected()
        steps: list[State] = []
        move = conn._move

        def recorded(to: State) -> bool:
            steps.append(to)
            return move(to)

        conn._move = recorded  # type: ignore[method-assign]
        head = conn.send(b"POST / HTTP/1.1\r\n\r\n", 5.0)
        conn.data_received(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" +
                           answer(b"ok"))
        reply = await head
        assert reply.status == 200 and reply.header(b"link") is None and await reply.read() == b"ok"
        assert steps == [HEAD, INTERIM, HEAD, INTERIM, HEAD, BODY, COMPLETE]
        reply.release()
        steps.clear()
        head = conn.send(b"POST / HTTP/1.1\r\n\r\n", 5.0)
        conn.data_received(answer(b"mine") + answer(b"STRAY"))
        reply = await head
        assert await reply.read() == b"mine", "the answer itself ended well"
        assert steps == [HEAD, BODY, COMPLETE, BROKEN, CLOSED] and transport.closed
        assert isinstance(conn.fault, BadResponse)
    asyncio.run(main())
