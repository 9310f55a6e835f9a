"""The simulator answers as real vLLM does, field for field: for the same requests, the JSON of its answers (and of
every kind of chunk it streams) has the same keys holding values of the same types as vLLM's on the CPU, and it
refuses what vLLM refuses with the same status and param.

The model has random weights, so texts are compared by type only. The session's engine (``vllm_server``) has no
tool parser, and vLLM 0.32 then refuses every ``tool_choice`` but "none": the tool calls are compared with an
engine of this module's own, started with ``--enable-auto-tool-choice --tool-call-parser pythonic`` (a parser that
needs no special tokens, which the tiny tokenizer lacks) and xgrammar without free whitespace, so that with tools
whose parameters are enums and booleans a call always ends within the token budget. "auto" is not compared: which
tool a random model calls, if any, is chance."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Proc

pytestmark = pytest.mark.vllm

MODEL = "tiny-llama"
MAX_LEN = 2048
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                                    "metric": {"type": "boolean"}},
                   "required": ["unit", "metric"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "b"]}},
          "required": ["ok", "kind"], "additionalProperties": False}
COMPLETIONS = "/v1/completions"


def ask(question: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}], **extra}


PLAIN = {  # the session's engine
    "json_schema": ask("Is it a or b?", response_format={"type": "json_schema", "json_schema": {
        "name": "kind", "schema": SCHEMA, "strict": True}}, max_tokens=40),
    "json_object": ask("Answer in JSON", response_format={"type": "json_object"}, max_tokens=20),
    "n2": ask("Say two things", n=2, max_tokens=4, ignore_eos=True),
    "logprobs": ask("Say something", logprobs=True, top_logprobs=3, max_tokens=4, ignore_eos=True),
    "logprobs_alone": ask("Say something else", logprobs=True, max_tokens=3, ignore_eos=True),
    "n2_logprobs": ask("Two with logprobs", n=2, logprobs=True, top_logprobs=1, max_tokens=3, ignore_eos=True),
    "prompt_list": {"path": COMPLETIONS, "prompt": ["hello there", "the model"], "max_tokens": 3, "ignore_eos": True},
    "token_ids": {"path": COMPLETIONS, "prompt": [10, 20, 30], "max_tokens": 3, "ignore_eos": True},
    "token_id_lists": {"path": COMPLETIONS, "prompt": [[10, 20, 30], [40, 50]], "max_tokens": 3, "ignore_eos": True},
    "prompts_n2": {"path": COMPLETIONS, "prompt": ["hello there", "x y"], "n": 2, "max_tokens": 2, "ignore_eos": True},
    "completion_logprobs": {"path": COMPLETIONS, "prompt": "the queue", "logprobs": 2, "max_tokens": 3,
                            "ignore_eos": True},
    "echo": {"path": COMPLETIONS, "prompt": "the cache", "echo": True, "max_tokens": 2, "ignore_eos": True},
    "echo_logprobs": {"path": COMPLETIONS, "prompt": "the batch", "echo": True, "logprobs": 1, "max_tokens": 2,
                      "ignore_eos": True},
}
TOOLS = {  # this module's engine with a tool parser
    "named": ask("What is the weather in Paris?", tools=[WEATHER], max_tokens=200,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    "required": ask("What is the weather in Rome?", tools=[WEATHER], tool_choice="required", max_tokens=300,
                    parallel_tool_calls=False),
    "named_logprobs": ask("Weather in Oslo?", tools=[WEATHER], max_tokens=200, logprobs=True, top_logprobs=2,
                          tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    "named_n2": ask("Weather in Lima?", tools=[WEATHER], max_tokens=200, n=2,
                    tool_choice={"type": "function", "function": {"name": "get_weather"}}),
}
REFUSED = {
    "n0": ask("x", n=0), "n_above_the_limit": ask("x", n=20000), "n2_greedy": ask("x", n=2, temperature=0),
    "top_logprobs_21": ask("x", logprobs=True, top_logprobs=21), "top_logprobs_alone": ask("x", top_logprobs=2),
    "top_logprobs_negative": ask("x", logprobs=True, top_logprobs=-2),
    "completion_logprobs_21": {"path": COMPLETIONS, "prompt": "x", "logprobs": 21},
    "unknown_tool": ask("x", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
    "tool_choice_without_tools": ask("x", tool_choice="required"),
    "empty_tools": ask("x", tools=[]),
    "no_prompt": {"path": COMPLETIONS, "prompt": []},
    "empty_prompt_in_list": {"path": COMPLETIONS, "prompt": ["a", ""]},
    "token_out_of_vocabulary": {"path": COMPLETIONS, "prompt": [1, 99999]},
    "json_schema_without_schema": ask("x", response_format={"type": "json_schema"}),
    "stream_options_without_stream": ask("x", stream_options={"include_usage": True}),
}


@pytest.fixture(scope="module")
def tool_vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from workers.vllm.cpu import start_vllm_cpu

    log = tmp_path_factory.mktemp("vllm-tools") / "vllm.log"
    server = start_vllm_cpu(model_dir=tiny_model, max_model_len=MAX_LEN, log_path=log, extra_args=[
        "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
        "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    from loadtest import procs

    proc = procs.start_sim(tmp_path_factory.mktemp("sim"), "--max-model-len", str(MAX_LEN), "--zero-delay",
                           "--mean-output-tokens", "80", model=MODEL)
    yield proc
    proc.kill()


def post(url: str, body: dict[str, Any], stream: bool = False) -> Any:
    body = dict(body)
    path = body.pop("path", "/v1/chat/completions")
    body = {"model": MODEL, "seed": 7, **body}
    if not stream:
        return httpx.post(url + path, json=body, timeout=120)
    body.update(stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", url + path, json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        text = response.read().decode()
    assert text.endswith("data: [DONE]\n\n")
    return [json.loads(event[6:]) for event in text.split("\n\n") if event.startswith("data: {")]


def shape(value: Any, key: str = "") -> Any:
    """The keys and value types of a JSON value; a list is the set of its items' shapes; a completion's
    ``top_logprobs`` entries (keyed by token) and ``prompt_logprobs`` entries (by token id) are maps."""
    if isinstance(value, dict):
        if key == "map":
            return ("map", tuple(sorted({json.dumps(shape(v)) for v in value.values()})))
        return {k: shape(v, "map" if k in ("prompt_logprobs",) or (k == "top_logprobs" and "tokens" in value)
                         else k) for k, v in value.items()}
    if isinstance(value, list):
        items: list[Any] = []
        for item in value:
            if shape(item, key) not in items:
                items.append(shape(item, key))
        return ["list", items]
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else type(value).__name__


def differences(ours: Any, theirs: Any, where: str = "") -> list[str]:
    """Where two shapes differ; an empty list fits any (vLLM's ``bytes`` of a token that decodes to nothing)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = [f"{where}.{k}: only the simulator's" for k in ours.keys() - theirs.keys()]
        out += [f"{where}.{k}: only vLLM's" for k in theirs.keys() - ours.keys()]
        for k in ours.keys() & theirs.keys():
            out += differences(ours[k], theirs[k], f"{where}.{k}")
        return out
    if isinstance(ours, list) and isinstance(theirs, list) and ours[0] == theirs[0] == "list":
        if not ours[1] or not theirs[1]:
            return []
        fits = all(any(not differences(a, b, where) for b in theirs[1]) for a in ours[1]) and \
            all(any(not differences(a, b, where) for a in ours[1]) for b in theirs[1])
        return [] if fits else [f"{where}: items {ours[1]} != {theirs[1]}"]
    return [] if ours == theirs else [f"{where}: {ours} != {theirs}"]


def without_cached_details(body: dict[str, Any]) -> dict[str, Any]:
    """The usage without ``prompt_tokens_details``: the simulator reports its prefix cache's hits there, as vLLM
    does with ``--enable-prompt-tokens-details``, which the engines here are not started with."""
    usage = body.get("usage")
    if isinstance(usage, dict):
        body = {**body, "usage": {k: v for k, v in usage.items() if k != "prompt_tokens_details"}}
    return body


def kinds(chunks: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A stream's chunks by kind (the role chunk, a token, the end of a choice, the usage), each kind's shapes."""
    out: dict[str, list[Any]] = {}
    for chunk in chunks:
        choice = (chunk.get("choices") or [{}])[0]
        kind = ("usage" if not chunk["choices"] else "role" if "role" in choice.get("delta", {})
                else "finish" if choice.get("finish_reason") else "token")
        found = shape(without_cached_details(chunk))
        if found not in out.setdefault(kind, []):
            out[kind].append(found)
    return out


def same_stream(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[str]:
    """Every kind of chunk vLLM sent, the simulator sent in a shape that fits, and no kind vLLM did not."""
    a, b = kinds(ours), kinds(theirs)
    out = [f"{kind}: only the simulator's" for kind in a.keys() - b.keys()]
    out += [f"{kind}: only vLLM's" for kind in b.keys() - a.keys()]
    for kind in a.keys() & b.keys():
        for mine in a[kind]:
            if all(differences(mine, other, kind) for other in b[kind]):
                out.append(f"{kind}: {differences(mine, b[kind][0], kind)}")
    return out


def compare(sim_url: str, vllm_url: str, body: dict[str, Any]) -> None:
    ours, theirs = post(sim_url, body), post(vllm_url, body)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    found = differences(shape(without_cached_details(ours.json())), shape(without_cached_details(theirs.json())))
    assert not found, (found, ours.json(), theirs.json())
    assert not same_stream(post(sim_url, body, stream=True), post(vllm_url, body, stream=True))


@pytest.mark.parametrize("name", list(PLAIN))
def test_answers_have_vllms_fields_whole_and_streamed(name: str, sim: Proc, vllm_server: Any) -> None:
    compare(sim.url, vllm_server.url, PLAIN[name])


@pytest.mark.parametrize("name", list(TOOLS))
def test_tool_calls_have_vllms_fields_whole_and_streamed(name: str, sim: Proc, tool_vllm: Any) -> None:
    compare(sim.url, tool_vllm.url, TOOLS[name])
    ours, theirs = post(sim.url, TOOLS[name]).json(), post(tool_vllm.url, TOOLS[name]).json()
    assert [c["finish_reason"] for c in ours["choices"]] == [c["finish_reason"] for c in theirs["choices"]], \
        "a named tool ends with stop, a required one with tool_calls"
    assert all(c["message"]["tool_calls"] for c in ours["choices"] + theirs["choices"])


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_vllm_refuses_the_simulator_refuses_alike(name: str, sim: Proc, vllm_server: Any) -> None:
    ours, theirs = post(sim.url, REFUSED[name]), post(vllm_server.url, REFUSED[name])
    assert ours.status_code == theirs.status_code == 400, (ours.text, theirs.text)
    assert ours.json()["error"]["param"] == theirs.json()["error"]["param"]
    assert ours.json()["error"]["type"] == theirs.json()["error"]["type"] == "BadRequestError"


def test_the_shape_comparison_finds_a_missing_field(sim: Proc) -> None:
    """Positive control: a field taken away, or a type changed, is found."""
    body = post(sim.url, PLAIN["n2"]).json()
    broken = {**body, "choices": [{k: v for k, v in c.items() if k != "stop_reason"} for c in body["choices"]]}
    assert differences(shape(broken), shape(body)) == [".choices: items " + str(shape(broken)["choices"][1])
                                                       + " != " + str(shape(body)["choices"][1])]
    assert differences(shape({"a": 1}), shape({"a": "1"})) == [".a: number != str"]
