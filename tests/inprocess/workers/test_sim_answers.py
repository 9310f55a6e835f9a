"""The simulated worker's answers for what client libraries rely on, in-process over its HTTP API: a natural
length, tool calls, structured content, n answers, prompt lists, logprobs and echo, whole and streamed alike, with
exact token counts; and vLLM's refusals."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import httpx
import jsonschema
import orjson
import pytest

from workers.sim import tokenizer
from workers.sim.engine import EngineConfig
from workers.sim.server import SimServer

ZERO = EngineConfig(decode_base_s=0.0, decode_per_seq_s=0.0, prefill_per_token_s=0.0, mean_output_tokens=0)
NATURAL = EngineConfig(decode_base_s=0.0, decode_per_seq_s=0.0, prefill_per_token_s=0.0, mean_output_tokens=30)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "unit", "days"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    "required": ["name", "age", "address", "tags"], "additionalProperties": False}


def ask(requests: list[dict[str, Any]], config: EngineConfig = ZERO) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        server = SimServer(config, "m")
        server.engine.start()
        transport = httpx.ASGITransport(app=server.app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            answers = [await client.post(r.pop("path", "/v1/chat/completions"), json={"model": "m", **r})
                       for r in [dict(r) for r in requests]]
        await server.engine.stop()
        return answers
    return asyncio.run(main())


def chat(question: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}], **kw}


def streaming(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


def chunks(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.text.endswith("data: [DONE]\n\n")
    return [orjson.loads(e[6:]) for e in response.text.split("\n\n") if e.startswith("data: {")]


def assembled(response: httpx.Response) -> tuple[dict[int, str], dict[int, dict[int, dict[str, str]]],
                                                  dict[int, str], dict[str, Any]]:
    """A chat stream put together as a client does: content and tool calls per choice, finish reasons, usage."""
    content: dict[int, str] = {}
    calls: dict[int, dict[int, dict[str, str]]] = {}
    finish: dict[int, str] = {}
    usage: dict[str, Any] = {}
    for chunk in chunks(response):
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            i, delta = choice["index"], choice["delta"]
            content[i] = content.get(i, "") + (delta.get("content") or "")
            for call in delta.get("tool_calls") or ():
                slot = calls.setdefault(i, {}).setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.get("id") or ""
                slot["name"] += call["function"].get("name") or ""
                slot["arguments"] += call["function"].get("arguments") or ""
            if choice["finish_reason"]:
                finish[i] = choice["finish_reason"]
    return content, calls, finish, usage


def test_answers_stop_at_a_natural_length_and_length_only_at_max_tokens() -> None:
    subjects = ("rivers lakes oceans forests deserts mountains glaciers volcanoes islands canyons caves reefs "
                "prairies swamps tundra jungles valleys beaches cliffs dunes").split()
    questions = [f"Tell me about {subject} and their history" for subject in subjects]
    answers = ask([chat(q) for q in questions] + [chat("Hi", max_tokens=3), chat("Hi", max_tokens=40, ignore_eos=True),
                                                  streaming(chat("Tell me about the sea"))], NATURAL)
    lengths = []
    for answer in answers[:20]:
        body = answer.json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "stop", body
        assert body["usage"]["completion_tokens"] == tokenizer.count_text(choice["message"]["content"])
        lengths.append(body["usage"]["completion_tokens"])
    assert 15 <= sum(lengths) / len(lengths) <= 45 and len(set(lengths)) > 5, lengths
    short, forced = answers[20].json(), answers[21].json()
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 3
    assert forced["choices"][0]["finish_reason"] == "length" and forced["usage"]["completion_tokens"] == 40
    content, _, finish, usage = assembled(answers[22])
    assert finish == {0: "stop"} and usage["completion_tokens"] == tokenizer.count_text(content[0])


def test_a_tool_call_whole_and_streamed_with_arguments_valid_against_the_parameters() -> None:
    body = chat("What is the weather in Paris in fahrenheit for 3 days?", tools=[WEATHER, TIME])
    whole, again, stream = ask([body, body, streaming(body)], NATURAL)
    answer = whole.json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["role"] == "assistant"
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert arguments == {"city": "Paris", "unit": "fahrenheit", "days": 3}, "values from the prompt"
    assert again.json()["choices"][0]["message"]["tool_calls"][0]["function"] == call["function"]
    content, calls, finish, usage = assembled(stream)
    assert finish == {0: "tool_calls"} and content == {0: ""}
    assert [(c["name"], c["arguments"]) for c in calls[0].values()] == [("get_weather", call["function"]["arguments"])]
    assert calls[0][0]["id"].startswith("chatcmpl-tool-")
    first = next(c for c in chunks(stream) if c["choices"] and c["choices"][0]["delta"].get("tool_calls"))
    head = first["choices"][0]["delta"]["tool_calls"][0]
    assert set(head) == {"index", "id", "type", "function"} and head["function"] == {"name": "get_weather"}
    tokens = answer["usage"]["completion_tokens"]
    assert tokens == usage["completion_tokens"] > tokenizer.count_text(call["function"]["arguments"]), \
        "the usage counts the call's tokens (its arguments and the syntax around them)"


def test_tool_choice_required_named_none_parallel_and_after_a_tool_result() -> None:
    after = [{"role": "user", "content": "What is the weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    required, named, none, both, one, answered = ask([
        chat("Hello there", tools=[WEATHER, TIME], tool_choice="required"),
        chat("What is the weather in Paris?", tools=[WEATHER, TIME],
             tool_choice={"type": "function", "function": {"name": "get_time"}}),
        chat("What is the weather in Paris?", tools=[WEATHER], tool_choice="none"),
        chat("What is the weather in Paris and the time in Tokyo?", tools=[WEATHER, TIME]),
        chat("What is the weather in Paris and the time in Tokyo?", tools=[WEATHER, TIME], parallel_tool_calls=False),
        {"messages": after, "tools": [WEATHER, TIME]}], NATURAL)
    choice = required.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather", "required: a call, always"
    choice = named.json()["choices"][0]
    assert choice["finish_reason"] == "stop", "a named tool ends with stop, as in vLLM and OpenAI"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_time"]
    for text in (none, answered):
        choice = text.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"]
        assert "tool_calls" not in choice["message"]
    calls = both.json()["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])["city"]) for c in calls] == [
        ("get_weather", "Paris"), ("get_time", "Tokyo")]
    assert len({c["id"] for c in calls}) == 2
    assert [c["function"]["name"] for c in one.json()["choices"][0]["message"]["tool_calls"]] == ["get_weather"]


def test_json_schema_and_json_object_content_parses_and_validates() -> None:
    form = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    question = "Alice is 31 and lives in Lyon. Extract the person."
    whole, stream, guided, outputs, loose, completion = ask([
        chat(question, response_format=form), streaming(chat(question, response_format=form)),
        chat(question, guided_json=PERSON), chat(question, structured_outputs={"json": PERSON}),
        chat("Bob is 40. Reply as JSON with keys name and age.", response_format={"type": "json_object"}),
        {"path": "/v1/completions", "prompt": question, "max_tokens": 200, "response_format": form}], ZERO)
    for answer in (whole, guided, outputs):
        body = answer.json()
        content = body["choices"][0]["message"]["content"]
        value = json.loads(content)
        jsonschema.validate(value, PERSON)
        assert value["name"] == "Alice" and value["age"] == 31
        assert body["choices"][0]["finish_reason"] == "stop", "even with no max_tokens and a run-to-length engine"
        assert body["usage"]["completion_tokens"] == tokenizer.count_text(content)
    content, _, finish, usage = assembled(stream)
    assert content[0] == whole.json()["choices"][0]["message"]["content"] and finish == {0: "stop"}
    assert usage["completion_tokens"] == whole.json()["usage"]["completion_tokens"]
    assert json.loads(loose.json()["choices"][0]["message"]["content"]) == {"name": "Bob", "age": 40}
    jsonschema.validate(json.loads(completion.json()["choices"][0]["text"]), PERSON)


def test_a_cut_structured_answer_is_length_and_not_valid() -> None:
    form = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    body = ask([chat("Alice is 31", response_format=form, max_tokens=4)])[0].json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(body["choices"][0]["message"]["content"])


def test_n_answers_each_their_own_whole_and_streamed() -> None:
    body = chat("Name a colour", n=3, max_tokens=8)
    whole, again, stream = ask([body, body, streaming(body)])
    answer = whole.json()
    texts = [c["message"]["content"] for c in answer["choices"]]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2] and len(set(texts)) == 3
    assert [c["message"]["content"] for c in again.json()["choices"]] == texts, "the same request, the same answers"
    assert answer["usage"]["completion_tokens"] == 24 and answer["usage"]["prompt_tokens"] == \
        ask([chat("Name a colour", max_tokens=8)])[0].json()["usage"]["prompt_tokens"], "the prompt counts once"
    assert texts[0] == ask([chat("Name a colour", max_tokens=8)])[0].json()["choices"][0]["message"]["content"]
    content, _, finish, usage = assembled(stream)
    assert content == dict(enumerate(texts)) and finish == {0: "length", 1: "length", 2: "length"}
    assert usage["completion_tokens"] == 24
    roles = [c for c in chunks(stream) if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert sorted(c["choices"][0]["index"] for c in roles) == [0, 1, 2]


def test_prompt_lists_and_token_ids_one_choice_each_in_order() -> None:
    prompts = ["the queue", "the cache is warm", "a batch"]
    listed, ids, id_lists, per_prompt, stream = ask([
        {"path": "/v1/completions", "prompt": prompts, "max_tokens": 5},
        {"path": "/v1/completions", "prompt": [5, 6, 7, 8], "max_tokens": 2},
        {"path": "/v1/completions", "prompt": [[5, 6], [7, 8, 9]], "max_tokens": 2},
        {"path": "/v1/completions", "prompt": prompts[:2], "n": 2, "max_tokens": 3},
        streaming({"path": "/v1/completions", "prompt": prompts[:2], "n": 2, "max_tokens": 3})])
    body = listed.json()
    alone = [ask([{"path": "/v1/completions", "prompt": p, "max_tokens": 5}])[0].json() for p in prompts]
    assert [c["text"] for c in body["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == sum(tokenizer.count_text(p) for p in prompts)
    assert body["usage"]["completion_tokens"] == 15
    assert ids.json()["usage"]["prompt_tokens"] == 4 and id_lists.json()["usage"]["prompt_tokens"] == 5
    assert len(id_lists.json()["choices"]) == 2
    body = per_prompt.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3] and body["usage"]["completion_tokens"] == 12
    assert body["usage"]["prompt_tokens"] == sum(tokenizer.count_text(p) for p in prompts[:2])
    texts: dict[int, str] = {}
    for chunk in chunks(stream):
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {c["index"]: c["text"] for c in body["choices"]}


def test_logprobs_chat_and_completions_with_echo() -> None:
    lp_chat, lp_stream, lp_plain, completion, echoed = ask([
        chat("Say something", max_tokens=5, logprobs=True, top_logprobs=3),
        streaming(chat("Say something", max_tokens=5, logprobs=True, top_logprobs=3)),
        chat("Say something", max_tokens=5, logprobs=True),
        {"path": "/v1/completions", "prompt": "the queue", "max_tokens": 4, "logprobs": 2},
        {"path": "/v1/completions", "prompt": "the queue", "max_tokens": 2, "logprobs": 1, "echo": True}])
    choice = lp_chat.json()["choices"][0]
    entries = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == choice["message"]["content"] and len(entries) == 5
    for entry in entries:
        assert -20 < entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["token"] == entry["token"]
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True) and len({t["token"] for t in entry["top_logprobs"]}) == 3
    streamed = [e for c in chunks(lp_stream) if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == entries, "the same values streamed"
    assert all(e["top_logprobs"] == [] for e in lp_plain.json()["choices"][0]["logprobs"]["content"])
    logprobs = completion.json()["choices"][0]["logprobs"]
    assert "".join(logprobs["tokens"]) == completion.json()["choices"][0]["text"]
    assert all(len(top) == 3 and token in top for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"],
                                                                   strict=True))
    assert logprobs["text_offset"][0] == 0 and all(v < 0 for v in logprobs["token_logprobs"])
    body = echoed.json()["choices"][0]
    assert body["text"].startswith("the queue") and body["logprobs"]["token_logprobs"][0] is None
    assert body["logprobs"]["text_offset"] == [0, 3, 9, 9 + len(body["logprobs"]["tokens"][2])]
    assert echoed.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("body, param", [
    (chat("x", n=0), None), (chat("x", n=20_000), None), (chat("x", n=2, temperature=0), None),
    (chat("x", logprobs=True, top_logprobs=21), "logprobs"), (chat("x", top_logprobs=2), "top_logprobs"),
    ({"path": "/v1/completions", "prompt": "x", "logprobs": 21}, "logprobs"),
    (chat("x", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (chat("x", tool_choice="required"), "tool_choice"), (chat("x", tools=[]), "tools"),
    (chat("x", tools=[{"type": "function"}]), "tools"), (chat("x", tools=[WEATHER], tool_choice="sometimes"),
                                                         "tool_choice"),
    ({"path": "/v1/completions", "prompt": []}, None), ({"path": "/v1/completions", "prompt": ["a", ""]}, None),
    ({"path": "/v1/completions", "prompt": [1, 99_999]}, None), ({"path": "/v1/completions", "prompt": [1, "a"]},
                                                                 "prompt"),
    (chat("x", response_format={"type": "json_schema"}), "response_format"),
    (chat("x", response_format={"type": "xml"}), "response_format"),
    (chat("x", response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "integer", "minimum": 3, "maximum": 1}}}), "response_format"),
    (chat("x", stream_options={"include_usage": True}), "stream_options"),
])
def test_what_vllm_refuses_is_a_400_naming_its_param(body: dict[str, Any], param: str | None) -> None:
    answer = ask([body])[0]
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param and answer.json()["error"]["type"] == "BadRequestError"


# -- hostile requests: what a schema, n or logprobs ask for is bounded as vLLM bounds it --------------------------

def schema_form(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "bomb", "schema": schema}}


BOMBS = {
    "ten million items": {"type": "array", "minItems": 10_000_000},
    "a string of a petabyte": {"type": "string", "minLength": 10**15},
    "nested arrays": {"type": "array", "minItems": 10**6, "items": {"type": "array", "minItems": 10**6, "items": {
        "type": "array", "minItems": 10**6}}},
    "a billion properties": {"type": "object", "additionalProperties": {"type": "string", "minLength": 10**9},
                             "minProperties": 10**9},
    "a $ref tree a thousand wide": {"$defs": {"t": {"type": "object", "properties": {"label": {"type": "string"},
                                                                                    "children": {
        "type": "array", "minItems": 1000, "items": {"$ref": "#/$defs/t"}}}, "required": ["label"]}},
        "$ref": "#/$defs/t"},
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_schema_bomb_is_answered_within_max_tokens_whole_and_streamed(name: str) -> None:
    """What a schema asks for is written as far as max_tokens, cut there with "length" as vLLM cuts it: the
    usage is max_tokens, the content as long as those tokens and no longer; streamed alike. Without max_tokens,
    a chat answer's budget is the rest of the context."""
    body = chat("Make it", response_format=schema_form(BOMBS[name]), max_tokens=300)
    small = replace(ZERO, max_model_len=1024)
    whole, stream, unbounded = ask([body, streaming(body), chat("Make it", response_format=schema_form(BOMBS[name]))],
                                   small)
    answer = whole.json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 300
    content = choice["message"]["content"]
    assert tokenizer.count_text(content) == 300 and len(content) <= 26 * 300
    streamed, _, finish, usage = assembled(stream)
    assert streamed == {0: content} and finish == {0: "length"} and usage["completion_tokens"] == 300
    rest = unbounded.json()
    assert rest["choices"][0]["finish_reason"] == "length"
    assert rest["usage"]["completion_tokens"] == 1024 - rest["usage"]["prompt_tokens"]


