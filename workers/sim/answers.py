"""The simulated worker's chat and completions answers, field for field as vLLM 0.32 writes them: whole or as SSE
chunks, for every choice of a request (``n`` per prompt, and each prompt of a completions list), with tool calls,
structured content and logprobs where asked for.

The plain chunk (one content piece, no logprobs) is built from bytes: it is the load generator's hot path. The
rest goes through orjson on dicts; the structure is the engine's script's (structured.py). Memory holds a part of
an answer, not the answer: a stream sends BATCH pieces at a time, a whole answer larger than WHOLE_BYTES goes out
in parts as it is written (its logprobs a batch of tokens at a time), and the event loop is let go between them,
so n answers with 20 logprobs a token cost what a part costs and /health answers meanwhile."""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson

from workers.sim import tokenizer
from workers.sim.engine import Engine, Sequence
from workers.sim.logprobs import Logprobs
from workers.sim.structured import Script

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

VLLM_VERSION = "0.32.0"
BATCH = 256  # tokens' logprob entries serialised at a time, pieces streamed in one send
WHOLE_BYTES = 1 << 20  # a whole answer up to this size goes out as one body with its length; a larger one in parts
YIELD_BYTES = 1 << 16  # ... of about this size, the event loop let go between them


def fingerprint(model: str) -> str:
    """vLLM's system_fingerprint: its version and a hash of its configuration (here, of the model's name)."""
    return f"vllm-{VLLM_VERSION}-{zlib.crc32(model.encode()):08x}"


@dataclass
class Prompt:
    """One prompt of a request: the text the engine sees, its token count, and the ids a client gave."""

    text: str
    tokens: int
    ids: list[int] | None = None


@dataclass(eq=False)
class Choice:
    """One answer of a request: its sequence on the engine and how it is written out."""

    index: int
    seq: Sequence
    prompt: int = 0
    script: Script | None = None
    logprobs: Logprobs | None = None
    sent: int = 0  # pieces streamed so far
    offset: int = 0  # completions: the text_offset of the next token
    started: bool = False  # completions with echo: the prompt went out

    @property
    def finish(self) -> str | None:
        reason = self.seq.finish_reason
        if reason == "stop" and self.script is not None and self.script.ended(len(self.seq.output)):
            return self.script.finish
        return reason


@dataclass
class Ask:
    """What the request asked of the answer's form."""

    chat: bool
    stream: bool
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage on every chunk
    logprobs: int | None = None  # chat: top_logprobs (0 with logprobs alone); completions: logprobs
    echo: bool = False


