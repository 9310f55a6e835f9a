"""The registry's objects and what an API that overrides nothing does: the names and paths are the ones the
ledger, the logs, the traces and the workers know."""

from __future__ import annotations

import pytest

from gateway.endpoints import BY_PATH, CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, RETRIEVE, SERVED
from gateway.endpoints.base import Endpoint
from gateway.policy.schema import CachePolicy


def test_names_paths_and_operations_are_the_ones_records_and_workers_know() -> None:
    assert {e.name: (e.path, e.operation) for e in BY_PATH.values()} == {
        "chat": ("/v1/chat/completions", "chat"), "completions": ("/v1/completions", "text_completion"),
        "embeddings": ("/v1/embeddings", "embeddings"), "responses": ("/v1/responses", "responses")}
    assert RETRIEVE.name == "responses.retrieve" and RETRIEVE.path not in BY_PATH, "a GET, not a POST route"
    assert [e.model_kind for e in (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)] == ["generate"] * 2 + ["embed",
                                                                                                     "generate"]
    assert [e for e in (*SERVED, RETRIEVE) if e.homed] == [RESPONSES]
    assert all(isinstance(e, Endpoint) for e in (*SERVED, RETRIEVE)) and type(RETRIEVE) is Endpoint


def test_an_api_that_overrides_nothing_is_neither_cached_nor_streamed() -> None:
    assert RETRIEVE.question({}, CachePolicy(enabled=True)) == "endpoint"
    assert RETRIEVE.answer_from_json(b"{}") is None and RETRIEVE.answer_from_sse(b"") is None
    assert RETRIEVE.output_field({}) is None and RETRIEVE.ask_usage({}, True) == (False, False)
    with pytest.raises(NotImplementedError):
        RETRIEVE.validate({})
    with pytest.raises(NotImplementedError):
        RETRIEVE.replay_json("a", "stop", "m", {})


def test_an_endpoint_holds_no_per_request_state() -> None:
    with pytest.raises(AttributeError):
        CHAT.anything = 1  # type: ignore[attr-defined]
