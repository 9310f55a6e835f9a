"""The embedded default's simulated worker through a running gateway, driven by the official ``openai`` client as
applications drive it: a short answer ends with stop, tool calls (the client's streaming helper assembles them),
structured output parsed into a pydantic model (``parse`` and a strict ``pydantic_function_tool``), n answers and
logprobs, each whole and streamed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import DEMO_KEY, Proc, policy_dict

MODEL = "sim-llama-8b"
Starter = Callable[..., Proc]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    hobbies: list[str]


@pytest.fixture
def client(start_sim: Starter, start_gateway: Starter) -> openai.OpenAI:
    sim = start_sim("--zero-delay", "--mean-output-tokens", "40")  # the default's natural answers, quickly
    gateway = start_gateway(policy_dict([sim.url]))
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_a_short_answer_ends_with_stop_whole_and_streamed(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=user("Say hello in one sentence."))
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    assert answer.usage is not None and 0 < answer.usage.completion_tokens < 512, "below the tier's max_tokens"
    chunks = list(client.chat.completions.create(model=MODEL, messages=user("Say hi to the team."), stream=True,
                                                 stream_options={"include_usage": True}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    cut = client.chat.completions.create(model=MODEL, messages=user("Say hello in one sentence."), max_tokens=2)
    assert cut.choices[0].finish_reason == "length" and cut.usage is not None and cut.usage.completion_tokens == 2


def test_tool_calls_whole_and_streamed(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=user("What is the weather in Paris?"),
                                            tools=[WEATHER])  # type: ignore[list-item]
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert arguments["city"] == "Paris"
    with client.chat.completions.stream(model=MODEL, messages=user("What is the weather in Oslo?"),
                                        tools=[WEATHER]) as stream:  # type: ignore[list-item]
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls" and streamed.function.name == "get_weather"
    assert json.loads(streamed.function.arguments)["city"] == "Oslo" and streamed.id.startswith("chatcmpl-tool-")
    required = client.chat.completions.create(model=MODEL, messages=user("Hello there."), tools=[WEATHER],
                                              tool_choice="required")  # type: ignore[list-item]
    assert required.choices[0].message.tool_calls, "required: a call even when nothing asks for one"
    chosen = client.chat.completions.create(model=MODEL, messages=user("Hello there."), tools=[WEATHER],
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert chosen.choices[0].message.tool_calls and chosen.choices[0].finish_reason == "stop"


def test_structured_output_parsed_into_a_pydantic_model_whole_and_streamed(client: openai.OpenAI) -> None:
    question = user("Alice is 31 and likes chess and rowing. Extract the person.")
    parsed = client.chat.completions.parse(model=MODEL, messages=question, response_format=Person)
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person) and person.name == "Alice" and person.age == 31
    assert parsed.choices[0].finish_reason == "stop"
    with client.chat.completions.stream(model=MODEL, messages=question, response_format=Person) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == person, "the same request, the same answer, streamed"
    tool = client.chat.completions.parse(model=MODEL, messages=question,
                                         tools=[openai.pydantic_function_tool(Person)], tool_choice="required")
    [call] = tool.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Person)
    assert call.function.parsed_arguments.name == "Alice"


def test_two_answers_and_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=user("Name a colour."), n=2, max_tokens=12,
                                            logprobs=True, top_logprobs=2)
    assert [c.index for c in answer.choices] == [0, 1]
    assert answer.choices[0].message.content != answer.choices[1].message.content
    for choice in answer.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
        assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    assert answer.usage is not None and answer.usage.completion_tokens == sum(
        len(c.logprobs.content) for c in answer.choices if c.logprobs and c.logprobs.content)
    texts: dict[int, str] = {}
    tokens: dict[int, int] = {}
    for chunk in client.chat.completions.create(model=MODEL, messages=user("Name a colour."), n=2, max_tokens=12,
                                                logprobs=True, top_logprobs=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.logprobs and choice.logprobs.content:
                tokens[choice.index] = tokens.get(choice.index, 0) + len(choice.logprobs.content)
    assert texts == {c.index: c.message.content for c in answer.choices}
    assert tokens == {c.index: len(c.logprobs.content) for c in answer.choices if c.logprobs and c.logprobs.content}
    completion = client.completions.create(model=MODEL, prompt="The queue is", max_tokens=4, logprobs=2, n=2)
    assert len(completion.choices) == 2 and all(c.logprobs and len(c.logprobs.tokens or []) == 4
                                                for c in completion.choices)


def test_a_model_served_under_another_name_is_named_as_asked_and_its_objects_are_the_tenants(
        start_sim: Starter, start_gateway: Starter) -> None:
    """A policy's model whose workers serve it under another name (``upstream_model``): the client retrieves it,
    and every answer names it as the client asked (chat whole and streamed, a response made, read back);
    a deleted response is gone for its tenant."""
    sim = start_sim("--zero-delay", "--mean-output-tokens", "20")
    policy = policy_dict([sim.url])
    policy["models"]["team-chat"] = {"pool": "main", "upstream_model": MODEL}
    gateway = start_gateway(policy)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)
    assert client.models.retrieve("team-chat").id == "team-chat"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    assert client.chat.completions.create(model="team-chat", messages=user("Hello there.")).model == "team-chat"
    streamed = client.chat.completions.create(model="team-chat", messages=user("Hello there."), stream=True)
    assert {chunk.model for chunk in streamed} == {"team-chat"}
    made = client.responses.create(model="team-chat", input="remember this", max_output_tokens=8)
    assert made.model == "team-chat" and client.responses.retrieve(made.id).model == "team-chat"
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(made.id)