class Generation:
    """The ASGI response for one request: streams chunks or answers once, and aborts on disconnect."""

    def __init__(self, server: Any, ask: Ask, prompts: list[Prompt], choices: list[Choice]) -> None:
        self.server = server
        self.ask = ask
        self.prompts = prompts
        self.choices = choices
        self.seqs = [c.seq for c in choices]
        self.id = ("chatcmpl-" if ask.chat else "cmpl-") + choices[0].seq.request_id
        self.created = int(time.time())
        self.fingerprint = fingerprint(server.model)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        produce = self._stream(send) if self.ask.stream else self._answer(send)
        await answer_until_gone(self.server.engine, self.seqs, produce, receive)

    # -- whole ----------------------------------------------------------------------------------------------

    async def _answer(self, send: Send) -> None:
        """The whole answer once every choice has ended: one body with its length when it is small, else sent
        in parts as it is written (chunked), so memory holds a part, not the answer (n answers with 20 logprobs
        a token are hundreds of bytes a token); the loop is let go between parts."""
        wake = self.seqs[0].wake
        while any(s.finish_reason is None for s in self.seqs):
            wake.clear()
            if any(s.finish_reason is None for s in self.seqs):
                await wake.wait()
        if any(s.finish_reason == "abort" for s in self.seqs):
            return
        parts = self._whole_parts()
        held: list[bytes] = []
        size = since_yield = 0
        for part in parts:
            held.append(part)
            size += len(part)
            since_yield += len(part)
            if since_yield >= YIELD_BYTES:
                since_yield = 0
                await asyncio.sleep(0)
            if size >= WHOLE_BYTES:
                break
        else:
            data = b"".join(held)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        for part in parts:
            held.append(part)
            size += len(part)
            if size >= YIELD_BYTES:
                await send({"type": "http.response.body", "body": b"".join(held), "more_body": True})
                held, size = [], 0
                await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"".join(held)})

    def _whole_parts(self) -> Iterator[bytes]:
        """The whole answer's JSON in parts, as ``orjson.dumps`` of it would write it, made as they are read."""
        head = {"id": self.id, "object": "chat.completion" if self.ask.chat else "text_completion",
                "created": self.created, "model": self.server.model}
        yield orjson.dumps(head)[:-1] + b',"choices":['
        for i, choice in enumerate(self.choices):
            if i:
                yield b","
            yield from (self._whole_chat(choice) if self.ask.chat else self._whole_completion(choice))
        tail: dict[str, Any] = {"service_tier": None, "system_fingerprint": self.fingerprint,
                                "usage": self._usage(final=False)}
        if self.ask.chat:
            tail.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        tail.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        yield b"]," + orjson.dumps(tail)[1:]

    def _whole_chat(self, choice: Choice) -> Iterator[bytes]:
        seq = choice.seq
        content, calls = (choice.script.message(len(seq.output)) if choice.script is not None
                          else (seq.text, []))
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                                   "audio": None, "function_call": None}
        if calls:
            message["tool_calls"] = calls
        message["reasoning"] = None
        end = orjson.dumps({"finish_reason": choice.finish, "stop_reason": None, "token_ids": None,
                            "routed_experts": None})[1:]
        start = orjson.dumps({"index": choice.index, "message": message})[:-1]
        if choice.logprobs is None:
            yield start + b',"logprobs":null,' + end
            return
        yield start + b',"logprobs":{"content":['
        logprobs = choice.logprobs
        for at in range(0, len(seq.output), BATCH):
            yield (b"," if at else b"") + b",".join(orjson.dumps(logprobs.chat(piece))
                                                    for piece in seq.output[at:at + BATCH])
        yield b"]}," + end

    def _whole_completion(self, choice: Choice) -> Iterator[bytes]:
        """A completions choice; its ``logprobs`` lists (and an echo's ``prompt_logprobs``) in passes over the
        tokens, each list a batch at a time (the values are the same on every pass: ``Logprobs.fresh``)."""
        seq = choice.seq
        prompt = self.prompts[choice.prompt]
        text = (prompt.text if self.ask.echo else "") + seq.text
        end: dict[str, Any] = {"finish_reason": choice.finish, "stop_reason": None, "token_ids": None}
        start = orjson.dumps({"index": choice.index, "text": text})[:-1]
        if choice.logprobs is None:
            end.update(prompt_logprobs=None, prompt_token_ids=None, routed_experts=None)
            yield start + b',"logprobs":null,' + orjson.dumps(end)[1:]
            return
        echoed = tokenizer.pieces(prompt.text) if self.ask.echo else []
        tokens = echoed + seq.output
        offsets, offset = [], 0
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        values = [value for value, _ in choice.logprobs.fresh().steps(tokens, self.ask.echo)]
        yield start + b',"logprobs":{"text_offset":' + orjson.dumps(offsets) + b',"token_logprobs":' \
            + orjson.dumps(values) + b',"tokens":' + orjson.dumps(tokens) + b',"top_logprobs":['
        yield from _batched(choice.logprobs.fresh().steps(tokens, self.ask.echo), lambda step: step[1])
        yield b"]}," + orjson.dumps(end)[1:-1] + b',"prompt_logprobs":'
        if echoed:
            yield b"["
            steps = choice.logprobs.fresh().steps(echoed, True)
            yield from _batched(steps, lambda step: _prompt_entry(step[1]))
            yield b"]"
        else:
            yield b"null"
        yield b',"prompt_token_ids":null,"routed_experts":null}'

    def _usage(self, final: bool) -> dict[str, Any]:
        """The request's usage: every prompt once (n answers share theirs), every answer's tokens."""
        prompt = sum(p.tokens for p in self.prompts)
        completion = sum(len(s.output) for s in self.seqs)
        cached = sum(c.seq.cached_tokens for c in self.choices if c.index % self._per_prompt == 0)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                 "completion_tokens": completion}
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        elif not final:
            usage["prompt_tokens_details"] = None
        if not final:
            usage["completion_tokens_details"] = None
        return usage

    @property
    def _per_prompt(self) -> int:
        return len(self.choices) // len(self.prompts)

    # -- streamed --------------------------------------------------------------------------------------------

    async def _stream(self, send: Send) -> None:
        faults = self.server.faults
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache")]})
        head = orjson.dumps({"id": self.id, "object": "chat.completion.chunk" if self.ask.chat
                             else "text_completion", "created": self.created, "model": self.server.model})[:-1]
        wake = self.seqs[0].wake
        opened = not self.ask.chat  # like vLLM, the chat role chunks go out with the first token, not before it
        sent = 0
        while True:
            wake.clear()
            if not any(c.sent < len(c.seq.output) for c in self.choices) and \
                    any(s.finish_reason is None for s in self.seqs):
                await wake.wait()
            if any(s.finish_reason == "abort" for s in self.seqs):
                return
            parts: list[bytes] = []
            if not opened:
                parts += [self._role_chunk(head, c) for c in self.choices]
                opened = True
            room = BATCH  # pieces this send takes; a client that reads slowly has the rest sent after it
            for choice in self.choices:
                if room <= 0:
                    break
                written = len(choice.seq.output)
                new = choice.seq.output[choice.sent:choice.sent + room]
                done = choice.seq.finish_reason is not None and choice.sent + len(new) == written
                for i, piece in enumerate(new):
                    last = done and i == len(new) - 1
                    chunk = self._chunk(head, choice, piece, choice.sent + i, last)
                    if chunk:
                        parts.append(chunk)
                choice.sent += len(new)
                sent += len(new)
                room -= len(new)
            if faults.drop_after is not None and sent >= faults.drop_after:
                raise ConnectionAbortedError("injected: connection dropped mid-stream")
            behind = any(c.sent < len(c.seq.output) for c in self.choices)
            finished = not behind and all(s.finish_reason is not None for s in self.seqs)
            if finished and self.ask.include_usage:
                parts.append(b"data: " + head + b',"choices":[],"usage":' + orjson.dumps(self._usage(final=True))
                             + b',"system_fingerprint":' + orjson.dumps(self.fingerprint) + b"}\n\n")
            if finished:
                parts.append(b"data: [DONE]\n\n")
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": not finished})
            if finished:
                return
            if behind:
                await asyncio.sleep(0)  # let the loop go between sends of a backlog
            if faults.hang_after is not None and sent >= faults.hang_after:
                await asyncio.Event().wait()  # until the client leaves

    def _role_chunk(self, head: bytes, choice: Choice) -> bytes:
        return (b"data: " + head + b',"choices":[{"index":' + str(choice.index).encode()
                + b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
                + self._chunk_usage(choice, 0) + b',"prompt_token_ids":null,"prompt_text":null}\n\n')

    def _chunk(self, head: bytes, choice: Choice, piece: str, position: int, last: bool) -> bytes | None:
        """The chunk for one written piece (None: a piece of tool-call syntax, which vLLM holds back)."""
        reason = choice.finish if last else None
        if reason:
            tail = b',"finish_reason":"' + reason.encode() + b'","stop_reason":null'
        else:
            tail = b',"finish_reason":null' if self.ask.chat else b',"finish_reason":null,"stop_reason":null'
        usage = self._chunk_usage(choice, position + 1)
        if last and not self.ask.include_usage:
            usage += b',"system_fingerprint":' + orjson.dumps(self.fingerprint)
        index = str(choice.index).encode()
        if not self.ask.chat:
            text, tokens, ids = piece, [piece], None
            if self.ask.echo and not choice.started:
                prompt = self.prompts[choice.prompt]
                text, ids = prompt.text + piece, prompt.ids or tokenizer.token_ids(prompt.text)
                tokens = [*tokenizer.pieces(prompt.text), piece]
            logprobs = b"null"
            if choice.logprobs is not None:
                logprobs = orjson.dumps(choice.logprobs.completion(tokens, choice.offset,
                                                                   first_unscored=not choice.started and
                                                                   self.ask.echo))
            choice.offset += len(text)
            choice.started = True
            return (b"data: " + head + b',"choices":[{"index":' + index + b',"text":' + orjson.dumps(text)
                    + b',"logprobs":' + logprobs + tail + b',"prompt_token_ids":' + orjson.dumps(ids)
                    + b',"token_ids":null}]' + usage + b"}\n\n")
        made = choice.script.delta(position) if choice.script is not None else None
        if choice.script is None:
            delta = b'{"content":' + orjson.dumps(piece) + b"}"
        elif made is not None:
            delta = orjson.dumps(made)
        elif reason or choice.logprobs is not None:
            delta = b"{}"
        else:
            return None
        logprobs = b"null"
        if choice.logprobs is not None:
            logprobs = orjson.dumps({"content": [choice.logprobs.chat(piece)]})
        return (b"data: " + head + b',"choices":[{"index":' + index + b',"delta":' + delta
                + b',"logprobs":' + logprobs + tail + b',"token_ids":null}]' + usage + b"}\n\n")

    def _chunk_usage(self, choice: Choice, completion: int) -> bytes:
        """With continuous usage, every chunk carries its prompt's tokens and its answer's tokens so far."""
        if not self.ask.continuous_usage:
            return b""
        prompt = self.prompts[choice.prompt].tokens
        details = b',"completion_tokens_details":null}' if self.ask.chat else b"}"
        return (b',"usage":{"prompt_tokens":' + str(prompt).encode() + b',"total_tokens":'
                + str(prompt + completion).encode() + b',"completion_tokens":' + str(completion).encode() + details)


