"""The simulator's structured answers, made once per request: values valid against the JSON schemas tools and
structured outputs use (checked with jsonschema), strings from the prompt's words, and tools chosen by the words
that ask for them."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from workers.sim import structured


class Address(BaseModel):
    street: str
    city: str
    zip_code: str = Field(min_length=5, max_length=5)


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str
    age: int = Field(ge=0, le=150)
    email: str | None = None
    tags: list[str] = Field(default_factory=list, min_length=1, max_length=3)
    home: Address
    previous: list[Address] = []
    score: float = Field(gt=0, lt=1)


class Tree(BaseModel):
    label: str
    children: list[Tree] = []


SCHEMAS: dict[str, Any] = {
    "pydantic with $defs, optional, bounds": Person.model_json_schema(),
    "recursive": Tree.model_json_schema(),
    "enum and const": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "v": {"const": 3}},
                       "required": ["unit", "v"], "additionalProperties": False},
    "type lists and null": {"type": "object", "properties": {"x": {"type": ["null", "integer"]},
                                                             "y": {"type": "null"}}, "required": ["x", "y"]},
    "numbers": {"type": "object", "required": ["a", "b", "c", "d"], "properties": {
        "a": {"type": "integer", "minimum": 10, "maximum": 12}, "b": {"type": "number", "exclusiveMinimum": 0,
                                                                     "exclusiveMaximum": 0.05},
        "c": {"type": "integer", "multipleOf": 7, "minimum": 20, "maximum": 30},
        "d": {"type": "number", "minimum": -5, "maximum": -4}}},
    "arrays": {"type": "object", "required": ["pair", "unique", "many"], "properties": {
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        "unique": {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "minItems": 3},
        "many": {"type": "array", "items": {"type": "boolean"}, "minItems": 4, "maxItems": 4}}},
    "strings": {"type": "object", "required": ["d", "t", "e", "u", "id", "short", "long", "p"], "properties": {
        "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "date-time"},
        "e": {"type": "string", "format": "email"}, "u": {"type": "string", "format": "uri"},
        "id": {"type": "string", "format": "uuid"}, "short": {"type": "string", "maxLength": 2},
        "long": {"type": "string", "minLength": 30}, "p": {"type": "string", "pattern": "^[0-9]+$"}}},
    "maps": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
    "allOf and anyOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                                  {"properties": {"b": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
                                   "required": ["b"]}]},
    "draft 7 definitions": {"definitions": {"n": {"type": "integer", "minimum": 1}},
                            "type": "array", "items": {"$ref": "#/definitions/n"}, "minItems": 2},
    "no type": {"properties": {"k": {}}, "required": ["k"]},
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_values_are_valid_against_their_schema(name: str) -> None:
    schema = SCHEMAS[name]
    for seed in range(20):
        words = structured.Words.of("Alice from Paris, 31 years, likes chess and rain", random.Random(seed))
        value = structured.instance(schema, words)
        jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
        json.dumps(value)  # JSON as it stands: no tuples, no sets


def test_the_validation_can_fail() -> None:
    """Positive control: jsonschema refuses what the generator must never write."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"age": 200, "name": "x"}, Person.model_json_schema())


def test_strings_numbers_and_enums_come_from_the_prompt() -> None:
    schema = Person.model_json_schema()
    value = structured.instance(schema, structured.Words.of("Extract: Jason is 25 years old", random.Random(1)))
    assert value["name"] == "Jason" and value["age"] == 25, value
    unit = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]}
    assert structured.instance(unit, structured.Words.of("in fahrenheit please", random.Random(1))) == {
        "unit": "fahrenheit"}


def test_an_optional_field_with_a_default_keeps_it() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string",
                                                                                   "default": "celsius"}},
              "required": ["city"]}
    assert structured.instance(schema, structured.Words.of("weather in Paris", random.Random(0))) == {
        "city": "Paris", "unit": "celsius"}


def test_draft_4_exclusive_bounds() -> None:
    schema = {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 0.02, "exclusiveMaximum": True}
    for seed in range(20):
        value = structured.instance(schema, structured.Words.of("", random.Random(seed)))
        jsonschema.Draft4Validator(schema).validate(value)


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": 5, "maximum": 4},
    {"$ref": "#/$defs/missing"},
    {"type": "array", "items": {"enum": [1]}, "uniqueItems": True, "minItems": 2},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    {"$defs": {"t": {"type": "array", "minItems": 1000, "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"},
    {"allOf": [{"$ref": "#"}]},
    {"type": "string", "minLength": "many"},
    {"type": "integer", "minimum": "low"},
    {"type": "object", "properties": ["a"]},
])
def test_a_schema_nothing_satisfies_is_an_error_not_a_hang(schema: Any) -> None:
    with pytest.raises(structured.SchemaError):
        structured.instance(schema, structured.Words.of("", random.Random(0)))


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MULTIPLY = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, TIME, MULTIPLY]


