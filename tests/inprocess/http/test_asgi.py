"""The ASGI edge's own rules: an ambiguous header is refused, a body is bounded as it arrives, a response starts
once, and a client that leaves cancels the request's work in its own task (so its ``finally`` blocks run)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import ClientGone, InvalidRequest, TooLarge
from gateway.http.asgi import AsgiSink, Departure, read_body, request_headers, until_disconnect


def scripted(*messages: dict[str, Any]) -> Any:
    """An ASGI ``receive`` that hands out ``messages`` in order, then waits forever (a client still there)."""
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")
    return receive


def body(chunk: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": chunk, "more_body": more}


def test_a_header_that_would_be_ambiguous_twice_is_refused_and_others_may_repeat() -> None:
    with pytest.raises(InvalidRequest) as caught:
        request_headers({"headers": [(b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")]})
    assert caught.value.code == "duplicate_header" and "authorization" in caught.value.message
    repeated = request_headers({"headers": [(b"accept", b"a"), (b"accept", b"b"), (b"x-request-id", b"r1")]})
    assert repeated[b"x-request-id"] == b"r1"


def test_a_body_declared_too_large_is_refused_before_a_byte_is_read() -> None:
    receive = scripted(body(b"never read"))
    with pytest.raises(TooLarge):
        asyncio.run(read_body(receive, {b"content-length": b"2000"}, 1000))


def test_a_body_is_counted_as_it_arrives_whatever_it_declared() -> None:
    assert asyncio.run(read_body(scripted(body(b"ab", True), body(b"cd")), {}, 4)) == b"abcd"
    with pytest.raises(TooLarge):
        asyncio.run(read_body(scripted(body(b"abc", True), body(b"de")), {b"content-length": b"3"}, 4))


def test_a_client_gone_while_its_body_is_read_ends_the_request() -> None:
    with pytest.raises(ClientGone):
        asyncio.run(read_body(scripted(body(b"ab", True), {"type": "http.disconnect"}), {}, 100))


def test_the_sink_starts_once_and_a_gone_client_does_not_raise() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message["body"] == b"late":
            raise ConnectionResetError("gone")

    async def main() -> None:
        sink = AsgiSink(send)
        await sink.start(200, [(b"content-type", b"text/plain")])
        with pytest.raises(RuntimeError):
            await sink.start(500, [])
        await sink.send(b"part", more=True)
        assert sink.open
        await sink.send(b"late")  # the client is gone: swallowed, the disconnect watch ends the request
        assert not sink.open and sink.status == 200
    asyncio.run(main())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]


def test_a_client_that_leaves_cancels_the_work_which_cleans_up_after_itself() -> None:
    released: list[str] = []

    async def work(forever: asyncio.Event) -> None:
        try:
            await forever.wait()
        finally:
            released.append("slot")

    async def main() -> bool:
        gone = Departure()
        asyncio.get_running_loop().call_soon(gone.leave)  # the server's connection_lost
        return await until_disconnect(work(asyncio.Event()), gone)
    assert asyncio.run(main()) is True and released == ["slot"]


def test_a_client_gone_before_the_work_starts_never_runs_it() -> None:
    ran: list[str] = []

    async def work() -> None:
        ran.append("work")

    async def main() -> bool:
        gone = Departure()
        gone.leave()
        return await until_disconnect(work(), gone)
    assert asyncio.run(main()) is True and ran == []


def test_work_that_finishes_first_reports_the_client_stayed() -> None:
    async def work() -> None:
        await asyncio.sleep(0)

    async def main() -> tuple[bool, bool]:
        gone = Departure()
        stayed = await until_disconnect(work(), gone)
        gone.leave()  # the connection closes after the response: nothing is running to cancel
        return stayed, gone.task is None
    assert asyncio.run(main()) == (False, True)
    assert asyncio.run(until_disconnect(work(), None)) is False, "an app called directly runs its work to the end"


def test_a_cancellation_that_is_not_the_clients_goes_on() -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None

        async def work() -> None:
            task.cancel()  # the server shutting down, not the client leaving
            await asyncio.Event().wait()
        await until_disconnect(work(), Departure())
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
