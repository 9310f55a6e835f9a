"""A chat or completions request's parameters, checked as vLLM 0.32 checks them (the same refusals, with the
param named and vLLM's own words), and turned into the request's prompts and choices: ``n`` answers per prompt,
each its own sequence on the engine (its own seed), with its tool calls or structured content to write (its
script, read by the engine as it writes; the first answer's is made here up to its budget, so that a schema
nothing satisfies is refused). Limits are vLLM's: n at most VLLM_MAX_N_SEQUENCES (16384), logprobs and prompt
logprobs at most --max-logprobs (20).

vLLM refuses ``tool_choice`` unless it was started with a tool parser (and "auto" unless also with
``--enable-auto-tool-choice``); the simulator answers as a server started with both would."""

from __future__ import annotations

import asyncio
import json
import os
import random
import uuid
import zlib
from typing import Any

from workers.sim import canonical, structured, tokenizer
from workers.sim.answers import Ask, Choice, Prompt
from workers.sim.engine import EngineConfig, Sequence, block_hashes
from workers.sim.logprobs import Logprobs

MAX_N = int(os.environ.get("VLLM_MAX_N_SEQUENCES", "16384"))  # vLLM's limit of n, read as vLLM reads it
JSON_OBJECT = {"x-json-object": True}  # response_format json_object: the JSON the prompt asks for in words


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def plan(body: dict[str, Any], chat: bool, config: EngineConfig) -> tuple[Ask, list[Prompt], list[Choice]]:
    """The request's form, its prompts, and its choices (sequences not yet submitted)."""
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    if options and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`. (parameter=stream_options)",
                         param="stream_options")
    usage = options if isinstance(options, dict) else {}
    include_usage = bool(usage.get("include_usage"))
    ask = Ask(chat=chat, stream=stream, include_usage=include_usage,
              continuous_usage=include_usage and bool(usage.get("continuous_usage_stats")),
              logprobs=_logprobs(body, chat, config.max_logprobs), echo=not chat and bool(body.get("echo")))
    _prompt_logprobs(body, chat, stream, config.max_logprobs)
    n = _n(body)
    if chat:
        messages = check_messages(body)
        tools, tool_choice, parallel = _tools(body)
        prompts = [_chat_prompt(messages, tools)]
        asked = next((tokenizer.message_text(m.get("content")) for m in reversed(messages)
                      if m.get("role") == "user"), "")
        last_role = str(messages[-1].get("role", ""))
    else:
        tools, tool_choice, parallel = [], "none", True
        prompts = _prompts(body.get("prompt"))
        last_role = "user"
    schema = _structure(body, chat)
    fenced = False
    if chat and (schema == JSON_OBJECT or (schema is None and structured.wants_fenced_json(asked))):
        fenced = schema is None
        schema = structured.asked_schema([tokenizer.message_text(m.get("content")) for m in messages], asked)
    limits = _limits(body)
    if limits["priority"] and config.scheduling_policy != "priority":
        raise BadRequest("Priority scheduling is not enabled.", param="priority")
    asked_seed = body.get("seed")
    seed = asked_seed if isinstance(asked_seed, int) else config.seed
    salt = check_cache_salt(body)
    wake = asyncio.Event()  # one for the request: the answer waits for any of its choices
    request_id = uuid.uuid4().hex
    choices: list[Choice] = []
    mode = "named" if isinstance(tool_choice, dict) else str(tool_choice)
    param = "tools" if tool_choice != "none" else "response_format"
    for p, prompt in enumerate(prompts):
        max_tokens = _max_tokens(body, prompt.tokens, chat, config.max_model_len)
        question = asked if chat else prompt.text
        tool_plan = None
        if tool_choice != "none":
            tool_plan = structured.ToolPlan(tools, structured.choose(tools, tool_choice, parallel, question,
                                                                     last_role), question)
        understood = canonical.understand(question)
        words = understood.words
        meaning = tokenizer.meaning(prompt.text, question, understood.form)
        hashes = block_hashes(prompt.ids if prompt.ids is not None else tokenizer.token_ids(prompt.text),
                              config.block_size, salt)
        for j in range(n):
            key = meaning if j == 0 else f"{meaning}\x00{j}"
            side = zlib.crc32(key.encode()) ^ (seed & 0xFFFFFFFF)  # seeds what is not the text itself
            script = _script(tool_plan, mode, schema, question, random.Random(side), fenced)
            if script is not None:  # the first answer as far as it can go (the budget and one more), the others'
                _check_script(script, max_tokens + 1 if p == j == 0 else 1, param)  # first pieces: or a 400
            seq = Sequence(request_id=request_id if p == j == 0 else uuid.uuid4().hex, prompt_tokens=prompt.tokens,
                           max_tokens=max_tokens, rng=tokenizer.output_rng(seed, key), topic=words,
                           block_hashes=hashes, script=script, wake=wake, **limits)
            logprobs = None if ask.logprobs is None else Logprobs(side ^ 0x9E3779B9, ask.logprobs)
            choices.append(Choice(index=p * n + j, seq=seq, prompt=p, script=script, logprobs=logprobs))
    return ask, prompts, choices


def single(body: dict[str, Any], config: EngineConfig) -> Sequence:
    """The one sequence of a chat request the Responses API runs on the engine."""
    _, _, choices = plan({k: v for k, v in body.items() if k not in ("n", "stream", "stream_options")}, True,
                         config)
    return choices[0].seq


# -- prompts ----------------------------------------------------------------------------------------------------

def check_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if isinstance(messages, list) and not messages:
        raise BadRequest("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("'messages' must be a list of message objects.", param="messages")
    return messages


def _chat_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Prompt:
    """The chat prompt: its messages through the template, and the tools' definitions the template renders."""
    text, tokens = tokenizer.chat_prompt_text(messages), tokenizer.count_chat(messages)
    if tools:
        rendered = "\ntools: " + json.dumps(tools, ensure_ascii=False)
        text, tokens = text + rendered, tokens + tokenizer.count_text(rendered)
    return Prompt(text, tokens)


def _prompts(value: object) -> list[Prompt]:
    """A completions prompt as vLLM takes it: a string, strings, token ids, or lists of token ids."""
    if isinstance(value, str):
        if not value:
            raise BadRequest("'prompt' must be a non-empty string.", param="prompt")
        return [Prompt(value, tokenizer.count_text(value))]
    if not isinstance(value, list):
        raise BadRequest("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of "
                         "token ids.", param="prompt")
    if not value:
        raise BadRequest("You must pass at least one prompt")
    if all(_token_id(v) for v in value):
        return [_ids_prompt(value)]
    if all(isinstance(v, str) for v in value):
        if not all(value):
            raise BadRequest("The decoder prompt cannot be empty")
        return [Prompt(v, tokenizer.count_text(v)) for v in value]
    if all(isinstance(v, list) and all(_token_id(t) for t in v) for v in value):
        if not all(value):
            raise BadRequest("The decoder prompt cannot be empty")
        return [_ids_prompt(v) for v in value]
    raise BadRequest("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of "
                     "token ids.", param="prompt")


def _token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ids_prompt(ids: list[int]) -> Prompt:
    for token in ids:
        if token >= tokenizer.VOCAB_SIZE:
            raise BadRequest(f"Token id {token} is out of vocabulary")
    return Prompt(tokenizer.decode_ids(ids), len(ids), list(ids))


# -- sampling ---------------------------------------------------------------------------------------------------

def _n(body: dict[str, Any]) -> int:
    n: int | None = body.get("n")  # checked an int below
    if n is None:
        return 1
    check_int(n, "n", None)
    if n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise BadRequest(f"n must be at most {MAX_N}, got {n}. To increase this limit, set the "
                         "VLLM_MAX_N_SEQUENCES environment variable.")
    temperature = body.get("temperature")
    if n > 1 and isinstance(temperature, int | float) and temperature < 1e-5:
        raise BadRequest(f"n must be 1 when using greedy sampling, got {n}.")
    return n


def _logprobs(body: dict[str, Any], chat: bool, max_logprobs: int) -> int | None:
    """How many alternatives per token the answer carries, or None for no logprobs (vLLM's checks; above
    ``max_logprobs``, vLLM's --max-logprobs, -1 for the vocabulary, is a 400)."""
    if chat:
        top = body.get("top_logprobs")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int | float)):
            raise BadRequest(f"`top_logprobs` must be an integer. (parameter=top_logprobs, value={top})",
                             param="top_logprobs")
        if top is not None and top < 0 and top != -1:
            raise BadRequest(f"`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, "
                             f"value={top})", param="top_logprobs")
        if top and not body.get("logprobs"):
            raise BadRequest("when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
                             param="top_logprobs")
        if not body.get("logprobs"):
            return None
        wanted = int(top or 0)
    else:
        asked = body.get("logprobs")
        if asked is None:
            return None
        if not isinstance(asked, int):
            raise BadRequest("'logprobs' must be an integer.", param="logprobs")
        wanted = int(asked)
        if wanted < 0 and wanted != -1:
            raise BadRequest(f"`logprobs` must be a positive value or -1. (parameter=logprobs, value={wanted})",
                             param="logprobs")
    if wanted == -1:
        wanted = tokenizer.VOCAB_SIZE  # all of them, as vLLM reads -1
    most = tokenizer.VOCAB_SIZE if max_logprobs == -1 else max_logprobs
    if wanted > most:
        raise BadRequest(f"Requested sample logprobs of {wanted}, which is greater than max allowed: "
                         f"{most} (parameter=logprobs, value={wanted})", param="logprobs")
    return wanted