@pytest.mark.parametrize("question, choice, parallel, last, expected", [
    ("What is the weather in Paris?", "auto", True, "user", [0]),
    ("What's the weather in Paris and the time in Tokyo?", "auto", True, "user", [0, 1]),
    ("What's the weather in Paris and the time in Tokyo?", "auto", False, "user", [0]),
    ("What is 6 times 7?", "auto", True, "user", [2]),
    ("Tell me a joke", "auto", True, "user", []),
    ("Tell me a joke", "required", True, "user", [0]),
    ("What is the weather in Paris?", "auto", True, "tool", []),
    ("What is the weather in Paris?", "required", True, "tool", [0]),
    ("Tell me a joke", {"type": "function", "function": {"name": "get_time"}}, True, "user", [1]),
    ("What is the weather in Paris?", "none", True, "user", []),
])
def test_the_tools_a_question_calls(question: str, choice: Any, parallel: bool, last: str,
                                    expected: list[int]) -> None:
    assert structured.choose(TOOLS, choice, parallel, question, last) == expected


def test_each_call_takes_the_words_nearest_what_chose_it() -> None:
    question = "What's the weather in Paris in fahrenheit and the time in Tokyo? And 6 times 7?"
    calls = structured.calls(TOOLS, [0, 1, 2], question, random.Random(0))
    structured.tool_script("required", calls).fill(10_000)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "fahrenheit"}), ("get_time", {"city": "Tokyo"}),
        ("multiply", {"a": 6, "b": 7})]
    assert all(c.id.startswith("chatcmpl-tool-") and len(c.id) == 30 for c in calls)


@pytest.mark.parametrize("mode, finish", [("named", "stop"), ("required", "tool_calls"), ("auto", "tool_calls")])
def test_a_tool_script_streams_the_arguments_that_make_its_message(mode: str, finish: str) -> None:
    calls = structured.calls(TOOLS, [0] if mode == "named" else [0, 1], "weather in Paris, time in Oslo",
                             random.Random(0))
    script = structured.tool_script(mode, calls)
    script.fill(10_000)
    content, made = script.message(len(script.pieces))
    assert script.finish == finish and content == ("" if mode != "auto" else None)
    assert [json.loads(c["function"]["arguments"]) for c in made] == [json.loads(c.arguments) for c in calls]
    streamed: dict[int, str] = {}
    for delta in filter(None, script.deltas):
        for call in delta["tool_calls"]:
            streamed[call["index"]] = streamed.get(call["index"], "") + (call["function"].get("arguments") or "")
    assert streamed == {i: c.arguments for i, c in enumerate(calls)}
    first = next(d for d in script.deltas if d)["tool_calls"][0]
    assert first["id"] == calls[0].id and first["type"] == "function" and first["function"]["name"] == "get_weather"
    _, cut_calls = script.message(3)
    if mode == "named":
        assert cut_calls[0]["function"]["arguments"] == "".join(script.pieces[:3]), "vLLM keeps the partial call"
    else:
        assert cut_calls == [], "a list of calls cut short is no call"


def test_json_asked_for_in_words() -> None:
    assert structured.asked_schema([], "Alice is 31. Extract the person as JSON with keys name and age.") == {
        "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]}
    system = "Match this json_schema:\n" + json.dumps(Person.model_json_schema(), indent=2) + "\nThanks."
    assert structured.asked_schema([system], "Extract: Ana is 33.") == Person.model_json_schema()
    assert structured.asked_schema([], "Tell me about it")["required"] == ["answer"]
    assert structured.wants_fenced_json("Return the correct JSON response within a ```json codeblock.")


# -- a schema's counts cost what the budget reads, never what they ask for ------------------------------------

COUNTS = st.one_of(st.integers(0, 3), st.integers(10**6, 10**12))  # small, or a bomb
LEAVES = st.one_of(
    st.builds(lambda low: {"type": "string", "minLength": low}, COUNTS),
    st.builds(lambda low, more: {"type": "string", "minLength": low, "maxLength": low + more}, COUNTS,
              st.integers(0, 10**6)),
    st.just({"type": "integer", "minimum": 0, "maximum": 9}), st.just({"type": "boolean"}),
    st.just({"enum": ["a", "b", "c"]}), st.just({"const": "x"}), st.just({}), st.just({"type": "null"}))


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(lambda low, items, unique: {"type": "array", "minItems": low, "items": items, "uniqueItems": unique},
                  COUNTS, inner, st.booleans()),
        st.builds(lambda properties, low, extra: {"type": "object", "properties": properties,
                                                  "required": sorted(properties), "minProperties": low,
                                                  "additionalProperties": extra},
                  st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3), COUNTS, inner),
        st.builds(lambda low, leaf: {"$defs": {"t": {"type": "array", "minItems": low, "items": {
            "anyOf": [{"$ref": "#/$defs/t"}, leaf]}}}, "$ref": "#/$defs/t"}, COUNTS, inner))


