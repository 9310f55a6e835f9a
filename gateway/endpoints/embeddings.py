"""POST /v1/embeddings: inputs in, vectors out; nothing generated, nothing streamed."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.endpoints.base import Answer, Endpoint, Question
from gateway.endpoints.checks import bad, echo, integer, model_of
from gateway.policy.schema import CachePolicy

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the inputs of one embeddings request
_ENCODINGS = frozenset({"float", "base64"})
_EMBEDDING_PARAMS = ("encoding_format", "dimensions", "truncate_prompt_tokens", "normalize")


def embedding_inputs(body: dict[str, Any]) -> int:
    """How many inputs an embeddings body holds; 0 when ``input`` is not one of its shapes."""
    value = body.get("input")
    if isinstance(value, str):
        return 1 if value else 0
    if not isinstance(value, list) or not value:
        return 0
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return 1
    if all(isinstance(v, str) and v for v in value) or all(
            isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
            for v in value):
        return len(value)
    return 0


class Embeddings(Endpoint):
    __slots__ = ()

    def validate(self, body: dict[str, Any]) -> str:
        """``input`` is a string, an array of strings, an array of token ids or an array of such arrays (each
        non-empty), at most MAX_EMBEDDING_INPUTS of them."""
        model = model_of(body)
        inputs = embedding_inputs(body)
        if inputs == 0:
            raise bad("input", "'input' must be a non-empty string, array of strings, array of token ids, or array "
                               "of token id arrays.")
        if inputs > MAX_EMBEDDING_INPUTS:
            raise bad("input", f"'input' may hold at most {MAX_EMBEDDING_INPUTS} items.")
        encoding = body.get("encoding_format")
        if encoding is not None and encoding not in _ENCODINGS:
            raise bad("encoding_format", f"'encoding_format' must be 'float' or 'base64', got {echo(encoding)!r}.")
        integer(body, "dimensions", 1)
        if body.get("stream"):
            raise bad("stream", "Embeddings are not streamed.")
        return model

    def sequences(self, body: dict[str, Any]) -> int:
        """No output tokens: the cost is the inputs, known in full."""
        return embedding_inputs(body)

    def question(self, body: dict[str, Any], spec: CachePolicy) -> Question | str:
        """The same input, model and parameters give the same vectors: an exact key only (there is no question
        to compare by meaning)."""
        return Question({name: body[name] for name in _EMBEDDING_PARAMS if body.get(name) is not None}, body["input"])

    def answer_from_json(self, body: bytes) -> Answer | None:
        """The response's data array, kept as the worker wrote it."""
        data = orjson.loads(body)
        vectors = data.get("data")
        if not isinstance(vectors, list) or not vectors or not isinstance(data.get("usage"), dict):
            return None
        return orjson.dumps(vectors).decode(), "stop", data["usage"]

    def replay_json(self, answer: str, finish_reason: str, model: str, usage: dict[str, Any]) -> bytes:
        return (b'{"object":"list","data":' + answer.encode() + b',"model":' + orjson.dumps(model)
                + b',"usage":' + orjson.dumps(usage) + b"}")


EMBEDDINGS = Embeddings("embeddings", "/v1/embeddings", model_kind="embed")
