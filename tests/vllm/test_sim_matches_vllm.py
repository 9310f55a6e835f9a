"""The simulator answers as real vLLM does, field for field: for the same requests, the JSON of its answers (and of
every kind of chunk it streams) has the same keys holding values of the same types as vLLM's on the CPU, and it
refuses what vLLM refuses with the same status and param. A stream is compared as a client reads it (each choice's
roles, content, finish reason and the usage, put together), not by how the tokens were grouped into chunks: vLLM
merges a choice's tokens into fewer chunks when its engine gets ahead of its API server, which is timing.

The model has random weights, so texts are compared by type only. The session's engine (``vllm_server``) has no
tool parser, and vLLM 0.32 then refuses every ``tool_choice`` but "none": the tool calls are compared with an
engine of this module's own, started with ``--enable-auto-tool-choice --tool-call-parser pythonic`` (a parser that
needs no special tokens, which the tiny tokenizer lacks) and xgrammar without free whitespace, so that with tools
whose parameters are enums and booleans a call always ends within the token budget. "auto" is not compared: which
tool a random model calls, if any, is chance."""

from __future__ import annotations

import copy
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
    "top_logprobs_all": ask("x", logprobs=True, top_logprobs=-1),
    "prompt_logprobs_21": ask("x", prompt_logprobs=21),
    "prompt_logprobs_negative": ask("x", prompt_logprobs=-2),
    "prompt_logprobs_streamed": ask("x", prompt_logprobs=2, stream=True),
    "completion_prompt_logprobs_21": {"path": COMPLETIONS, "prompt": "x", "prompt_logprobs": 21},
    "completion_echo_logprobs_21": {"path": COMPLETIONS, "prompt": "x", "echo": True, "logprobs": 21},
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
    from loadtest.harness import procs

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


GROUPED = {"token"}  # kinds a stream may lack: vLLM merges a choice's tokens into its last chunk when it falls behind


def assembled(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client puts together from a stream, whatever chunks the tokens came in: per choice (by index) the
    roles its deltas named, whether the first of its chunks named one, its content (chat) or text (completions)
    joined, its logprob entries counted, its tool calls (name and arguments joined, by call index), its finish
    reasons (each one given) and whether its last chunk gave one; and the usage."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            view = choices.setdefault(choice["index"], {"roles": [], "role_first": None, "content": "",
                                                        "logprobs": 0, "calls": {}, "finish": [],
                                                        "finish_last": False})
            delta = choice.get("delta", {})
            if view["role_first"] is None:
                view["role_first"] = "role" in delta
            if "role" in delta:
                view["roles"].append(delta["role"])
            view["content"] += delta.get("content") or choice.get("text") or ""
            logprobs = choice.get("logprobs") or {}
            view["logprobs"] += len(logprobs.get("content") or logprobs.get("tokens") or ())
            for call in delta.get("tool_calls") or ():
                slot = view["calls"].setdefault(call["index"], {"name": "", "arguments": ""})
                slot["name"] += call.get("function", {}).get("name") or ""
                slot["arguments"] += call.get("function", {}).get("arguments") or ""
            if choice.get("finish_reason"):
                view["finish"].append(choice["finish_reason"])
            view["finish_last"] = bool(choice.get("finish_reason"))
    return {"choices": choices, "usage": usage}


