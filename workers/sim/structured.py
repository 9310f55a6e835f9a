"""Structured answers for the simulated worker, made once per request (never in the engine loop): a JSON value
valid against a JSON schema (a ``response_format``'s, a tool's ``parameters``), the tools a prompt calls, and the
text a model writes for them as the pieces the engine emits, with what a stream sends for each piece.

The schema generator is our own, for the subset tools and structured outputs use (types and type lists, enum,
const, properties/required/additionalProperties, items/prefixItems with min/maxItems and uniqueItems, numbers
within minimum/maximum/exclusive bounds and multipleOf, string lengths and common formats, anyOf/oneOf/allOf,
$ref into $defs/definitions): the libraries that generate instances (hypothesis-jsonschema) search at random,
which is slow and not a pure function of the request. ``pattern`` is not honoured beyond a few tries.

Strings come from the prompt's own words (proper nouns first, those nearest the words that chose the tool
first), numbers from its numbers when they fit, enums from a member the prompt names: "the weather in Paris"
calls ``get_weather`` with ``{"city": "Paris"}``. Tool choice is by word overlap with a tool's name, description
and parameter names, so the same request always calls the same tool.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workers.sim import tokenizer

MAX_DEPTH = 24  # deeper than any real schema; a recursion that never bottoms out is refused, not followed
SHALLOW = 3  # optional properties and a second array item are generated above this depth only

_WORD = re.compile(r"[^\W\d_][\w'-]*|\d+(?:\.\d+)?")
_SPLIT = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset(
    "please tell give show find get list explain describe want need would could can should what which who whom "
    "whose when where why how does did do is are was were be been the a an and or but of to in on at for with "
    "about from by me my mine i you your we our us it its this that these those there here some any each "
    "extract return respond answer output format json schema json_schema correct response codeblock code block "
    "name provide parse parsed key keys field fields value values object instance summarize compare translate "
    "write create make search look check calculate compute convert send schedule set add remove delete update "
    "hello hi hey thanks thank ok okay yes no".split())
_KEYS = re.compile(r"\b(?:keys?|fields?|properties|attributes)\b\s*(?:named|called|:)?\s*([^.;:!?\n]*)", re.I)
_NUMERIC_KEYS = frozenset("age year years count number amount price total quantity size score rating id index "
                          "n population height weight length width".split())
_FORMATS = {
    "date": lambda rng: f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    "date-time": lambda rng: f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                             f"{rng.randint(0, 59):02d}:00Z",
    "time": lambda rng: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00",
    "email": lambda rng: f"user{rng.randint(1, 999)}@example.com",
    "uri": lambda rng: f"https://example.com/{rng.randint(1, 999)}",
    "url": lambda rng: f"https://example.com/{rng.randint(1, 999)}",
    "uuid": lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
    "ipv4": lambda rng: f"10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
}


class SchemaError(ValueError):
    """A schema no value satisfies as far as the generator can tell (refused with a 400, as vLLM refuses a
    schema its grammar compiler cannot build)."""


@dataclass
class Words:
    """The prompt's words and numbers, handed out in order: each string field gets the next word."""

    words: list[str]
    numbers: list[float]
    rng: random.Random
    _next: int = 0
    _next_number: int = 0

    @classmethod
    def of(cls, text: str, rng: random.Random, exclude: Iterable[str] = (),
           anchors: Iterable[str] = ()) -> Words:
        """Content words of ``text`` without ``exclude`` (a tool's own terms): capitalised ones (names, places)
        first, each group nearest an ``anchor`` (the words that chose the tool) first, then by position."""
        tokens = _WORD.findall(text)
        excluded = {_stem(w) for w in exclude}
        anchored = {_stem(w) for w in anchors}
        marks = [i for i, t in enumerate(tokens) if _stem(t) in anchored]
        seen: set[str] = set()
        found: list[tuple[bool, float, int, str]] = []
        numbers: list[float] = []
        for i, token in enumerate(tokens):
            if token[0].isdigit():
                numbers.append(float(token))
                continue
            key = token.casefold()
            head = key.split("'")[0]  # "what's" is "what"
            if key in seen or head in _STOP or head in tokenizer.COMMON or _stem(token) in excluded:
                continue
            seen.add(key)
            distance = min((i - m if i > m else m - i + 0.5 for m in marks), default=0)  # after it first
            found.append((not token[0].isupper(), distance, i, token))
        return cls([w for *_, w in sorted(found)], numbers, rng)

    def word(self) -> str:
        if not self.words:
            return tokenizer.WORDS[int(self.rng.random() * len(tokenizer.WORDS))]
        word = self.words[self._next % len(self.words)]
        self._next += 1
        return word

    def number(self, low: float, high: float, integer: bool) -> float | None:
        """The prompt's next number if it lies in [low, high] (and is whole where an integer is wanted)."""
        while self._next_number < len(self.numbers):
            value = self.numbers[self._next_number]
            self._next_number += 1
            if low <= value <= high and (not integer or value == int(value)):
                return int(value) if integer else value
        return None

    def named(self, options: list[Any]) -> Any:
        """The member of an enum the prompt names, else one at random."""
        mentioned = {w.casefold() for w in self.words}
        for option in options:
            if isinstance(option, str) and option.casefold() in mentioned:
                return option
        return options[int(self.rng.random() * len(options))]