def test_n_answers_to_a_schema_bomb_each_stop_at_max_tokens() -> None:
    body = chat("Make it", n=8, max_tokens=50, response_format=schema_form(BOMBS["ten million items"]))
    answer = ask([body])[0].json()
    assert [c["finish_reason"] for c in answer["choices"]] == ["length"] * 8
    assert answer["usage"]["completion_tokens"] == 400


def test_a_tool_whose_parameters_are_a_bomb_is_called_within_max_tokens() -> None:
    bomb = {"type": "function", "function": {"name": "fill", "description": "Fill the table", "parameters": {
        "type": "object", "properties": {"rows": {"type": "array", "minItems": 10**8, "items": {"type": "integer"}}},
        "required": ["rows"]}}}
    named, required = ask([
        chat("Fill the table", tools=[bomb], max_tokens=120,
             tool_choice={"type": "function", "function": {"name": "fill"}}),
        chat("Fill the table", tools=[bomb], max_tokens=120, tool_choice="required")])
    choice = named.json()["choices"][0]
    assert choice["finish_reason"] == "length" and named.json()["usage"]["completion_tokens"] == 120
    assert choice["message"]["tool_calls"][0]["function"]["arguments"].startswith('{"rows": [')
    choice = required.json()["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"], "a list cut short is no call"


