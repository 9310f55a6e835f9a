"""What chat and completions share: the sampling checks, the output bound, usage on every chunk, the cache's
eligibility and parameters, and the shapes of a replayed or read-back answer (each says how its choice holds
the text)."""

from __future__ import annotations

import abc
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from gateway import sse
from gateway.endpoints.base import Answer, Endpoint, Question, Tap, Tapped
from gateway.endpoints.checks import bad, integer, model_of, number
from gateway.endpoints.taps import UsageTap
from gateway.policy.schema import CachePolicy

# Parameters that change what the answer is (max_tokens is checked against each entry instead).
_ANSWER_PARAMS = ("top_p", "top_k", "min_p", "seed", "stop", "response_format", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "logit_bias", "guided_json", "guided_regex",
                  "guided_choice", "min_tokens", "ignore_eos")
_SPACE = re.compile(r"\s+")
_PIECE = re.compile(r"\s*\S+|\s+$")  # a replayed stream's chunks: a word each, with the space before it

# What a cacheable request asks, before its parameters: (system prompts, lookup text, turns, earlier turns?)
Asked = tuple[list[str], str, list[tuple[Any, str]], bool]


def norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


_BOUNDED: dict[str, tuple[Callable[..., None], float, float | None]] = {
    "temperature": (number, 0, 2), "top_p": (number, 0, 1), "presence_penalty": (number, -2, 2),
    "frequency_penalty": (number, -2, 2), "n": (integer, 1, 128), "best_of": (integer, 1, 128),
    "max_tokens": (integer, 1, None), "max_completion_tokens": (integer, 1, None),
    "seed": (integer, -(2**63), 2**64 - 1), "top_logprobs": (integer, 0, None),
    "prompt_logprobs": (integer, -1, None),  # vLLM's; -1: the whole vocabulary
}


def validate_sampling(body: dict[str, Any]) -> str:
    """Checks shared by chat and completions; returns the model name."""
    model = model_of(body)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("stream", "'stream' must be a boolean.")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad("stream_options", "'stream_options' must be an object.")
        if not stream:
            raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true.")
    for name in sorted(_BOUNDED.keys() & body.keys()):  # only what the body holds: most hold one or two
        check, low, high = _BOUNDED[name]
        check(body, name, low, high)
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):  # chat's is a flag, completions' a count
        integer(body, "logprobs", 0)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad("stop", "'stop' must be a string or a list of strings.")
    return model


# What an answer takes, to hold a request's answer against the pool's cap before it is sent (from vLLM's answer
# shapes; the cap is in bytes, the engine counts tokens): its frame (id, usage, vLLM's own members) and each
# choice's; one token's text in a whole answer's JSON (32: a byte-level BPE token of up to 16 bytes, escaped, or a
# run of spaces); a streamed token's own event, with the usage the gateway asks for on every chunk; one
# log-probability entry (token, logprob, the token's bytes as numbers). VOCABULARY stands in for prompt_logprobs -1.
# tests/inprocess/test_answer_size.py holds them against the simulated vLLM's longest answers.
ANSWER_BYTES, CHOICE_BYTES, TOKEN_BYTES, CHUNK_BYTES, LOGPROB_BYTES, VOCABULARY = 1024, 256, 32, 384, 160, 32_000


def logprob_entries(body: dict[str, Any]) -> int:
    """Log-probability entries per generated token: 0 without logprobs, else the token's own and its alternatives
    (chat: ``logprobs: true`` with ``top_logprobs``; completions: ``logprobs: k``)."""
    asked = body.get("logprobs")
    if asked is True:
        return 1 + (body.get("top_logprobs") or 0)
    if isinstance(asked, int) and not isinstance(asked, bool):
        return 1 + asked
    return 0


def prompt_logprob_entries(body: dict[str, Any]) -> int:
    """Log-probability entries per prompt token of vLLM's ``prompt_logprobs`` (once an answer)."""
    asked = body.get("prompt_logprobs")
    if asked is None:
        return 0
    return VOCABULARY if asked < 0 else 1 + asked


