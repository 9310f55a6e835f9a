"""What every API's object offers the steps that handle its requests.

The pipeline, the cache, the relay and the records call the request's endpoint (``ctx.endpoint``) for what
differs per API, instead of switching on its name. The defaults are an API's that generates nothing the cache
keeps and streams nothing (a subclass says otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.policy.schema import CachePolicy

Answer = tuple[str, str, dict[str, Any]]  # a cacheable answer read back: (text, finish_reason, usage)
Tap = Callable[[bytes], bytes]  # the events of one upstream read in, the events for the client out


class Tapped(Protocol):
    """What a stream's tap writes to (gateway.upstream.relay.Relayed): the token events relayed, and the latest
    usage object as the worker wrote it (parsed only when read)."""

    events: int
    usage_raw: bytes | None


@dataclass(frozen=True, slots=True)
class Question:
    """What a cacheable request asks, as its API reads the body; the cache hashes it into a key (gateway.cache.keys).

    ``params``: what changes the answer beside the question. ``exact``: what must be equal for an exact hit.
    ``system``: the system prompts, part of the scope (None where the API has none). ``earlier``: the turns
    before the last question, which the semantic layer cannot compare, so they join the scope (None: there are
    none). ``text``: what the semantic layer compares; "" for an answer matched exactly only, which has no output
    to bound (embeddings). ``temperature``: what the request samples at (the policy's ``default_temperature``
    when it sends none); None for an API that does not sample. Whether that keeps it from the cache, and whether
    it joins the scope, is the tenant's cacheability (gateway.cache.keys)."""

    params: dict[str, Any]
    exact: Any
    system: list[str] | None = None
    earlier: Any = None
    text: str = ""
    temperature: float | None = None


class Endpoint:
    """One API: its ``name`` (what the ledger, the logs and cached entries write), its ``path`` (on the edge,
    in batch files and on the workers), its ``operation`` (the GenAI name a trace gives it), the ``model_kind``
    it serves, and whether its answers are ``homed`` (kept on the worker that made them, so a follow-up must
    find that worker). One module-level object per API: a request holds it, never a copy."""

    __slots__ = ("homed", "model_kind", "name", "operation", "path")
    samples = False  # its body may send a temperature (its Question carries one)

    def __init__(self, name: str, path: str, operation: str | None = None,
                 model_kind: Literal["generate", "embed"] = "generate", homed: bool = False) -> None:
        self.name = name
        self.path = path
        self.operation = operation or name
        self.model_kind = model_kind
        self.homed = homed

    def __repr__(self) -> str:
        return f"<Endpoint {self.name}>"

    def validate(self, body: dict[str, Any]) -> str:
        """Check a parsed body (raise InvalidRequest naming the parameter); returns the model it asks for."""
        raise NotImplementedError(f"{self.name} takes no body")

    def output_field(self, body: dict[str, Any]) -> str | None:
        """The body field that bounds the output tokens; None for an API that generates none."""
        return None

    def sequences(self, body: dict[str, Any]) -> int:
        """How many sequences (or, with no output, inputs) a validated body asks the engine for."""
        return 1

    def answer_bytes(self, body: dict[str, Any], tokens_out: int, sequences: int, prompt_tokens: int,
                     stream: bool) -> int:
        """About how many bytes the answer to a validated body takes at most, when it generates ``tokens_out``
        tokens over its ``sequences`` from a prompt of at most ``prompt_tokens``: what is held against the pool's
        answer cap before dispatch (0: an API whose answer this cannot tell)."""
        return 0

    def ask_usage(self, body: dict[str, Any], stream: bool) -> tuple[bool, bool]:
        """Ask the worker for what the ledger needs, in place; returns what the client itself asked for: (the
        final usage event, usage on every chunk)."""
        return False, False

    def tap(self, relayed: Tapped, keep_final: bool, keep_continuous: bool) -> Tap:
        """What reads the usage off a stream's events, and shapes them as the client asked."""
        raise NotImplementedError(f"{self.name} is not streamed")

    def question(self, body: dict[str, Any], spec: CachePolicy) -> Question | str:
        """What the cache keys this request on, or why it is not cached (a bypass reason)."""
        return "endpoint"

    def asking(self, body: dict[str, Any], question: str, spec: CachePolicy) -> dict[str, Any] | None:
        """``body`` with its question (what ``question`` keys on) put in its place, or None where the question is
        not one piece of the body: the cache audit asks a stored question again this way."""
        return None

    def answer_from_json(self, body: bytes) -> Answer | None:
        """(text, finish_reason, usage) of a whole answer, or None if it is not one the cache keeps."""
        return None

    def answer_from_sse(self, events: bytes) -> Answer | None:
        """The same of a streamed answer: None unless it ran to [DONE] with a finish reason and usage."""
        return None

    def replay_json(self, answer: str, finish_reason: str, model: str, usage: dict[str, Any]) -> bytes:
        """A cached answer as a whole body, in the shape a fresh one has."""
        raise NotImplementedError(f"{self.name} is not cached")

    def replay_sse(self, answer: str, finish_reason: str, model: str, usage: dict[str, Any] | None) -> bytes:
        """A cached answer as a stream, in one body (nothing to wait for between chunks); ``usage``: the final
        usage event's, or None when the client did not ask for it."""
        raise NotImplementedError(f"{self.name} is not cached")
