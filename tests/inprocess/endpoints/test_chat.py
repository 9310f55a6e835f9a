"""The chat API's object: what it refuses, what it asks the worker for, the question the cache keys on, and a
cached answer replayed and read back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway import sse
from gateway.endpoints.chat import CHAT
from gateway.errors import InvalidRequest
from gateway.policy.schema import CachePolicy

SPEC = CachePolicy(enabled=True)
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def asking(*messages: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], "temperature": 0, **extra}


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    (asking(), "messages"),
    (asking(("robot", "x")), "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
    (asking(("user", [{"type": "text", "text": 5}])), "messages[0].content[0].text"),
    (asking(("user", [{"text": "no type"}])), "messages[0].content[0]"),
    (asking(("user", 7)), "messages[0].content"),
    (asking(("user", "x"), stream_options={"include_usage": True}), "stream_options"),
    (asking(("user", "x"), top_p=1.5), "top_p"),
    (asking(("user", "x"), seed=True), "seed"),
    (asking(("user", "x"), temperature=3), "temperature"),
    (asking(("user", "x"), max_tokens=0), "max_tokens"),
    (asking(("user", "x"), n=True), "n"),
    (asking(("user", "x"), stream=True, stream_options=[]), "stream_options"),
    (asking(("user", "x"), stop=[1]), "stop"),
])
def test_a_refusal_names_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        CHAT.validate(body)
    assert caught.value.param == param


def test_an_assistant_turn_of_tool_calls_alone_needs_no_content() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"},
                                       {"role": "assistant", "tool_calls": [{"id": "1"}]}]}
    assert CHAT.validate(body) == "m"
    with pytest.raises(InvalidRequest):
        CHAT.validate({"model": "m", "messages": [{"role": "assistant"}]})


def test_the_output_is_bounded_by_the_field_the_client_used() -> None:
    assert CHAT.output_field(asking(("user", "x"))) == "max_tokens"
    assert CHAT.output_field(asking(("user", "x"), max_completion_tokens=9)) == "max_completion_tokens"
    assert CHAT.sequences(asking(("user", "x"), n=3, best_of=5)) == 5


def test_the_worker_is_asked_for_usage_on_every_chunk_whatever_the_client_asked() -> None:
    body = asking(("user", "x"), stream=True, stream_options={"include_usage": True, "other": 1})
    assert CHAT.ask_usage(body, True) == (True, False)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True, "other": 1}
    plain = asking(("user", "x"), stream=True)
    assert CHAT.ask_usage(plain, True) == (False, False) and plain["stream_options"]["continuous_usage_stats"]
    whole = asking(("user", "x"))
    assert CHAT.ask_usage(whole, False) == (False, False) and "stream_options" not in whole


def test_the_question_is_the_last_user_message_under_its_system_prompt() -> None:
    question = CHAT.question(asking(("system", "Be  terse."), ("user", "What is  2+2?")), SPEC)
    assert not isinstance(question, str)
    assert question.text == "What is 2+2?" and question.system == ["Be terse."] and question.earlier is None
    parts = CHAT.question(asking(("user", [{"type": "text", "text": "What is"}, {"type": "image_url"},
                                           {"type": "text", "text": "2+2?"}])), SPEC)
    assert not isinstance(parts, str) and parts.text == "What is 2+2?", "text parts only, joined"


def test_a_conversation_is_a_question_only_when_it_ends_on_the_user_and_multi_turn_is_on() -> None:
    answered = asking(("user", "a"), ("assistant", "b"))
    assert CHAT.question(answered, SPEC) == "not_a_question"
    follow = asking(("user", "a"), ("assistant", "b"), ("user", "c"))
    assert CHAT.question(follow, SPEC) == "multi_turn"
    question = CHAT.question(follow, CachePolicy(enabled=True, multi_turn=True))
    assert not isinstance(question, str)
    assert question.text == "c" and question.earlier == [("user", "a"), ("assistant", "b")], \
        "earlier turns join the scope: the semantic layer compares the last question only"
    everything = CHAT.question(follow, CachePolicy(enabled=True, multi_turn=True, lookup_text="all_user"))
    assert not isinstance(everything, str) and everything.text == "a c"
    assert CHAT.question(asking(("user", "   ")), SPEC) == "empty"


def test_a_replayed_answer_reads_back_as_the_same_answer() -> None:
    body = CHAT.replay_json("Paris, of course.", "stop", "m", USAGE)
    data = orjson.loads(body)
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-") and data["model"] == "m"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "Paris, of course."}
    assert CHAT.answer_from_json(body) == ("Paris, of course.", "stop", USAGE)
    stream = CHAT.replay_sse("Paris, of course.", "length", "m", USAGE)
    chunks = [orjson.loads(p) for p in sse.payloads(stream) if p != sse.DONE]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and chunks[-1]["choices"] == []
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "length"
    assert CHAT.answer_from_sse(stream) == ("Paris, of course.", "length", USAGE)
    assert CHAT.answer_from_sse(CHAT.replay_sse("Paris.", "stop", "m", None)) is None, \
        "a stream without usage is not one the cache keeps"


def test_tool_calls_are_not_answers_the_cache_keeps() -> None:
    whole = orjson.dumps({"choices": [{"index": 0, "message": {"content": None, "tool_calls": [{"id": "1"}]},
                                       "finish_reason": "tool_calls"}], "usage": USAGE})
    assert CHAT.answer_from_json(whole) is None
    streamed = (sse.event(orjson.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [{"id": "1"}]},
                                                      "finish_reason": "tool_calls"}], "usage": USAGE}))
                + sse.DONE_EVENT)
    assert CHAT.answer_from_sse(streamed) is None