def _prompt_logprobs(body: dict[str, Any], chat: bool, stream: bool, max_logprobs: int) -> None:
    """vLLM's checks of ``prompt_logprobs`` (a number, not with a stream, -1 or more, at most ``max_logprobs``;
    an echo asks for as many as its logprobs). The simulator accepts what vLLM accepts but answers null."""
    value = body.get("prompt_logprobs")
    if value is not None and not isinstance(value, int | float):
        raise BadRequest(f"`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value={value})",
                         param="prompt_logprobs")
    if value is not None:
        if stream and (value > 0 or value == -1):
            raise BadRequest("`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)",
                             param="prompt_logprobs")
        if value < 0 and value != -1:
            raise BadRequest(f"`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, "
                             f"value={value})", param="prompt_logprobs")
        if value != int(value):
            raise BadRequest(f"`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value={value})",
                             param="prompt_logprobs")
    elif body.get("echo"):
        value = body.get("top_logprobs") if chat else body.get("logprobs")  # checked as the sample logprobs
    if not value or isinstance(value, bool) or not isinstance(value, int | float):
        return
    wanted = tokenizer.VOCAB_SIZE if value == -1 else int(value)
    most = tokenizer.VOCAB_SIZE if max_logprobs == -1 else max_logprobs
    if wanted > most:
        raise BadRequest(f"Requested prompt logprobs of {wanted}, which is greater than max allowed: {most} "
                         f"(parameter=prompt_logprobs, value={wanted})", param="prompt_logprobs")


