"""A worker that speaks raw HTTP/1.1 and misbehaves on request (for tests/inprocess/upstream/test_hostile_worker.py and
loadtest/benchmarks/hostile/bytes.py): each chat request's last user message names its
misbehaviour (``mode:<name> mark:<text>``), so one test runs a battery of cases over one pool.

It answers /health and /metrics as a healthy vLLM would, so the gateway keeps it in routing between the cases.
Every answer it means for a request carries that request's ``mark`` in its content; a stray answer carries
``STRAY``, so a test sees at once which request got whose answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import random
import threading
from collections.abc import Iterator

import orjson

MODES = ("ok", "interim", "stray_after", "stray_later", "endless_header", "huge_body", "huge_stream", "trickle",
         "garbage", "no_usage", "gzip")
METRICS = (b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0\n"
           b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")


def completion(mark: str, usage: bool = True) -> bytes:
    body: dict[str, object] = {"id": "c1", "object": "chat.completion", "model": "sim-llama-8b", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": f"answer for {mark}"}, "finish_reason": "stop"}]}
    if usage:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    return orjson.dumps(body)


def embeddings(body: bytes, dimensions: int = 384) -> bytes:
    """An embeddings answer as large as a small engine's can honestly be: one 384-float vector per input."""
    given = orjson.loads(body).get("input")
    count = len(given) if isinstance(given, list) and given and isinstance(given[0], str) else 1
    vector = [random.random() for _ in range(dimensions)]
    return orjson.dumps({"object": "list", "model": "embed", "data": [
        {"object": "embedding", "index": i, "embedding": vector} for i in range(count)],
        "usage": {"prompt_tokens": 4 * count, "total_tokens": 4 * count}})


def http(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status, len(body), extra, body)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def mode_of(body: bytes) -> tuple[str, str]:
    """(mode, mark) named by the request's last message; ("ok", "") when it names none."""
    try:
        text = str(orjson.loads(body)["messages"][-1]["content"])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return "ok", ""
    words = dict(w.split(":", 1) for w in text.split() if ":" in w)
    return words.get("mode", "ok"), words.get("mark", "")


class HostileWorker:
    """``async with HostileWorker() as worker:`` in the test's loop; ``HostileWorker.in_thread()`` for a gateway
    process. ``stray_later`` writes its stray answer right behind the real one, in a write of its own."""

    def __init__(self) -> None:
        self.url = ""
        self.connections = 0
        self.requests = 0
        self.metrics_mode = "ok"  # or endless_header, huge_body: what /metrics answers
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HostileWorker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @classmethod
    @contextlib.contextmanager
    def in_thread(cls) -> Iterator[HostileWorker]:
        worker, ready, loop = cls(), threading.Event(), asyncio.new_event_loop()
        stop: asyncio.Future[None] | None = None

        async def main() -> None:
            nonlocal stop
            async with worker:
                stop = loop.create_future()
                ready.set()
                await stop

        thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
        thread.start()
        ready.wait(10)
        try:
            yield worker
        finally:
            loop.call_soon_threadsafe(lambda: stop is not None and stop.set_result(None))
            thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                                 asyncio.CancelledError):
            while True:
                head, body = await read_request(reader)
                path = head.split(b" ", 2)[1]
                if path == b"/health":
                    writer.write(http(b""))
                elif path == b"/metrics":
                    if self.metrics_mode != "ok":
                        await self._answer(writer, self.metrics_mode, "")
                        break
                    writer.write(http(METRICS))
                elif path == b"/v1/embeddings":
                    self.requests += 1
                    writer.write(http(embeddings(body)))
                else:
                    self.requests += 1
                    if not await self._answer(writer, *mode_of(body)):
                        break
                await writer.drain()
        writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, mode: str, mark: str) -> bool:
        """Write the mode's answer; False when the connection is done with."""
        stray = http(completion("STRAY"))
        if mode == "ok":
            writer.write(http(completion(mark)))
        elif mode == "interim":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * random.randint(1, 2) +
                         b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n")
            await writer.drain()
            writer.write(http(completion(mark)))
        elif mode == "stray_after":
            writer.write(http(completion(mark)) + stray)
        elif mode == "stray_later":
            writer.write(http(completion(mark)))
            writer.write(stray)
        elif mode == "endless_header":
            writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
            await self._forever(writer, b"v" * 65536)
            return False
        elif mode == "huge_body":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1200000000\r\n\r\n")
            await self._forever(writer, b" " * 65536)
            return False
        elif mode == "huge_stream":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            event = b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,' \
                    b'"delta":{"content":"' + b"x" * 4000 + b'"},"finish_reason":null}]}\n\n'
            await self._forever(writer, b"%x\r\n%s\r\n" % (len(event), event))
            return False
        elif mode == "trickle":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n")
            for _ in range(20_000):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)  # the worker's pace: never silent for the read timeout
            return False
        elif mode == "garbage":
            writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
            return False
        elif mode == "no_usage":
            writer.write(http(completion(mark, usage=False)))
        elif mode == "gzip":
            writer.write(http(gzip.compress(completion(mark)), extra=b"content-encoding: gzip\r\n"))
        return True

    @staticmethod
    async def _forever(writer: asyncio.StreamWriter, piece: bytes) -> None:
        """Write ``piece`` until the client hangs up (bounded: 2 GiB at the most)."""
        for _ in range((2 << 30) // len(piece)):
            writer.write(piece)
            await writer.drain()