def test_a_whole_answer_larger_than_its_parts_is_the_same_answer_as_the_stream() -> None:
    """64 answers of 200 tokens with 20 logprobs each (megabytes of JSON) come whole as they come streamed: the
    same content and the same logprob entries, token for token."""
    body = chat("Say many things", n=64, max_tokens=200, ignore_eos=True, logprobs=True, top_logprobs=20)
    whole, stream = ask([body, streaming(body)])
    assert len(whole.content) > 1 << 20
    answer = whole.json()
    content, _, finish, usage = assembled(stream)
    assert content == {c["index"]: c["message"]["content"] for c in answer["choices"]}
    assert finish == dict.fromkeys(range(64), "length") and usage["completion_tokens"] == 64 * 200
    entries: dict[int, list[Any]] = {}
    for chunk in chunks(stream):
        for choice in chunk["choices"]:
            entries.setdefault(choice["index"], []).extend((choice["logprobs"] or {}).get("content") or [])
    assert entries == {c["index"]: c["logprobs"]["content"] for c in answer["choices"]}
    assert all(len(e["top_logprobs"]) == 20 for c in answer["choices"] for e in c["logprobs"]["content"])


def test_completion_logprobs_and_an_echos_prompt_logprobs_whole_are_the_streams() -> None:
    body = {"path": "/v1/completions", "prompt": "the queue is long and the cache is warm", "n": 3,
            "max_tokens": 40, "ignore_eos": True, "logprobs": 4, "echo": True}
    whole, stream = ask([body, streaming(body)])
    answer = whole.json()
    got: dict[int, dict[str, list[Any]]] = {}
    for chunk in chunks(stream):
        for choice in chunk["choices"]:
            lists = got.setdefault(choice["index"], {"tokens": [], "token_logprobs": [], "top_logprobs": []})
            for key in lists:
                lists[key] += choice["logprobs"][key]
    prompt_tokens = len(tokenizer.pieces(body["prompt"]))
    for choice in answer["choices"]:
        logprobs = choice["logprobs"]
        assert {k: logprobs[k] for k in ("tokens", "token_logprobs", "top_logprobs")} == got[choice["index"]]
        assert len(logprobs["tokens"]) == prompt_tokens + 40 and len(choice["prompt_logprobs"]) == prompt_tokens
        for top, entry in zip(logprobs["top_logprobs"][1:prompt_tokens], choice["prompt_logprobs"][1:], strict=True):
            assert sorted(v["logprob"] for v in entry.values()) == sorted(top.values())