def _max_tokens(body: dict[str, Any], prompt_tokens: int, chat: bool, max_len: int) -> int:
    if prompt_tokens >= max_len:
        raise BadRequest(
            f"This model's maximum context length is {max_len} tokens. However, your prompt contains at least "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please "
            f"reduce the length of the input prompt. (parameter=input_tokens, value={prompt_tokens})",
            param="input_tokens")
    # vLLM 0.32: chat defaults to the rest of the context, completions to 16 (OpenAI's default)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = max_len - prompt_tokens if chat else 16
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}. "
                         f"(parameter=max_tokens, value={max_tokens})", param="max_tokens")
    check_int(max_tokens, "max_tokens", minimum=1)
    if max_tokens > max_len:
        raise BadRequest(f"max_tokens={max_tokens} cannot be greater than max_model_len={max_len}. Please "
                         f"request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                         param="max_tokens")
    return min(max_tokens, max_len - prompt_tokens)  # vLLM caps silently to what fits


def _limits(body: dict[str, Any]) -> dict[str, Any]:
    """The sequence fields every choice shares: min_tokens, ignore_eos, stop strings, priority."""
    min_tokens = body.get("min_tokens", 0)
    check_int(min_tokens, "min_tokens", minimum=0)
    priority = body.get("priority", 0)
    check_int(priority, "priority", minimum=None)
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not low <= value <= high):
            raise BadRequest(f"'{name}' must be a number between {low} and {high}.", param=name)
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings.", param="stop")
    return {"min_tokens": min_tokens, "ignore_eos": bool(body.get("ignore_eos")), "stop": tuple(stop),
            "priority": priority}


# -- tools and structured outputs -------------------------------------------------------------------------------

def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, bool]:
    """The offered tools, the tool choice (vLLM's checks and words) and whether calls may run in parallel."""
    tools = body.get("tools")
    if tools == []:
        raise BadRequest("`tools` must not be an empty array. Either provide at least one tool or omit the field "
                         "entirely. (parameter=tools)", param="tools")
    if tools is not None and (not isinstance(tools, list) or not all(_is_tool(t) for t in tools)):
        raise BadRequest("Each tool must be an object {\"type\": \"function\", \"function\": {\"name\": ..., "
                         "\"parameters\": {...}}}.", param="tools")
    choice = body.get("tool_choice", "auto" if tools else None)
    if choice is None or choice == "none":
        return tools or [], "none", True
    if not tools:
        raise BadRequest("When using `tool_choice`, `tools` must be set. (parameter=tool_choice)",
                         param="tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise BadRequest(f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", \"auto\" or "
                         "\"required\" are supported. (parameter=tool_choice)", param="tool_choice")
    if isinstance(choice, dict):
        usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
        function = choice.get("function")
        if not isinstance(function, dict):
            raise BadRequest(f"Invalid value for `function`: `{function}` in `tool_choice`! {usage} "
                             "(parameter=tool_choice.function)", param="tool_choice.function")
        if "name" not in function:
            raise BadRequest(f"Expected field `name` in `function` in `tool_choice`! {usage} "
                             "(parameter=tool_choice.function.name)", param="tool_choice.function.name")
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise BadRequest(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage} "
                             "(parameter=tool_choice.function.name)", param="tool_choice.function.name")
        if not any(t["function"]["name"] == name for t in tools):
            raise BadRequest("The tool specified in `tool_choice` does not match any of the specified `tools` "
                             "(parameter=tool_choice)", param="tool_choice")
    parallel = body.get("parallel_tool_calls")
    return tools, choice, parallel is None or bool(parallel)