def _stem(word: str) -> str:
    word = word.casefold()
    for suffix in ("ing", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


class Instance:
    """Values valid against one schema (``root`` resolves its $refs)."""

    def __init__(self, root: Any, words: Words) -> None:
        self.root = root
        self.words = words
        self.rng = words.rng

    def make(self, schema: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise SchemaError("the schema recurses without end")
        if schema is True or schema is None or schema == {}:
            return self.words.word()
        if schema is False or not isinstance(schema, dict):
            raise SchemaError("a schema must be an object or a boolean")
        schema = self._flat(schema, depth)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            options = schema["enum"]
            if not isinstance(options, list) or not options:
                raise SchemaError("'enum' must be a non-empty array")
            return self.words.named(options)
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            return self._number(schema, kind == "integer")
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema)

    def _flat(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        """The schema with its $ref, allOf and anyOf/oneOf (the first option that is not null) folded in."""
        for _ in range(MAX_DEPTH):
            if "$ref" in schema:
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                schema = {**self._resolve(schema["$ref"]), **rest}
            elif "allOf" in schema:
                merged = {k: v for k, v in schema.items() if k != "allOf"}
                for part in schema["allOf"] or ():
                    merged = _merge(merged, self._flat(part, depth) if isinstance(part, dict) else {})
                schema = merged
            elif "anyOf" in schema or "oneOf" in schema:
                key = "anyOf" if "anyOf" in schema else "oneOf"
                options = [o for o in schema[key] or () if isinstance(o, dict)]
                if not options:
                    raise SchemaError(f"'{key}' must be a non-empty array of schemas")
                chosen = next((o for o in options if o.get("type") != "null"), options[0])
                schema = {**{k: v for k, v in schema.items() if k != key}, **chosen}
            else:
                return schema
        raise SchemaError("the schema's references go round in a circle")

    def _resolve(self, ref: object) -> dict[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"only local references are supported, got {ref!r}")
        node: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SchemaError(f"the reference {ref!r} names nothing in the schema")
            node = node[part]
        if node is True:
            return {}
        if not isinstance(node, dict):
            raise SchemaError(f"the reference {ref!r} does not name a schema")
        return node

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        required = [k for k in schema.get("required") or () if isinstance(k, str)]
        extra = schema.get("additionalProperties", True)
        out: dict[str, Any] = {}
        for key, sub in properties.items():
            if key in required:
                out[key] = self.make(sub, depth + 1)
            elif isinstance(sub, dict) and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])  # what a model leaves out, the client fills in
            elif depth < SHALLOW:
                out[key] = self.make(sub, depth + 1)
        for key in required:
            if key not in out:
                out[key] = self.make(extra if isinstance(extra, dict) else {}, depth + 1)
        wanted = schema.get("minProperties", 1 if not properties and isinstance(extra, dict) else 0)
        while len(out) < wanted and extra is not False:
            key = self.words.word()
            if key in out:
                key = f"{key}_{len(out)}"
            out[key] = self.make(extra if isinstance(extra, dict) else {}, depth + 1)
        most = schema.get("maxProperties")
        if isinstance(most, int):
            for key in [k for k in out if k not in required][: max(0, len(out) - most)]:
                del out[key]
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", {})
        if isinstance(items, list):  # draft 4-7 tuples
            prefix, items = items, schema.get("additionalItems", {})
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        count = max(low, len(prefix), 0 if depth >= SHALLOW else 1 + (self.rng.random() < 0.5))
        if items is False:
            count = min(count, len(prefix))
        if isinstance(high, int):
            count = min(count, high)
        out: list[Any] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            value = self.make(sub, depth + 1)
            for _ in range(8):
                if not schema.get("uniqueItems") or value not in out:
                    break
                value = self.make(sub, depth + 1)
            if schema.get("uniqueItems") and value in out and isinstance(sub, dict):
                options = self._flat(sub, depth).get("enum") or ()
                value = next((o for o in options if o not in out), value)
            if schema.get("uniqueItems") and value in out:
                if len(out) >= low:
                    break
                raise SchemaError("the array's items cannot be made unique")
            out.append(value)
        return out

    def _number(self, schema: dict[str, Any], integer: bool) -> int | float:
        low, high = _bounds(schema, integer)
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and not isinstance(step, bool) and step > 0:
            first, last = math.ceil(low / step), math.floor(high / step)
            if first > last:
                raise SchemaError("no multiple of 'multipleOf' lies within the bounds")
            value = step * (first + int(self.rng.random() * (last - first + 1)))
            return int(value) if integer or isinstance(step, int) else value
        mentioned = self.words.number(low, high, integer)
        if mentioned is not None:
            return mentioned
        if integer:
            return self.rng.randint(math.ceil(low), math.floor(high))
        value = round(low + self.rng.random() * (high - low), 2)
        return min(max(value, low), high)

    def _string(self, schema: dict[str, Any]) -> str:
        maker = _FORMATS.get(schema.get("format", ""))
        value = maker(self.rng) if maker else self.words.word()
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        while len(value) < low:
            value += " " + self.words.word()
        if isinstance(high, int):
            value = value[:high]
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            value = _matching(pattern, value, self.rng)
        return value


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return "string"


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    """[low, high] of a number: minimum/maximum, exclusive ones (draft 4's booleans and later numbers), and a
    span of 100 when a side is open."""
    tiny = 1 if integer else 0.01
    low, high = schema.get("minimum"), schema.get("maximum")
    exclusive_low, exclusive_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if exclusive_low is True and low is not None:
        low += tiny
    elif isinstance(exclusive_low, int | float) and not isinstance(exclusive_low, bool):
        low = max(low, exclusive_low + tiny) if low is not None else exclusive_low + tiny
    if exclusive_high is True and high is not None:
        high -= tiny
    elif isinstance(exclusive_high, int | float) and not isinstance(exclusive_high, bool):
        high = min(high, exclusive_high - tiny) if high is not None else exclusive_high - tiny
    if low is None and high is None:
        low, high = 1, 100
    elif low is None:
        low = high - 100
    elif high is None:
        high = low + 100
    if low > high or (integer and math.ceil(low) > math.floor(high)):
        raise SchemaError("the number's bounds leave no value")
    return low, high


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {**a, **b}
    if "properties" in a and "properties" in b:
        out["properties"] = {**a["properties"], **b["properties"]}
    if "required" in a and "required" in b:
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    return out