@pytest.mark.parametrize("body, param", [
    (chat("x", logprobs=True, top_logprobs=21), "logprobs"),
    (chat("x", logprobs=True, top_logprobs=-1), "logprobs"),
    ({"path": "/v1/completions", "prompt": "x", "logprobs": 21}, "logprobs"),
    ({"path": "/v1/completions", "prompt": "x", "logprobs": 21, "echo": True}, "logprobs"),
    (chat("x", prompt_logprobs=21), "prompt_logprobs"),
    (chat("x", prompt_logprobs=-1), "prompt_logprobs"),
    (chat("x", prompt_logprobs=-2), "prompt_logprobs"),
    (chat("x", prompt_logprobs="5"), "prompt_logprobs"),
    (streaming(chat("x", prompt_logprobs=2)), "prompt_logprobs"),
    ({"path": "/v1/completions", "prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    (chat("x", n=16385), None),
])
def test_logprobs_and_n_above_vllms_limits_are_its_400s(body: dict[str, Any], param: str | None) -> None:
    """vLLM's limits: 20 logprobs (its --max-logprobs default; -1 is the whole vocabulary), prompt logprobs alike
    and never streamed, n at most 16384 (VLLM_MAX_N_SEQUENCES)."""
    answer = ask([body])[0]
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_max_logprobs_moves_the_limit_as_vllms_flag_does() -> None:
    five = replace(ZERO, max_logprobs=5)
    every = replace(ZERO, max_logprobs=-1)
    at, above, prompt = ask([chat("x", max_tokens=2, logprobs=True, top_logprobs=5),
                             chat("x", max_tokens=2, logprobs=True, top_logprobs=6),
                             chat("x", max_tokens=2, prompt_logprobs=6)], five)
    assert at.status_code == 200 and len(at.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 5
    assert above.status_code == prompt.status_code == 400
    assert "greater than max allowed: 5" in above.json()["error"]["message"]
    assert ask([chat("x", max_tokens=1, logprobs=True, top_logprobs=40)], every)[0].status_code == 200