def _is_tool(tool: object) -> bool:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return False
    function = tool.get("function")
    return (isinstance(function, dict) and isinstance(function.get("name"), str) and bool(function["name"])
            and isinstance(function.get("parameters", {}), dict | None))


def _structure(body: dict[str, Any], chat: bool) -> Any:
    """The JSON schema the content must follow ({"type": "object"} for json_object), or None for free text:
    ``response_format``, vLLM's ``structured_outputs`` (json or choice) and its older ``guided_json``."""
    form = body.get("response_format")
    if form is not None:
        kind = form.get("type") if isinstance(form, dict) else None
        if kind == "json_schema":
            spec = form.get("json_schema")
            if spec is None:
                raise BadRequest("When response_format type is 'json_schema', the 'json_schema' field must be "
                                 "provided. (parameter=response_format)", param="response_format")
            if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
                raise BadRequest("'response_format.json_schema' must be an object with a 'name' and a 'schema'.",
                                 param="response_format")
            return _schema(spec.get("schema", {"type": "object"}), "response_format")
        if kind == "json_object":
            return JSON_OBJECT if chat else {"type": "object"}
        if kind not in ("text", "structural_tag"):
            raise BadRequest("'response_format.type' must be 'text', 'json_object', 'json_schema' or "
                             "'structural_tag'.", param="response_format")
    outputs = body.get("structured_outputs")
    if isinstance(outputs, dict):
        if sum(outputs.get(k) is not None for k in ("json", "regex", "choice")) > 1:
            raise BadRequest("You can only use one kind of constraints for structured outputs ('json', 'regex' or "
                             "'choice').")
        if outputs.get("json") is not None:
            return _schema(outputs["json"], "structured_outputs")
        if isinstance(outputs.get("choice"), list) and outputs["choice"]:
            return {"enum": [str(c) for c in outputs["choice"]], "x-text": True}
    if body.get("guided_json") is not None:
        return _schema(body["guided_json"], "guided_json")
    return None


def _schema(value: object, param: str) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise BadRequest("The JSON schema is not valid JSON.", param=param) from None
    if not isinstance(value, dict | bool):
        raise BadRequest("The JSON schema must be an object.", param=param)
    return value


def _script(tool_plan: structured.ToolPlan | None, mode: str, schema: Any, question: str, rng: random.Random,
            fenced: bool) -> structured.Script | None:
    """What one choice writes: its tool calls, its structured content (in a ```json block when the question
    asked for one), or nothing scripted (free text). Nothing is written yet: the engine reads the script."""
    if tool_plan is not None and tool_plan.chosen:
        return structured.tool_script(mode, tool_plan.calls(rng))
    if schema is None:
        return None
    if isinstance(schema, dict) and schema.get("x-text"):
        return structured.text_script(structured.Words.of(question, rng).named(schema["enum"]))
    return structured.json_script(schema, structured.Words.of(question, rng), fenced)


def _check_script(script: structured.Script, pieces: int, param: str) -> None:
    """Make a script's first ``pieces`` now: a schema found unsatisfiable within them is refused (a 400)."""
    try:
        script.fill(pieces)
    except structured.SchemaError as exc:
        raise BadRequest(f"The JSON schema cannot be satisfied: {exc}.", param=param) from None


# -- small checks shared with the other endpoints ---------------------------------------------------------------

def check_cache_salt(body: dict[str, Any]) -> str | None:
    """A request's ``cache_salt``, checked as vLLM 0.32 checks it (validate_cache_salt)."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    if len(salt) > 128 or any(char in "@/\\\x00" for char in salt):
        raise BadRequest("Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', "
                         "'\\\\', or NUL.", param="cache_salt")
    return salt


def check_int(value: object, name: str, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise BadRequest(f"'{name}' must be an integer{bound}, got {value!r}.", param=name)
