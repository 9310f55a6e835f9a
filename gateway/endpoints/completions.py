"""POST /v1/completions: a prompt in, text out."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.endpoints.checks import bad
from gateway.endpoints.generation import Asked, Generation, norm, validate_sampling
from gateway.policy.schema import CachePolicy


class Completions(Generation):
    __slots__ = ()
    answer_object = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl"

    def validate(self, body: dict[str, Any]) -> str:
        model = validate_sampling(body)
        prompt = body.get("prompt")
        ok = (isinstance(prompt, str) and prompt) or (
            isinstance(prompt, list) and prompt and all(isinstance(p, str | int | list) for p in prompt))
        if not ok:
            raise bad("prompt", "'prompt' must be a non-empty string, array of strings, or array of token ids.")
        if body.get("max_completion_tokens") is not None:  # chat's name: vLLM's completions ignore it and would
            raise bad("max_completion_tokens",  # generate max_tokens, unbounded by the policy and the meter
                      "'max_completion_tokens' is not a parameter of the completions API: use 'max_tokens'.")
        return model

    def output_field(self, body: dict[str, Any]) -> str:
        return "max_tokens"

    def asked(self, body: dict[str, Any], spec: CachePolicy) -> Asked | str:
        """A text prompt is the question; a list of prompts or of token ids is not one the cache compares."""
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return "prompt_not_text"
        return [], norm(prompt), [("prompt", norm(prompt))], False

    def asking(self, body: dict[str, Any], question: str, spec: CachePolicy) -> dict[str, Any] | None:
        return {**body, "prompt": question}

    def text_of(self, choice: dict[str, Any]) -> object:
        return choice.get("text")

    def piece_of(self, choice: dict[str, Any]) -> object:
        return choice.get("text")

    def choice(self, answer: str, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": answer, "logprobs": None, "finish_reason": finish_reason}

    def chunk_choice(self, first: bool, piece: str, reason: bytes) -> bytes:
        return b'{"index":0,"text":' + orjson.dumps(piece) + b',"logprobs":null,"finish_reason":' + reason + b"}"


COMPLETIONS = Completions("completions", "/v1/completions", "text_completion")
