"""The gateway's own work per request, held to a budget that noise cannot hide.

CPU per request on this machine swings by a quarter run to run, so each change of the last rounds measured
"within noise" while together they cost a fifth. The number of Python function calls a request makes is the same
on every run: this drives one plain and one streamed chat through the pipeline (the lifecycle and ``run``, as a
batch line enters them) over an in-memory transport (tests.fakes.ScriptedClient: the worker's answer one event a
read, as vLLM's tokens arrive) and counts the calls made in the request's own context, tasks it starts included,
with ``sys.setprofile``: not the scraper's, nor any other background task's, nor threads'.

The budgets are ``call_budget.json`` beside this file, allowed 5% over. Raising one is a one-line change whose
commit says what the new calls buy."""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.sink import BufferSink
from tests.fakes import FakeWorker, ScriptedClient, call, chat, completion_json, json_of, running_gateway, vllm_answer

BUDGETS = json.loads((Path(__file__).parent / "call_budget.json").read_text())
MARGIN = 1.05
STREAM_TOKENS = 64
_COUNTING: contextvars.ContextVar[bool] = contextvars.ContextVar("counting", default=False)


async def calls_of(gw: Any, body: dict[str, Any], sink: type[BufferSink] = BufferSink) -> int:
    """Python calls one request makes in its own context (a warm gateway: the same request ran before)."""
    made = 0

    def profiler(frame: FrameType, event: str, arg: object) -> None:
        nonlocal made
        if event == "call" and _COUNTING.get():
            made += 1

    token = _COUNTING.set(True)
    sys.setprofile(profiler)
    try:
        _, answered = await call(gw, body, sink=sink)
    finally:
        sys.setprofile(None)
        _COUNTING.reset(token)
    assert answered.status == 200, answered.body[:300]
    return made


def measure(sink: type[BufferSink] = BufferSink) -> dict[str, int]:
    """Calls of a plain 16-token chat and of a 64-token stream, each measured twice (they must agree)."""
    async def main() -> dict[str, int]:
        async with FakeWorker(json_of(completion_json())) as worker, running_gateway([worker.url]) as gw:
            for pool in gw.upstreams.pools.values():  # the requests' client; the scraper keeps the real worker
                pool.client = ScriptedClient(lambda body: vllm_answer(body, STREAM_TOKENS))  # type: ignore[assignment]
            found = {}
            for kind, body in (("plain", chat(max_tokens=16)), ("stream", chat(stream=True, max_tokens=64))):
                for _ in range(3):  # connections, caches, metric children: every path warm
                    await call(gw, body)
                first, second = await calls_of(gw, body, sink), await calls_of(gw, body, sink)
                assert first == second, f"{kind}: {first} then {second} calls: the count must be deterministic"
                found[kind] = first
            return found
    return asyncio.run(main())


def over_budget(found: dict[str, int]) -> list[str]:
    return [f"{kind}: {made} calls a request, over {BUDGETS[kind]} + 5%" for kind, made in found.items()
            if made > BUDGETS[kind] * MARGIN]


def test_a_request_stays_within_its_call_budget() -> None:
    found = measure()
    assert not over_budget(found), over_budget(found)
    print(f"calls a request: {found} (budgets {BUDGETS})")


class ChattySink(BufferSink):
    """A sink that makes one more (no-op) call for every piece of the answer: what a careless per-chunk step costs."""

    async def send(self, body: bytes, more: bool = False) -> None:
        _noop(body)
        await super().send(body, more)


def _noop(body: bytes) -> None:
    return None


def test_one_more_call_per_chunk_is_caught() -> None:
    """The positive control: a 64-token stream with one added no-op call per chunk passes the budget's margin."""
    found = measure(ChattySink)
    assert [line for line in over_budget(found) if line.startswith("stream")], found