class Generation(Endpoint, abc.ABC):
    """An API that generates text in OpenAI's choices (chat, completions). A subclass says how its body asks
    (``asked``) and where its choices hold the text (``text_of``, ``piece_of``, ``choice``, ``chunk_choice``)."""

    __slots__ = ()
    samples = True
    answer_object = ""  # a whole answer's "object"
    chunk_object = ""  # a stream chunk's "object"
    id_prefix = ""  # of the ids a replay makes up

    def output_field(self, body: dict[str, Any]) -> str:
        """The one of max_tokens and max_completion_tokens the client used."""
        return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"

    def sequences(self, body: dict[str, Any]) -> int:
        """Each prompt of a completions list (strings, or lists of token ids), times the larger of n and best_of."""
        prompt = body.get("prompt")
        prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
        return prompts * max(body.get("n") or 1, body.get("best_of") or 1)

    def answer_bytes(self, body: dict[str, Any], tokens_out: int, sequences: int, prompt_tokens: int,
                     stream: bool) -> int:
        event = CHUNK_BYTES + len(body["model"])  # every event names the model
        per_token = event if stream else TOKEN_BYTES
        per_choice = 2 * event if stream else CHOICE_BYTES  # a stream's role and finish events; a choice's frame
        need = ANSWER_BYTES + sequences * per_choice + tokens_out * per_token
        if "logprobs" in body or "prompt_logprobs" in body:
            need += LOGPROB_BYTES * (tokens_out * logprob_entries(body) + prompt_tokens * prompt_logprob_entries(body))
        if body.get("echo"):  # completions: every choice carries its prompt, with its logprobs when asked
            need += sequences * prompt_tokens * (TOKEN_BYTES + LOGPROB_BYTES * logprob_entries(body))
        return need

    def ask_usage(self, body: dict[str, Any], stream: bool) -> tuple[bool, bool]:
        """The ledger needs the usage, and on every chunk, so that a stream cut anywhere is still counted
        exactly: the worker is always asked for both; the client gets what it asked for."""
        if not stream:
            return False, False
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        wants_usage = bool(options.get("include_usage"))
        wants_continuous = wants_usage and bool(options.get("continuous_usage_stats"))
        body["stream_options"] = {**options, "include_usage": True, "continuous_usage_stats": True}
        return wants_usage, wants_continuous

    def tap(self, relayed: Tapped, keep_final: bool, keep_continuous: bool) -> Tap:
        return UsageTap(relayed, keep_final, keep_continuous)

    # -- the cache ----------------------------------------------------------------------------------------

    def question(self, body: dict[str, Any], spec: CachePolicy) -> Question | str:
        if body.get("n", 1) != 1:
            return "n_gt_1"
        if body.get("logprobs") or body.get("echo"):
            return "logprobs"
        if not spec.tools and (body.get("tools") or body.get("functions")):
            return "tools"
        asked = self.asked(body, spec)
        if isinstance(asked, str):
            return asked
        system, text, history, earlier_turns = asked
        if not text:
            return "empty"
        params = {name: body[name] for name in _ANSWER_PARAMS if body.get(name) is not None}
        if body.get("tools"):
            params["tools"] = body["tools"]
        temperature = body.get("temperature")
        if temperature is None:  # the engine samples at its default (vLLM's and OpenAI's: 1.0)
            temperature = spec.default_temperature
        return Question(params, history, system, history[:-1] if earlier_turns else None, text, float(temperature))

    @abc.abstractmethod
    def asked(self, body: dict[str, Any], spec: CachePolicy) -> Asked | str:
        """The body's system prompts, lookup text and turns, or why it is not a question the cache can key."""

    @abc.abstractmethod
    def text_of(self, choice: dict[str, Any]) -> object:
        """A whole answer's text in its choice (None where it is not plain text)."""

    @abc.abstractmethod
    def piece_of(self, choice: dict[str, Any]) -> object:
        """A stream chunk's text in its choice."""

    @abc.abstractmethod
    def choice(self, answer: str, finish_reason: str) -> dict[str, Any]:
        """A replayed whole answer's one choice."""

    @abc.abstractmethod
    def chunk_choice(self, first: bool, piece: str, reason: bytes) -> bytes:
        """A replayed chunk's one choice, as JSON (``reason``: JSON too, null before the last chunk)."""

    def answer_from_json(self, body: bytes) -> Answer | None:
        data = orjson.loads(body)
        choices = data.get("choices") or []
        if len(choices) != 1 or not isinstance(data.get("usage"), dict):
            return None
        choice = choices[0]
        text = self.text_of(choice)
        if not isinstance(text, str):
            return None
        return text, choice.get("finish_reason") or "stop", data["usage"]

    def answer_from_sse(self, events: bytes) -> Answer | None:
        text: list[str] = []
        finish: str | None = None
        usage_seen: dict[str, Any] | None = None
        done = False
        for payload in sse.payloads(events):
            if payload == sse.DONE:
                done = True
                continue
            data = orjson.loads(payload)
            if "error" in data:
                return None
            if isinstance(data.get("usage"), dict):
                usage_seen = data["usage"]
            for choice in data.get("choices") or []:
                if choice.get("index", 0) != 0:
                    return None
                piece = self.piece_of(choice)
                if (choice.get("delta") or {}).get("tool_calls") or not isinstance(piece, str | None):
                    return None  # a tool call, or a piece that is no text (as answer_from_json: not cached)
                if piece:
                    text.append(piece)
                finish = choice.get("finish_reason") or finish
        if not done or finish is None or usage_seen is None:
            return None
        return "".join(text), finish, usage_seen

    def replay_json(self, answer: str, finish_reason: str, model: str, usage: dict[str, Any]) -> bytes:
        return orjson.dumps({"id": f"{self.id_prefix}-{uuid.uuid4().hex}", "object": self.answer_object,
                             "created": int(time.time()), "model": model,
                             "choices": [self.choice(answer, finish_reason)], "usage": usage})

    def replay_sse(self, answer: str, finish_reason: str, model: str, usage: dict[str, Any] | None) -> bytes:
        head = orjson.dumps({"id": f"{self.id_prefix}-{uuid.uuid4().hex}", "object": self.chunk_object,
                             "created": int(time.time()), "model": model})[:-1]
        out = []
        pieces = _PIECE.findall(answer) or [""]
        for i, piece in enumerate(pieces):
            reason = orjson.dumps(finish_reason) if i == len(pieces) - 1 else b"null"
            out.append(sse.event(head + b',"choices":[' + self.chunk_choice(i == 0, piece, reason) + b"]}"))
        if usage is not None:
            out.append(sse.event(head + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}"))
        out.append(sse.DONE_EVENT)
        return b"".join(out)