def _prompt_entry(top: dict[str, float] | None) -> dict[str, Any] | None:
    """One token's entry of vLLM's ``prompt_logprobs`` of an echoed prompt (None for the first): its id and each
    alternative's, with the value, rank and text (the same values as the choice's logprobs)."""
    if top is None:
        return None
    ranked = sorted(top.items(), key=lambda item: -item[1])
    return {str((tokenizer.token_ids(token) or [0])[0]): {"logprob": value, "rank": rank, "decoded_token": token}
            for rank, (token, value) in enumerate(ranked, 1)}


def _batched(items: Iterable[Any], entry: Callable[[Any], Any]) -> Iterator[bytes]:
    """A JSON list's items (``entry`` of each), comma-separated, BATCH a part."""
    first = True
    for batch in _batches(items):
        yield (b"" if first else b",") + b",".join(orjson.dumps(entry(item)) for item in batch)
        first = False


def _batches(items: Iterable[Any]) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, BATCH)):
        yield batch


async def answer_until_gone(engine: Engine, seqs: list[Sequence], produce: Coroutine[Any, Any, None],
                            receive: Receive) -> None:
    """Run one request's answer until it ends or the client leaves; a sequence left unfinished is aborted."""
    answering = asyncio.ensure_future(produce)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait((answering, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not answering.done():
            answering.cancel()
        for seq in seqs:
            if seq.finish_reason is None:
                engine.abort(seq)
    if answering.done() and not answering.cancelled():
        failure = answering.exception()
        if failure is not None:
            raise failure


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