def _matching(pattern: str, value: str, rng: random.Random) -> str:
    """``value`` if it matches ``pattern``, else the first of a few plain candidates that does."""
    try:
        regex = re.compile(pattern)
    except re.error:
        return value
    candidates = (value, value.lower(), value.upper(), str(rng.randint(0, 9999)), "a", "A1")
    return next((c for c in candidates if regex.search(c)), value)


def instance(schema: Any, words: Words) -> Any:
    return Instance(schema, words).make(schema)


# -- tools ------------------------------------------------------------------------------------------------------

def tool_terms(function: dict[str, Any]) -> set[str]:
    """A tool's own words: its name's parts, its description's content words and its parameters' names."""
    name = str(function.get("name", ""))
    parts = [p for chunk in re.split(r"[_\-.\s]+", name) for p in _SPLIT.findall(chunk)]
    words = [*parts, *_WORD.findall(str(function.get("description") or ""))]
    parameters = function.get("parameters")
    if isinstance(parameters, dict) and isinstance(parameters.get("properties"), dict):
        words += [p for key in parameters["properties"] for p in _SPLIT.findall(str(key))]
    return {_stem(w) for w in words if len(w) >= 3 and w.casefold() not in _STOP}


def _matches(term: str, words: set[str]) -> bool:
    return term in words or any(len(w) >= 5 and len(term) >= 5 and (w.startswith(term[:5])) for w in words)