def whole_view(body: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The same facts from a whole answer, per choice: content (or text), logprob entries, calls, finish reason."""
    out = {}
    for choice in body["choices"]:
        message = choice.get("message") or {}
        logprobs = choice.get("logprobs") or {}
        calls = {i: {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for i, c in enumerate(message.get("tool_calls") or ())}
        out[choice["index"]] = {"content": message.get("content") or choice.get("text") or "",
                                "logprobs": len(logprobs.get("content") or logprobs.get("tokens") or ()),
                                "calls": calls, "finish": [choice["finish_reason"]]}
    return out


def same_stream(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], our_whole: dict[str, Any],
                request: dict[str, Any]) -> list[str]:
    """Where the simulator's stream tells a client something other than vLLM's, or other than its own whole answer.

    Not how tokens are grouped into chunks (vLLM's grouping depends on timing): every kind of chunk both sent has
    a shape that fits, and only a token chunk may be missing from one side; each choice has the same roles, its
    role first, one finish reason in its last chunk, tool calls where vLLM's has them, and there is a usage.
    Where lengths are fixed (``ignore_eos``) the finish reasons, the logprob entries per choice (unless an echo's
    prompt is counted in them) and the completion tokens are the same numbers. The simulator's stream, put
    together, is its whole answer: each choice's content, calls, logprob entries and finish reason, and the
    completion tokens."""
    a, b = kinds(ours), kinds(theirs)
    out = [f"{kind}: only the simulator's" for kind in a.keys() - b.keys() - GROUPED]
    out += [f"{kind}: only vLLM's" for kind in b.keys() - a.keys() - GROUPED]
    for kind in a.keys() & b.keys():
        for mine in a[kind]:
            if all(differences(mine, other, kind) for other in b[kind]):
                out.append(f"{kind}: {differences(mine, b[kind][0], kind)}")
    mine, vllms = assembled(ours), assembled(theirs)
    if mine["choices"].keys() != vllms["choices"].keys():
        return [*out, f"choices {sorted(mine['choices'])} != vLLM's {sorted(vllms['choices'])}"]
    fixed = bool(request.get("ignore_eos"))
    for index, view in mine["choices"].items():
        other = vllms["choices"][index]
        for key in ("roles", "role_first", "finish_last"):
            if view[key] != other[key]:
                out.append(f"choice {index} {key}: {view[key]} != vLLM's {other[key]}")
        if len(view["finish"]) != 1 or [type(r) for r in view["finish"]] != [type(r) for r in other["finish"]]:
            out.append(f"choice {index} finish reasons: {view['finish']} != vLLM's {other['finish']}")
        if bool(view["calls"]) != bool(other["calls"]):
            out.append(f"choice {index} calls: {view['calls']} against vLLM's {other['calls']}")
        if fixed and view["finish"] != other["finish"]:
            out.append(f"choice {index} finish reasons: {view['finish']} != vLLM's {other['finish']}")
        if fixed and not request.get("echo") and view["logprobs"] != other["logprobs"]:
            out.append(f"choice {index} logprob entries: {view['logprobs']} != vLLM's {other['logprobs']}")
    if mine["usage"] is None or vllms["usage"] is None:
        out.append(f"usage: {mine['usage']} against vLLM's {vllms['usage']}")
    elif fixed and mine["usage"]["completion_tokens"] != vllms["usage"]["completion_tokens"]:
        out.append(f"completion tokens: {mine['usage']} != vLLM's {vllms['usage']}")
    whole = whole_view(our_whole)
    for index, view in mine["choices"].items():
        streamed = {key: view[key] for key in ("content", "logprobs", "calls", "finish")}
        if streamed != whole.get(index):
            out.append(f"choice {index} streamed: {streamed} != whole: {whole.get(index)}")
    if mine["usage"] and mine["usage"]["completion_tokens"] != our_whole["usage"]["completion_tokens"]:
        out.append(f"completion tokens streamed {mine['usage']} != whole {our_whole['usage']}")
    return out


def compare(sim_url: str, vllm_url: str, body: dict[str, Any]) -> None:
    ours, theirs = post(sim_url, body), post(vllm_url, body)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    found = differences(shape(without_cached_details(ours.json())), shape(without_cached_details(theirs.json())))
    assert not found, (found, ours.json(), theirs.json())
    found = same_stream(post(sim_url, body, stream=True), post(vllm_url, body, stream=True), ours.json(), body)
    assert not found, found


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


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_that_asks_for_more_than_max_tokens_is_cut_there_as_vllm_cuts_it(stream: bool, sim: Proc,
                                                                                   vllm_server: Any) -> None:
    """A schema whose least answer is longer than max_tokens: both end with "length" after max_tokens tokens."""
    body = ask("List them", max_tokens=8, response_format={"type": "json_schema", "json_schema": {
        "name": "many", "schema": {"type": "array", "items": {"type": "boolean"}, "minItems": 1000}}})
    if stream:
        found = [assembled(post(url, body, stream=True)) for url in (sim.url, vllm_server.url)]
        assert [(v["choices"][0]["finish"], v["usage"]["completion_tokens"]) for v in found] == [(["length"], 8)] * 2
    else:
        found = [post(url, body).json() for url in (sim.url, vllm_server.url)]
        assert [(b["choices"][0]["finish_reason"], b["usage"]["completion_tokens"]) for b in found] == \
            [("length", 8)] * 2


def test_the_shape_comparison_finds_a_missing_field(sim: Proc) -> None:
    """Positive control: a field taken away, or a type changed, is found."""
    body = post(sim.url, PLAIN["n2"]).json()
    broken = {**body, "choices": [{k: v for k, v in c.items() if k != "stop_reason"} for c in body["choices"]]}
    assert differences(shape(broken), shape(body)) == [".choices: items " + str(shape(broken)["choices"][1])
                                                       + " != " + str(shape(body)["choices"][1])]
    assert differences(shape({"a": 1}), shape({"a": "1"})) == [".a: number != str"]


def regrouped(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat stream as vLLM sends it when its engine gets ahead of its API server: each choice's tokens merged
    into the chunk that ends it (content joined, logprob entries in order)."""
    out: list[dict[str, Any]] = []
    held: dict[int, list[dict[str, Any]]] = {}
    for chunk in chunks:
        choice = (chunk["choices"] or [{}])[0]
        if not chunk["choices"] or "role" in choice["delta"]:
            out.append(chunk)
        elif not choice["finish_reason"]:
            held.setdefault(choice["index"], []).append(choice)
        else:
            merged = copy.deepcopy(chunk)
            last = merged["choices"][0]
            parts = [*held.pop(choice["index"], []), choice]
            last["delta"]["content"] = "".join(p["delta"].get("content") or "" for p in parts)
            if last["logprobs"] is not None:
                last["logprobs"]["content"] = [e for p in parts for e in p["logprobs"]["content"]]
            out.append(merged)
    return out


def test_the_stream_comparison_ignores_grouping_and_finds_what_a_client_would_miss(sim: Proc) -> None:
    """Positive control: the same tokens in fewer chunks compare alike; a choice's role or finish reason left
    out, a piece sent under the other choice's index, or a piece lost, are found."""
    body = PLAIN["n2_logprobs"]
    whole, stream = post(sim.url, body).json(), post(sim.url, body, stream=True)
    grouped = regrouped(stream)
    assert "token" in kinds(stream) and "token" not in kinds(grouped) and len(grouped) < len(stream)
    assert not same_stream(stream, grouped, whole, body) and not same_stream(grouped, stream, whole, body)

    def role(chunk: dict[str, Any]) -> bool:
        return bool(chunk["choices"]) and "role" in chunk["choices"][0]["delta"]

    tokens = [i for i, c in enumerate(stream) if c["choices"] and not role(c) and not c["choices"][0]["finish_reason"]]
    no_role = [c for c in stream if not (role(c) and c["choices"][0]["index"] == 1)]
    no_finish = copy.deepcopy(stream)
    next(c for c in no_finish if c["choices"] and c["choices"][0]["finish_reason"])["choices"][0][
        "finish_reason"] = None
    swapped = copy.deepcopy(stream)
    swapped[tokens[0]]["choices"][0]["index"] = 1 - swapped[tokens[0]]["choices"][0]["index"]
    lost = [c for i, c in enumerate(stream) if i != tokens[0]]
    for name, broken in (("role", no_role), ("finish", no_finish), ("swapped", swapped), ("lost", lost)):
        assert same_stream(broken, stream, whole, body), name
        assert same_stream(broken, grouped, whole, body), name
