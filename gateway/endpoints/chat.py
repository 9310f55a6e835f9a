"""POST /v1/chat/completions: messages in, a message out."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.endpoints.checks import bad, parts
from gateway.endpoints.generation import Asked, Generation, norm, validate_sampling
from gateway.policy.schema import CachePolicy

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_SYSTEM = ("system", "developer")


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


class Chat(Generation):
    __slots__ = ()
    answer_object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def validate(self, body: dict[str, Any]) -> str:
        model = validate_sampling(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "'messages' must be a non-empty array of message objects.")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise bad(f"messages[{i}]", f"messages[{i}] must be an object.")
            role = message.get("role")
            if role not in _ROLES:
                raise bad(f"messages[{i}].role", f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}.")
            content = message.get("content")
            if content is None:
                if role != "assistant" or not message.get("tool_calls"):
                    raise bad(f"messages[{i}].content", f"messages[{i}].content is required.")
            elif isinstance(content, list):
                parts(content, f"messages[{i}].content")
            elif not isinstance(content, str):
                raise bad(f"messages[{i}].content", f"messages[{i}].content must be a string or an array of parts.")
        return model

    def asked(self, body: dict[str, Any], spec: CachePolicy) -> Asked | str:
        """The last user message is the question (or all of them, ``lookup_text: all_user``); a conversation is
        one only if it ends on the user, and with ``multi_turn`` off only if it is the first question."""
        messages = body["messages"]
        system = [norm(_text(m.get("content"))) for m in messages if m.get("role") in _SYSTEM]
        turns = [m for m in messages if m.get("role") not in _SYSTEM]
        users = [m for m in turns if m.get("role") == "user"]
        if not users or turns[-1].get("role") != "user":
            return "not_a_question"
        if len(users) > 1 and not spec.multi_turn:
            return "multi_turn"
        if spec.lookup_text == "last_user":
            text = norm(_text(users[-1].get("content")))
        else:
            text = norm(" ".join(_text(m.get("content")) for m in users))
        history = [(m.get("role"), norm(_text(m.get("content")))) for m in turns]
        return system, text, history, len(turns) > 1

    def asking(self, body: dict[str, Any], question: str, spec: CachePolicy) -> dict[str, Any] | None:
        if spec.lookup_text != "last_user":  # the question is every user turn at once
            return None
        messages = list(body["messages"])
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), None)
        if last is None:
            return None
        messages[last] = {**messages[last], "content": question}
        return {**body, "messages": messages}

    def text_of(self, choice: dict[str, Any]) -> object:
        message = choice.get("message") or {}
        return None if message.get("tool_calls") else message.get("content")

    def piece_of(self, choice: dict[str, Any]) -> object:
        return (choice.get("delta") or {}).get("content")

    def choice(self, answer: str, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "message": {"role": "assistant", "content": answer}, "logprobs": None,
                "finish_reason": finish_reason}

    def chunk_choice(self, first: bool, piece: str, reason: bytes) -> bytes:
        delta = {"role": "assistant", "content": piece} if first else {"content": piece}
        return b'{"index":0,"delta":' + orjson.dumps(delta) + b',"logprobs":null,"finish_reason":' + reason + b"}"


CHAT = Chat("chat", "/v1/chat/completions")