def relevant(tools: list[dict[str, Any]], text: str) -> list[tuple[int, set[str]]]:
    """The tools (their index, the prompt words they matched) the text asks for, most matched first; a prompt
    with as many numbers as a tool has parameters, all of them numbers, asks for that tool too ("6 times 7")."""
    found = _WORD.findall(text)
    words = {_stem(w) for w in found if w.casefold() not in _STOP and len(w) >= 3}
    numbers = sum(w[0].isdigit() for w in found)
    scored = []
    for i, tool in enumerate(tools):
        hit = {t for t in tool_terms(tool["function"]) if _matches(t, words)}
        needed = _numeric_parameters(tool["function"])
        if needed and numbers >= needed:
            hit.add("#numbers")
        if hit:
            scored.append((-_weight(hit), i, hit))
    return [(i, hit) for _, i, hit in sorted(scored)]


def _weight(hit: set[str]) -> int:
    return len(hit) + ("#numbers" in hit)  # numbers that fill every parameter say more than one shared word


def _numeric_parameters(function: dict[str, Any]) -> int:
    """How many parameters a tool takes if all it requires are numbers, else 0."""
    parameters = function.get("parameters")
    if not isinstance(parameters, dict) or not isinstance(parameters.get("properties"), dict):
        return 0
    required = [k for k in parameters.get("required") or () if k in parameters["properties"]]
    kinds = [parameters["properties"][k].get("type") if isinstance(parameters["properties"][k], dict) else None
             for k in required]
    return len(kinds) if kinds and all(k in ("integer", "number") for k in kinds) else 0


# -- JSON a prompt asks for without a schema of the request's own ------------------------------------------------

