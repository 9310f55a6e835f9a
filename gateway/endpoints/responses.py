"""POST /v1/responses, GET and DELETE /v1/responses/{id}: the Responses API, whose answers live on the worker
that made them.

vLLM keeps a response's state in the memory of the server that made it, so a follow-up naming it
(``previous_response_id``) and a retrieve by id must reach that same worker. Where each lives is remembered in
this process (``ResponseHomes``), bounded (the oldest forgotten first), each with its tenant: a response is found
only by the tenant that made it. Replicas behind a load balancer need a follow-up to reach the replica that made
its predecessor (the session affinity of deploy/), or it is refused as unknown, clearly, never sent elsewhere.
Its answers are not cached: one may hold state on its worker.

A delete (``forget``) is the gateway's alone: vLLM serves no DELETE for a stored response (its routes are the
POST, the GET and POST .../cancel), so the worker keeps its copy, in memory, until it restarts. The gateway
forgets where it lives, so it never relays it again: a retrieve is a 404 and a follow-up naming it is refused
as unknown, as for a response this process never made.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import Any

from gateway.endpoints.base import Endpoint, Tap, Tapped
from gateway.endpoints.checks import bad, echo, integer, model_of, number, parts
from gateway.endpoints.taps import USAGE
from gateway.errors import NotFound

REMEMBERED = 100_000  # about 20 MB
_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]{1,128})"')


class ResponsesTap:
    """A Responses API stream's events pass unchanged (the usage is part of the response object the client
    reads); the tap counts the text deltas (a cut stream's estimate) and reads the usage off the final event."""

    __slots__ = ("relayed",)

    def __init__(self, relayed: Tapped) -> None:
        self.relayed = relayed

    def __call__(self, events: bytes) -> bytes:
        relayed = self.relayed
        relayed.events += events.count(b'"type":"response.output_text.delta"')
        if b'"usage":{' in events:
            for value in USAGE.findall(events):
                usage = value[0] or value[1]
                if usage != b"null":
                    relayed.usage_raw = usage
        return events


class Responses(Endpoint):
    __slots__ = ()

    def validate(self, body: dict[str, Any]) -> str:
        """``input`` a non-empty string or array of input items."""
        model = model_of(body)
        value = body.get("input")
        if not ((isinstance(value, str) and value) or (isinstance(value, list) and value and all(
                isinstance(item, dict) for item in value))):
            raise bad("input", "'input' must be a non-empty string or array of input items.")
        for i, item in enumerate(value if isinstance(value, list) else ()):
            content = item.get("content")
            if isinstance(content, list):
                parts(content, f"input[{i}].content")
            elif content is not None and not isinstance(content, str):
                raise bad(f"input[{i}].content", f"input[{i}].content must be a string or an array of parts.")
        for name in ("instructions", "previous_response_id"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise bad(name, f"'{name}' must be a string.")
        for name in ("stream", "store", "background"):
            if body.get(name) is not None and not isinstance(body[name], bool):
                raise bad(name, f"'{name}' must be a boolean.")
        if body.get("background"):
            raise bad("background", "Background responses are not supported through this gateway: the worker "
                                    "answers 'queued' with no usage and generates afterwards, outside the request, "
                                    "so the tokens could not be metered, limited or billed. Leave 'background' "
                                    "unset.")
        number(body, "temperature", 0, 2)
        number(body, "top_p", 0, 1)
        integer(body, "max_output_tokens", 1)
        return model

    def output_field(self, body: dict[str, Any]) -> str:
        return "max_output_tokens"

    def ask_usage(self, body: dict[str, Any], stream: bool) -> tuple[bool, bool]:
        """The usage comes in the response object itself, streamed or not: nothing to ask for."""
        return True, True

    def tap(self, relayed: Tapped, keep_final: bool, keep_continuous: bool) -> Tap:
        return ResponsesTap(relayed)


RESPONSES = Responses("responses", "/v1/responses", homed=True)
# A stored response read back: never prepared nor cached; a request of its own in the ledger and the traces.
RETRIEVE = Endpoint("responses.retrieve", "/v1/responses/{response_id}")


@dataclass(frozen=True, slots=True)
class Home:
    tenant: str
    pool: str
    worker: str  # its URL
    # the conversation's tokens so far, which the worker puts before a follow-up's prompt: what the follow-up's
    # reservation must add to its own (pipeline.conversation)
    tokens: int = 0
    model: str = ""  # the policy's model that answered, as the client was shown it ("" before it was kept)
    worker_model: str = ""  # the name the worker knows it by (its upstream_model), written in the stored copy


class ResponseHomes:
    """Where each Responses API answer this process relayed lives, by its id."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._homes: collections.OrderedDict[str, Home] = collections.OrderedDict()

    def remember(self, answer_start: bytes, home: Home) -> str | None:
        """Remember the response named at the start of an answer (a body, or a stream's first event)."""
        found = _ID.search(answer_start)
        if found is None:
            return None
        rid = found[1].decode()
        self._homes[rid] = home
        self._homes.move_to_end(rid)
        while len(self._homes) > self.size:
            self._homes.popitem(last=False)
        return rid

    def find(self, rid: str, tenant: str) -> Home | None:
        """Where the response ``rid`` of ``tenant`` lives; None if this process did not make it for them."""
        home = self._homes.get(rid)
        return home if home is not None and home.tenant == tenant else None

    def forget(self, rid: str, tenant: str) -> bool:
        """Forget the response ``rid`` of ``tenant`` (a client deleted it); False if it was not known for them,
        another tenant's included."""
        if self.find(rid, tenant) is None:
            return False
        del self._homes[rid]
        return True

    def of_previous(self, body: dict[str, Any], tenant: str) -> Home | None:
        """Where a follow-up must go (the worker that made its previous response) and the conversation it
        carries, or None when it continues nothing. A previous response this process did not make for this
        tenant is a 404, never a guess."""
        previous = body.get("previous_response_id")
        if not previous:
            return None
        home = self.find(previous, tenant)
        if home is None:
            raise NotFound(f"No response '{echo(previous)}' is known for this tenant (responses live on the worker "
                           "that made them, and only as long as it runs).", "response_not_found",
                           param="previous_response_id")
        return home
