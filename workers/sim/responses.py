"""The OpenAI Responses API as vLLM serves it, over the simulated engine: create (streamed as typed events, or
whole), retrieve by id, and ``previous_response_id`` continuing a conversation that only this server remembers
(vLLM keeps a response's state in the memory of the server that made it: another server answers 404)."""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from workers.sim.answers import answer_until_gone
from workers.sim.engine import Sequence

if TYPE_CHECKING:
    from workers.sim.server import SimServer

Scope = dict[str, Any]
STORED = 10_000  # responses remembered per server (the oldest forgotten first)


class BadInput(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


class Responses:
    """/v1/responses for one simulated server: what it made, and each response's conversation so far."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.stored: collections.OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = \
            collections.OrderedDict()

    def messages(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The conversation a request continues: the previous response's, then its instructions and input."""
        history: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self.stored:
                raise BadInput(f"Response with id '{previous}' not found.", 404, "previous_response_id")
            history = list(self.stored[previous][1])
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            history = [{"role": "system", "content": instructions}, *[m for m in history if m["role"] != "system"]]
        value = body.get("input")
        if isinstance(value, str) and value:
            return [*history, {"role": "user", "content": value}]
        if isinstance(value, list) and value:
            for item in value:
                if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                    raise BadInput("Each input item must be a message with a role.", param="input")
                content = item.get("content")
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                history.append({"role": item["role"], "content": content if isinstance(content, str) else ""})
            return history
        raise BadInput("'input' must be a non-empty string or array of input items.", param="input")

    def remember(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self.stored[response["id"]] = (response, conversation)
        while len(self.stored) > STORED:
            self.stored.popitem(last=False)

    async def retrieve(self, request: Request) -> Response:
        found = self.stored.get(request.path_params["response_id"])
        if found is None:
            return _error(f"Response with id '{request.path_params['response_id']}' not found.", 404, None)
        return Response(orjson.dumps(found[0]), media_type="application/json")


def response_object(rid: str, model: str, created: int, seq: Sequence, body: dict[str, Any], status: str,
                    text: str | None) -> dict[str, Any]:
    """A Response object as the OpenAI API defines it (``text`` None: no output yet)."""
    output = [] if text is None else [{
        "id": f"msg_{rid[5:]}", "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}]
    completion = len(seq.output)
    usage = None if text is None else {
        "input_tokens": seq.prompt_tokens, "input_tokens_details": {"cached_tokens": seq.cached_tokens},
        "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": seq.prompt_tokens + completion}
    return {"id": rid, "object": "response", "created_at": created, "model": model, "status": status,
            "output": output, "usage": usage, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"),
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None, "metadata": {}, "store": body.get("store", True)}


class ResponseGeneration:
    """The ASGI response for one Responses request: typed SSE events as tokens come, or the object at the end."""

    def __init__(self, server: SimServer, responses: Responses, seq: Sequence, body: dict[str, Any],
                 conversation: list[dict[str, Any]]) -> None:
        self.server, self.responses, self.seq, self.body = server, responses, seq, body
        self.conversation = conversation
        self.id = "resp_" + seq.request_id
        self.created = int(time.time())
        self.number = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        await answer_until_gone(self.server.engine, [self.seq], self._stream(send) if self.body.get("stream")
                                else self._answer(send), receive)

    def _final(self) -> dict[str, Any]:
        seq = self.seq
        status = "incomplete" if seq.finish_reason == "length" else "completed"  # as OpenAI: cut at the limit
        final = response_object(self.id, self.server.model, self.created, seq, self.body, status, seq.text)
        if self.body.get("store", True):
            self.responses.remember(final, [*self.conversation, {"role": "assistant", "content": seq.text}])
        return final

    async def _answer(self, send: Any) -> None:
        seq = self.seq
        while seq.finish_reason is None:
            seq.wake.clear()
            await seq.wake.wait()
        if seq.finish_reason == "abort":
            return
        body = orjson.dumps(self._final())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = orjson.dumps({"type": kind, "sequence_number": self.number, **fields})
        self.number += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    async def _stream(self, send: Any) -> None:
        seq, model = self.seq, self.server.model
        item = {"id": f"msg_{self.id[5:]}", "type": "message", "status": "in_progress", "role": "assistant",
                "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        start = response_object(self.id, model, self.created, seq, self.body, "in_progress", None)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "more_body": True, "body": b"".join([
            self._event("response.created", response=start), self._event("response.in_progress", response=start),
            self._event("response.output_item.added", output_index=0, item=item),
            self._event("response.content_part.added", part=part, **where)])})
        sent = 0
        while True:
            seq.wake.clear()
            if seq.finish_reason is None and len(seq.output) == sent:
                await seq.wake.wait()
            if seq.finish_reason == "abort":
                return
            new = seq.output[sent:]
            sent += len(new)
            parts = [self._event("response.output_text.delta", delta=piece, logprobs=[], **where) for piece in new]
            done = seq.finish_reason is not None
            if done:
                text = seq.text
                final = self._final()
                parts += [self._event("response.output_text.done", text=text, logprobs=[], **where),
                          self._event("response.content_part.done", part={**part, "text": text}, **where),
                          self._event("response.output_item.done", output_index=0, item=final["output"][0]),
                          self._event("response.completed" if final["status"] == "completed"
                                      else "response.incomplete", response=final)]
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": not done})
            if done:
                return


def _error(message: str, status: int, param: str | None) -> Response:
    from workers.sim.server import error_response

    return error_response(message, status, param)


def chat_body(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request a Responses request runs as on the engine."""
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "seed", "ignore_eos", "min_tokens", "priority", "cache_salt"):
        if body.get(name) is not None:
            out[name] = body[name]
    return out