SCHEMA_BOMBS = st.recursive(LEAVES, _nested, max_leaves=8)


def counted(fragments: Iterator[str], seen: list[int]) -> Iterator[str]:
    for fragment in fragments:
        seen[0] += 1
        yield fragment


@settings(max_examples=300, deadline=None)
@given(schema=SCHEMA_BOMBS, budget=st.integers(1, 400))
def test_any_schema_is_read_as_far_as_the_budget_and_no_further(schema: Any, budget: int) -> None:
    """Whatever a schema's minItems, minLength or minProperties (up to 10**12, nested, through $ref), making a
    script's first budget + 1 pieces reads about that much text: at most budget + 1 pieces of at most 26
    characters, from no more fragments than characters (plus the one read ahead). An answer that ends within
    its budget is valid against its schema; one that does not has exactly budget + 1 pieces (cut, "length")."""
    read = [0]
    words = structured.Words.of("Alice from Paris likes chess, rain and maps", random.Random(budget))
    script = structured.Script("json", structured._content(counted(structured.Instance(schema, words).write(schema),
                                                                   read)), [])
    try:
        script.fill(budget + 1)
    except structured.SchemaError:
        return  # refused (a 400): no unique items left, a recursion that never bottoms out within the budget
    text = "".join(script.pieces)
    assert len(script.pieces) <= budget + 1 and len(text) <= 26 * len(script.pieces)
    assert read[0] <= len(text) + 1
    if len(script.pieces) <= budget:
        assert script.ended(len(script.pieces))
        jsonschema.validate(json.loads(text), schema)
    else:
        assert not script.ended(budget), "a cut script has more to write: the engine ends it with length"


@pytest.mark.parametrize("schema", [
    {"type": "array", "minItems": 10_000_000},
    {"type": "string", "minLength": 10**15},
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 10**9},
    {"type": "array", "minItems": 10**6, "items": {"type": "array", "minItems": 10**6, "items": {
        "type": "array", "minItems": 10**6, "items": {"type": "string", "minLength": 10**6}}}},
    {"$defs": {"t": {"type": "object", "properties": {"label": {"type": "string"}, "children": {
        "type": "array", "minItems": 1000, "items": {"$ref": "#/$defs/t"}}}, "required": ["label"]}},
     "$ref": "#/$defs/t"},
])
def test_a_schema_bomb_written_to_a_budget_is_cut_there(schema: Any) -> None:
    script = structured.json_script(schema, structured.Words.of("x", random.Random(0)))
    script.fill(5001)
    assert len(script.pieces) == 5001 and not script.ended(5000)
    assert len("".join(script.pieces)) <= 26 * 5001


def test_a_tool_scripts_arguments_are_written_as_far_as_the_budget() -> None:
    bomb = {"type": "function", "function": {"name": "bomb", "parameters": {
        "type": "object", "properties": {"xs": {"type": "array", "minItems": 10**9}}, "required": ["xs"]}}}
    script = structured.tool_script("named", structured.calls([bomb], [0], "go", random.Random(0)))
    script.fill(301)
    assert len(script.pieces) == 301 and script.calls[0].arguments.startswith('{"xs": [')
    assert script.message(300)[1][0]["function"]["arguments"] == "".join(script.pieces[:300]), "partial, as vLLM"


@pytest.mark.parametrize("pattern", ["(a+)+$", "(a|aa)*b", "^(a*)*$", "((a|b)+)+c", "(x+x+)+y"])
def test_a_pattern_that_can_backtrack_without_end_is_not_searched(pattern: str) -> None:
    """A pattern with a repeat of a group (exponential on a backtracking engine) is not tried: the value is
    written as it stands, at once, even when the prompt's word is the subject that would take forever."""
    subject = "a" * 40 + "!"
    schema = {"type": "string", "pattern": pattern}
    value = structured.instance(schema, structured.Words.of(subject, random.Random(0)))
    assert value == "a" * 40
    assert structured._quick_pattern(pattern) is None


def test_a_plain_pattern_is_still_honoured() -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"},
                                               "name": {"type": "string", "pattern": "^[a-z]{2,}$"}},
              "required": ["code", "name"]}
    for seed in range(10):
        jsonschema.validate(structured.instance(schema, structured.Words.of("Ann", random.Random(seed))), schema)