def asked_schema(texts: list[str], question: str) -> dict[str, Any]:
    """The schema of the JSON a prompt asks for in words: one written into a message (instructor's JSON modes put
    the model's schema in the system prompt), else an object of the keys the question names ("as JSON with keys
    name and age"), else ``{"answer": ...}``."""
    for text in texts:
        found = schema_in(text)
        if found is not None:
            return found
    match = _KEYS.search(question)
    keys = [k for k in re.split(r"\s*(?:,|\band\b|\bor\b)\s*", match.group(1)) if k] if match else []
    keys = [k.strip("`'\" ") for k in keys if re.fullmatch(r"[`'\"]?[A-Za-z_]\w*[`'\"]?", k.strip())][:12]
    if not keys:
        return {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    properties = {k: {"type": "integer" if k.casefold() in _NUMERIC_KEYS else "string"} for k in keys}
    return {"type": "object", "properties": properties, "required": keys}


def schema_in(text: str, limit: int = 100_000) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that reads as a JSON schema (it has properties, or $defs)."""
    decoder = json.JSONDecoder()
    at = text.find("{", 0, limit)
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1, limit)
            continue
        if isinstance(value, dict) and ("properties" in value or "$defs" in value or "definitions" in value):
            return value
        at = text.find("{", end, limit)
    return None


def wants_fenced_json(question: str) -> bool:
    """The question asks for JSON in a markdown code block (instructor's MD_JSON mode, and people)."""
    folded = question.casefold()
    return "```json" in folded or "json codeblock" in folded or "json code block" in folded


@dataclass
class Call:
    name: str
    arguments: str  # the JSON text, as the model writes it
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex[:16]}")


def choose(tools: list[dict[str, Any]], choice: Any, parallel: bool, text: str, last_role: str) -> list[int]:
    """Which tools a request calls: a named one; for "required" the most relevant (the first if none is); for
    "auto" the most relevant when the last message is the user's and some tool matches (after a tool's result,
    the model answers in words); two when two match as well, on words of their own, and parallel calls are
    allowed."""
    if choice == "none":
        return []
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return [next(i for i, t in enumerate(tools) if t["function"]["name"] == name)]
    if choice != "required" and last_role != "user":
        return []
    ranked = relevant(tools, text)
    if not ranked:
        return [0] if choice == "required" else []
    chosen = [ranked[0][0]]
    if parallel and len(ranked) > 1 and _weight(ranked[1][1]) == _weight(ranked[0][1]) and \
            ranked[1][1] - ranked[0][1]:
        chosen.append(ranked[1][0])
    return chosen


def calls(tools: list[dict[str, Any]], chosen: list[int], text: str, rng: random.Random) -> list[Call]:
    """Each chosen tool called with arguments valid against its parameters, its strings from the prompt's words
    nearest the words that chose it (the other tools' words left out)."""
    every = set().union(*(tool_terms(t["function"]) for t in tools))
    ranked = dict(relevant(tools, text))
    out = []
    for i in chosen:
        function = tools[i]["function"]
        words = Words.of(text, rng, exclude=every, anchors=ranked.get(i, ()))
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        value = instance(parameters, words)
        out.append(Call(function["name"], json.dumps(value, ensure_ascii=False)))
    return out


# -- what the engine writes, and what a stream sends for it -------------------------------------------------------

@dataclass
class Script:
    """The pieces the engine writes for a structured answer and, for each, the delta a stream sends (None: the
    piece is the tool-call syntax around the arguments, sent as nothing, as vLLM's parsers hold it back).

    ``mode``: "json" (content), "named" (the arguments only, vLLM's named tool choice), "required" (vLLM's JSON
    list of calls) or "auto" (calls in the Hermes syntax a tool parser reads)."""

    mode: str
    pieces: tuple[str, ...]
    deltas: tuple[dict[str, Any] | None, ...]
    calls: list[Call]

    def message(self, written: int) -> tuple[str | None, list[dict[str, Any]]]:
        """The message's content and tool calls after ``written`` pieces (all of them, or fewer when cut at
        max_tokens: vLLM's named choice keeps the partial arguments, the others no call)."""
        text = "".join(self.pieces[:written])
        done = written >= len(self.pieces)
        if self.mode == "json":
            return text, []
        if self.mode == "named":
            return "", [_tool_call(self.calls[0], text)]
        if not done:
            return ("" if self.mode == "required" else text), []
        return ("" if self.mode == "required" else None), [_tool_call(c, c.arguments) for c in self.calls]

    @property
    def finish(self) -> str:
        """vLLM's finish_reason when the script is written: "tool_calls", but "stop" for a named tool (as OpenAI)."""
        return "tool_calls" if self.mode in ("required", "auto") else "stop"


def _tool_call(call: Call, arguments: str) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def json_script(value: Any) -> Script:
    return text_script(json.dumps(value, ensure_ascii=False))


def text_script(text: str) -> Script:
    """Content written as given (a JSON value's text, one of a ``choice`` constraint's strings)."""
    pieces = tuple(tokenizer.pieces(text)) or (text,)
    return Script("json", pieces, tuple({"content": p} for p in pieces), [])


def tool_script(mode: str, chosen: list[Call]) -> Script:
    pieces: list[str] = []
    deltas: list[dict[str, Any] | None] = []

    def syntax(text: str) -> None:
        more = tokenizer.pieces(text)
        pieces.extend(more)
        deltas.extend([None] * len(more))

    for index, call in enumerate(chosen):
        head = {"id": call.id, "type": "function", "index": index}
        if mode == "required":
            syntax(("[" if index == 0 else ", ") + json.dumps({"name": call.name})[:-1] + ', "parameters": ')
        elif mode == "auto":
            syntax(("\n" if index else "") + "<tool_call>\n" + json.dumps({"name": call.name})[:-1]
                   + ', "arguments": ')
            deltas[-1] = {"tool_calls": [{**head, "function": {"name": call.name}}]}
        for n, piece in enumerate(tokenizer.pieces(call.arguments)):
            pieces.append(piece)
            if n == 0 and mode != "auto":
                deltas.append({"tool_calls": [{**head, "function": {"name": call.name, "arguments": piece}}]})
            elif mode == "required":
                deltas.append({"tool_calls": [{"index": index, "function": {"name": None, "arguments": piece}}]})
            else:
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        if mode == "required":
            syntax("}" + ("]" if index == len(chosen) - 1 else ""))
        elif mode == "auto":
            syntax("}\n</tool_call>")
    return Script(mode, tuple(pieces), tuple(deltas), chosen)
