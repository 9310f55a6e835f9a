"""Structured answers for the simulated worker: a JSON value valid against a JSON schema (a ``response_format``'s,
a tool's ``parameters``), the tools a prompt calls (chosen once per request), and the text a model writes for them
as the pieces the engine emits, with what a stream sends for each piece.

The schema generator is our own, for the subset tools and structured outputs use (types and type lists, enum,
const, properties/required/additionalProperties, items/prefixItems with min/maxItems and uniqueItems, numbers
within minimum/maximum/exclusive bounds and multipleOf, string lengths and common formats, anyOf/oneOf/allOf,
$ref into $defs/definitions): the libraries that generate instances (hypothesis-jsonschema) search at random,
which is slow and not a pure function of the request. ``pattern`` is not honoured beyond a few tries, and only
for patterns a backtracking search is sure to be quick on (``_quick_pattern``).

Strings come from the prompt's own words (proper nouns first, those nearest the words that chose the tool
first), numbers from its numbers when they fit, enums from a member the prompt names: "the weather in Paris"
calls ``get_weather`` with ``{"city": "Paris"}``. Tool choice is by word overlap with a tool's name, description
and parameter names, so the same request always calls the same tool.

Everything is written lazily and read as far as the answer's budget: ``Script`` pieces are made when the engine
writes them (the first answer's, up to its budget, when the request is planned: a schema found unsatisfiable
there is a 400), never past ``max_tokens`` and one piece beyond (to tell a finished script from a cut one). A
schema that asks for ten million items or a string of a gigabyte costs what ``max_tokens`` allows, as on vLLM,
where the grammar constrains each token and the budget cuts the answer (finish_reason "length").
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import random
import re
import re._constants as _sre
import re._parser as _sre_parser
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.sim import tokenizer

MAX_DEPTH = 24  # deeper than any real schema; a recursion that never bottoms out is refused, not followed
SHALLOW = 3  # optional properties and a second array item are generated above this depth only
SHORT_STRING = 256  # a string up to this long is made whole (and its pattern tried); a longer one a word at a time
UNIQUE_FRAGMENTS = 256  # uniqueItems compares items of up to this many fragments (a longer one is written unchecked)
PATTERN_SUBJECT = 32  # a pattern is tried on values of up to this many characters
PATTERN_STEPS = 1 << 20  # ... and only if a backtracking search cannot take more steps than this on one

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

    words: Sequence[str]
    numbers: Sequence[float]
    rng: random.Random
    _next: int = 0
    _next_number: int = 0

    @classmethod
    def of(cls, text: str, rng: random.Random, exclude: Iterable[str] = (),
           anchors: Iterable[str] = ()) -> Words:
        """Content words of ``text`` without ``exclude`` (a tool's own terms): capitalised ones (names, places)
        first, each group nearest an ``anchor`` (the words that chose the tool) first, then by position. Found
        once for the n answers of a request (they differ only in ``rng``)."""
        words, numbers = _content_words(text, frozenset(exclude), frozenset(anchors))
        return cls(words, numbers, rng)

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


@functools.lru_cache(maxsize=16)
def _content_words(text: str, exclude: frozenset[str], anchors: frozenset[str]) -> tuple[tuple[str, ...],
                                                                                        tuple[float, ...]]:
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
    return tuple(w for *_, w in sorted(found)), tuple(numbers)


def _stem(word: str) -> str:
    word = word.casefold()
    for suffix in ("ing", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


# An object's keys as Instance._keys plans them: (key, schema or default, is a default), the keys named, how many more
# minProperties wants, and the schema of those.
KeyPlan = tuple[list[tuple[str, Any, bool]], frozenset[str], int, Any]


class Instance:
    """The JSON text of a value valid against one schema (``root`` resolves its $refs), written as fragments in
    order, lazily: the reader takes as many as it needs (``pieces`` stops at a budget), so a schema's counts
    (minItems, minLength, minProperties, a recursion) cost only what is read, never what they ask for. The text
    is what ``json.dumps(value, ensure_ascii=False)`` writes for the value."""

    def __init__(self, root: Any, words: Words) -> None:
        self.root = root
        self.words = words
        self.rng = words.rng
        self._flats: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(schema) -> (schema, flattened): once each
        self._busy: set[int] = set()  # flattening in progress: a reference back to one is a circle
        self._key_plans: dict[tuple[int, bool], tuple[Any, KeyPlan]] = {}  # an object's keys, once per schema object

    def write(self, schema: Any, depth: int = 0) -> Iterator[str]:
        if depth > MAX_DEPTH:
            raise SchemaError("the schema recurses without end")
        if schema is True or schema is None or schema == {}:
            yield _dump(self.words.word())
            return
        if schema is False or not isinstance(schema, dict):
            raise SchemaError("a schema must be an object or a boolean")
        schema = self._flat(schema)
        if "const" in schema:
            yield _dump(schema["const"])
            return
        if "enum" in schema:
            options = schema["enum"]
            if not isinstance(options, list) or not options:
                raise SchemaError("'enum' must be a non-empty array")
            yield _dump(self.words.named(options))
            return
        kind = _kind(schema)
        if kind == "object":
            yield from self._object(schema, depth)
        elif kind == "array":
            yield from self._array(schema, depth)
        elif kind in ("integer", "number"):
            yield _dump(self._number(schema, kind == "integer"))
        elif kind == "boolean":
            yield _dump(self.rng.random() < 0.5)
        elif kind == "null":
            yield "null"
        else:
            yield from self._string(schema)

    def _flat(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The schema with its $ref, allOf and anyOf/oneOf (the first option that is not null) folded in; made
        once per schema object, so a schema that names one definition many times costs it once."""
        key = id(schema)
        known = self._flats.get(key)
        if known is not None:
            return known[1]
        if key in self._busy:
            raise SchemaError("the schema's references go round in a circle")
        self._busy.add(key)
        try:
            flat = self._flatten(schema)
        finally:
            self._busy.discard(key)
        self._flats[key] = (schema, flat)
        return flat

    def _flatten(self, schema: dict[str, Any]) -> dict[str, Any]:
        for _ in range(MAX_DEPTH):
            if "$ref" in schema:
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                target = self._resolve(schema["$ref"])
                if not rest:
                    return self._flat(target)
                schema = {**target, **rest}
            elif "allOf" in schema:
                parts = schema["allOf"]
                if not isinstance(parts, list):
                    raise SchemaError("'allOf' must be an array of schemas")
                merged = {k: v for k, v in schema.items() if k != "allOf"}
                for part in parts:
                    merged = _merge(merged, self._flat(part) if isinstance(part, dict) else {})
                schema = merged
            elif "anyOf" in schema or "oneOf" in schema:
                key = "anyOf" if "anyOf" in schema else "oneOf"
                options = [o for o in schema[key] or () if isinstance(o, dict)] if isinstance(schema[key], list) \
                    else []
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

    def _object(self, schema: dict[str, Any], depth: int) -> Iterator[str]:
        chosen, planned, more, extra = self._keys(schema, depth < SHALLOW)
        named = set(planned) if more else set()  # the keys so far, when more are made up (the plan stays as it is)
        yield "{"
        for i, (key, sub, is_default) in enumerate(chosen):
            yield (", " if i else "") + _dump(key) + ": "
            if is_default:
                yield _dump(copy.deepcopy(sub))
            else:
                yield from self.write(sub, depth + 1)
        for i in range(more):
            key = self.words.word()
            while key in named:
                key = f"{key}_{len(named)}"
            named.add(key)
            yield (", " if chosen or i else "") + _dump(key) + ": "
            yield from self.write(extra, depth + 1)
        yield "}"

    def _keys(self, schema: dict[str, Any], shallow: bool) -> KeyPlan:
        """An object's keys, chosen before any value is written, once per schema object and side of SHALLOW
        (they take no randomness): the properties (required ones, those with a default, and above SHALLOW every
        one), required keys it does not describe, how many more minProperties wants, and the schema of those;
        maxProperties drops the first that are not required."""
        memo = (id(schema), shallow)
        known = self._key_plans.get(memo)
        if known is not None:
            return known[1]
        properties = schema.get("properties") or {}
        if not isinstance(properties, dict):
            raise SchemaError("'properties' must be an object")
        required = [k for k in schema.get("required") or () if isinstance(k, str)]
        needed = set(required)
        extra = schema.get("additionalProperties", True)
        chosen: list[tuple[str, Any, bool]] = []  # (key, its schema, or its default when the flag says so)
        for key, sub in properties.items():
            if key in needed:
                chosen.append((key, sub, False))
            elif isinstance(sub, dict) and "default" in sub:
                chosen.append((key, sub["default"], True))  # what a model leaves out, the client fills in
            elif shallow:
                chosen.append((key, sub, False))
        named = {key for key, _, _ in chosen}
        for key in dict.fromkeys(required):
            if key not in named:
                chosen.append((key, extra if isinstance(extra, dict) else {}, False))
                named.add(key)
        wanted = _count(schema, "minProperties", 1 if not properties and isinstance(extra, dict) else 0)
        more = max(0, wanted - len(chosen)) if extra is not False else 0
        most = schema.get("maxProperties")
        if isinstance(most, int) and not isinstance(most, bool):
            drop = max(0, len(chosen) + more - most)
            optional = set([key for key, _, _ in chosen if key not in needed][:drop])
            chosen = [entry for entry in chosen if entry[0] not in optional]
            named -= optional
            more = max(0, more - (drop - len(optional)))
        plan = (chosen, frozenset(named), more, extra if isinstance(extra, dict) else {})
        self._key_plans[memo] = (schema, plan)
        return plan

    def _array(self, schema: dict[str, Any], depth: int) -> Iterator[str]:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", {})
        if isinstance(items, list):  # draft 4-7 tuples
            prefix, items = items, schema.get("additionalItems", {})
        if not isinstance(prefix, list):
            raise SchemaError("'prefixItems' must be an array of schemas")
        low = _count(schema, "minItems", 0)
        high = schema.get("maxItems")
        count = max(low, len(prefix), 0 if depth >= SHALLOW else 1 + (self.rng.random() < 0.5))
        if items is False:
            count = min(count, len(prefix))
        if isinstance(high, int) and not isinstance(high, bool):
            count = min(count, high)
        unique = bool(schema.get("uniqueItems"))
        seen: set[str] = set()  # the items written, as text (uniqueItems)
        yield "["
        for i in range(count):  # a range is lazy: minItems of 10**12 costs what is read
            sub = prefix[i] if i < len(prefix) else items
            item = self._unique(sub, depth, seen, i >= low) if unique else self.write(sub, depth + 1)
            if item is None:
                break  # no new item, and minItems is met: the array ends here
            if i:
                yield ", "
            yield from item
        yield "]"

    def _unique(self, sub: Any, depth: int, seen: set[str], may_end: bool) -> Iterator[str] | None:
        """An item not among ``seen`` (up to 9 tries, then an enum's unused member), as fragments; None when none
        is found and the array may end. An item of more than UNIQUE_FRAGMENTS fragments is not compared (it is
        written as it comes: its text is long enough to be all but surely new), so a try costs a bounded amount."""
        for _ in range(9):
            writer = self.write(sub, depth + 1)
            head = list(itertools.islice(writer, UNIQUE_FRAGMENTS + 1))
            if len(head) > UNIQUE_FRAGMENTS:
                return itertools.chain(head, writer)
            text = "".join(head)
            if text not in seen:
                seen.add(text)
                return iter((text,))
        options = self._flat(sub).get("enum") if isinstance(sub, dict) else None
        for option in options if isinstance(options, list) else ():
            text = _dump(option)
            if text not in seen:
                seen.add(text)
                return iter((text,))
        if may_end:
            return None
        raise SchemaError("the array's items cannot be made unique")

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

    def _string(self, schema: dict[str, Any]) -> Iterator[str]:
        """A format's value or the prompt's next word, more words to ``minLength``, cut at ``maxLength``. A string
        longer than SHORT_STRING is written a word at a time (and its ``pattern`` is not tried)."""
        form = schema.get("format")
        maker = _FORMATS.get(form) if isinstance(form, str) else None
        value = maker(self.rng) if maker else self.words.word()
        low = _count(schema, "minLength", 0)
        high = schema.get("maxLength")
        high = high if isinstance(high, int) and not isinstance(high, bool) and high >= 0 else None
        end = low if high is None else min(low, high)  # where padding stops
        while len(value) < min(end, SHORT_STRING):
            value += " " + self.words.word()
        if high is not None:
            value = value[:high]
        if len(value) >= end and end <= SHORT_STRING:
            pattern = schema.get("pattern")
            if isinstance(pattern, str):
                value = _matching(pattern, value, self.rng)
            yield _dump(value)
            return
        yield '"' + _dump(value)[1:-1]
        length = len(value)
        while length < end:
            word = (" " + self.words.word())[: (high - length) if high is not None else None]
            length += len(word)
            yield _dump(word)[1:-1]
        yield '"'


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
    low, high = _number_of(schema, "minimum"), _number_of(schema, "maximum")
    exclusive_low, exclusive_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if exclusive_low is True and low is not None:
        low += tiny
    elif exclusive_low is not None and not isinstance(exclusive_low, bool):
        bound = _number_of(schema, "exclusiveMinimum")
        assert bound is not None
        low = max(low, bound + tiny) if low is not None else bound + tiny
    if exclusive_high is True and high is not None:
        high -= tiny
    elif exclusive_high is not None and not isinstance(exclusive_high, bool):
        bound = _number_of(schema, "exclusiveMaximum")
        assert bound is not None
        high = min(high, bound - tiny) if high is not None else bound - tiny
    if low is None and high is None:
        low, high = 1, 100
    elif low is None:
        assert high is not None
        low = high - 100
    elif high is None:
        high = low + 100
    assert low is not None and high is not None
    if low > high or (integer and math.ceil(low) > math.floor(high)):
        raise SchemaError("the number's bounds leave no value")
    return low, high


def _number_of(schema: dict[str, Any], key: str) -> float | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SchemaError(f"'{key}' must be a number")
    return value


def _count(schema: dict[str, Any], key: str, default: int) -> int:
    """A count the schema gives (minItems, minLength, minProperties): a whole number of 0 or more."""
    value = schema.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0 \
            or value != int(value):
        raise SchemaError(f"'{key}' must be a non-negative integer")
    return int(value)


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {**a, **b}
    if isinstance(a.get("properties"), dict) and isinstance(b.get("properties"), dict):
        out["properties"] = {**a["properties"], **b["properties"]}
    if isinstance(a.get("required"), list) and isinstance(b.get("required"), list):
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    return out


def _matching(pattern: str, value: str, rng: random.Random) -> str:
    """``value`` if it matches ``pattern``, else the first of a few plain candidates that does; ``value`` as it
    stands when the pattern is not one a search is sure to be quick on (see ``_quick_pattern``)."""
    if _quick_pattern(pattern) is None:
        return value
    candidates = (value, value.lower(), value.upper(), str(rng.randint(0, 9999)), "a", "A1")
    return next((c for c in candidates if len(c) <= PATTERN_SUBJECT and _found(pattern, c)), value)


@functools.lru_cache(maxsize=256)
def _quick_pattern(pattern: str) -> re.Pattern[str] | None:
    """The compiled pattern if a backtracking search of it on PATTERN_SUBJECT characters takes at most
    PATTERN_STEPS steps (every repeat of one character, a repeat's choices and a branch's alternatives
    multiplied, at every start); None for a pattern that does not compile or could take longer: a repeated group,
    a repeat inside a repeat, as ``(a+)+$`` or ``(a|aa)*b``, can take exponential time (Python's ``re`` has no
    timeout, and holds the interpreter while it searches)."""
    if len(pattern) > 1000:
        return None
    try:
        cost = PATTERN_SUBJECT * _search_cost(_sre_parser.parse(pattern))
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError):
        return None
    return compiled if cost <= PATTERN_STEPS else None


_ONE_CHARACTER = (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN, _sre.CATEGORY)
_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", _sre.MAX_REPEAT))


def _search_cost(items: Any) -> float:
    """An upper bound of a backtracking match's steps from one start (infinite for a repeat of more than one
    character)."""
    cost = 1.0
    for op, av in items:
        if op in _REPEATS:
            low, high, body = av
            if len(body) != 1 or body[0][0] not in _ONE_CHARACTER:
                return math.inf
            if low != high:
                cost *= PATTERN_SUBJECT
        elif op is _sre.SUBPATTERN:
            cost *= _search_cost(av[3])
        elif op is getattr(_sre, "ATOMIC_GROUP", None):
            cost *= _search_cost(av)
        elif op is _sre.BRANCH:
            cost *= sum(_search_cost(branch) for branch in av[1])
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            cost *= _search_cost(av[1])
        elif op is _sre.GROUPREF_EXISTS:
            cost *= _search_cost(av[1]) + (_search_cost(av[2]) if av[2] is not None else 1)
    return cost


@functools.lru_cache(maxsize=4096)
def _found(pattern: str, candidate: str) -> bool:
    regex = _quick_pattern(pattern)
    return regex is not None and regex.search(candidate) is not None


def instance(schema: Any, words: Words) -> Any:
    """The whole value (every fragment read): for schemas known to be small, as tests use it."""
    return json.loads("".join(Instance(schema, words).write(schema)))


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


def schema_in(text: str, limit: int = 100_000, tries: int = 32) -> dict[str, Any] | None:
    """The first JSON object in ``text``'s first ``limit`` characters that reads as a JSON schema (it has
    properties, or $defs), trying at most ``tries`` of its braces (a text of many cannot cost their square)."""
    decoder = json.JSONDecoder()
    head = text[:limit]
    at = head.find("{")
    for _ in range(tries):
        if at < 0:
            return None
        try:
            value, end = decoder.raw_decode(head, at)
        except (ValueError, RecursionError):
            at = head.find("{", at + 1)
            continue
        if isinstance(value, dict) and ("properties" in value or "$defs" in value or "definitions" in value):
            return value
        at = head.find("{", end)
    return None


def wants_fenced_json(question: str) -> bool:
    """The question asks for JSON in a markdown code block (instructor's MD_JSON mode, and people)."""
    folded = question.casefold()
    return "```json" in folded or "json codeblock" in folded or "json code block" in folded


@dataclass(eq=False)
class Call:
    """One tool call: its name and id, and its arguments' JSON text as the script has written it so far
    (``fragments`` are what it writes from, read only as the script needs them)."""

    name: str
    fragments: Iterator[str] = field(default_factory=lambda: iter(()), repr=False)
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex[:16]}")
    written: list[str] = field(default_factory=list, repr=False)

    @property
    def arguments(self) -> str:
        return "".join(self.written)


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


class ToolPlan:
    """A request's tool calls, worked out once for its n answers: the chosen tools (indices into ``tools``, see
    ``choose``) and, per tool, the prompt's words its strings come from; ``calls`` makes one answer's calls."""

    def __init__(self, tools: list[dict[str, Any]], chosen: list[int], text: str) -> None:
        self.tools = tools
        self.text = text
        self.chosen = chosen
        self.every = frozenset().union(*(tool_terms(t["function"]) for t in tools)) if chosen else frozenset()
        self.ranked = dict(relevant(tools, text)) if chosen else {}

    def calls(self, rng: random.Random) -> list[Call]:
        """Each chosen tool called with arguments valid against its parameters (written when the script reads
        them), its strings from the prompt's words nearest the words that chose it (the other tools' left out)."""
        out = []
        for i in self.chosen:
            function = self.tools[i]["function"]
            words = Words.of(self.text, rng, exclude=self.every, anchors=self.ranked.get(i, ()))
            parameters = function.get("parameters") or {"type": "object", "properties": {}}
            out.append(Call(function["name"], Instance(parameters, words).write(parameters)))
        return out


def calls(tools: list[dict[str, Any]], chosen: list[int], text: str, rng: random.Random) -> list[Call]:
    """The calls of the ``chosen`` tools, their arguments not yet written (``tool_script`` writes them)."""
    return ToolPlan(tools, chosen, text).calls(rng)


# -- what the engine writes, and what a stream sends for it -------------------------------------------------------

Tag = tuple[str, int] | None  # what a piece is in a tool script: None (syntax), or (its delta's kind, call index)


class Script:
    """The pieces the engine writes for a structured answer, made as the engine asks for them (``piece``), and
    for each the delta a stream sends (None: the piece is the tool-call syntax around the arguments, sent as
    nothing, as vLLM's parsers hold it back).

    ``mode``: "json" (content), "named" (the arguments only, vLLM's named tool choice), "required" (vLLM's JSON
    list of calls) or "auto" (calls in the Hermes syntax a tool parser reads). A schema found unsatisfiable only
    after the first pieces (in a later answer of n, on a path of its own) ends the script there, ``failed``."""

    def __init__(self, mode: str, source: Iterator[tuple[str, Tag]], calls: list[Call]) -> None:
        self.mode = mode
        self.calls = calls
        self.pieces: list[str] = []
        self.failed = False
        self._tags: list[Tag] = []
        self._source: Iterator[tuple[str, Tag]] | None = source

    def piece(self, position: int) -> str | None:
        """The piece at ``position`` (0 first), or None if the script ends before it. Pieces are made in order,
        up to this one: reading a script's first k pieces costs k pieces, whatever its schema asks for."""
        self._make(position + 1, strict=False)
        return self.pieces[position] if position < len(self.pieces) else None

    def fill(self, count: int) -> None:
        """Make the first ``count`` pieces now (fewer if the script ends), raising SchemaError if the schema
        turns out unsatisfiable within them: what a request is refused for before it starts."""
        self._make(count, strict=True)

    def _make(self, count: int, strict: bool) -> None:
        while len(self.pieces) < count and self._source is not None:
            try:
                piece, tag = next(self._source)
            except StopIteration:
                self._source = None
            except SchemaError:
                self._source = None
                if strict:
                    raise
                self.failed = True
            else:
                self.pieces.append(piece)
                self._tags.append(tag)

    def ended(self, written: int) -> bool:
        """The script has no piece after its first ``written`` (it is written out, or ``failed``)."""
        return self.piece(written) is None

    def delta(self, position: int) -> dict[str, Any] | None:
        """The delta a stream sends for the piece at ``position`` (made before)."""
        piece = self.pieces[position]
        if self.mode == "json":
            return {"content": piece}
        tag = self._tags[position]
        if tag is None:
            return None
        kind, index = tag
        call = self.calls[index]
        if kind == "head":
            return {"tool_calls": [{"id": call.id, "type": "function", "index": index,
                                    "function": {"name": call.name}}]}
        if kind == "first":
            return {"tool_calls": [{"id": call.id, "type": "function", "index": index,
                                    "function": {"name": call.name, "arguments": piece}}]}
        if self.mode == "required":
            return {"tool_calls": [{"index": index, "function": {"name": None, "arguments": piece}}]}
        return {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}

    @property
    def deltas(self) -> list[dict[str, Any] | None]:
        """The deltas of the pieces made so far."""
        return [self.delta(i) for i in range(len(self.pieces))]

    def message(self, written: int) -> tuple[str | None, list[dict[str, Any]]]:
        """The message's content and tool calls after ``written`` pieces (all of them, or fewer when cut at
        max_tokens: vLLM's named choice keeps the partial arguments, the others no call)."""
        text = "".join(self.pieces[:written])
        if self.mode == "json":
            return text, []
        if self.mode == "named":
            return "", [_tool_call(self.calls[0], text)]
        if self.failed or not self.ended(written):
            return ("" if self.mode == "required" else text), []
        return ("" if self.mode == "required" else None), [_tool_call(c, c.arguments) for c in self.calls]

    @property
    def finish(self) -> str:
        """vLLM's finish_reason when the script is written: "tool_calls", but "stop" for a named tool (as OpenAI);
        "length" for a script that ``failed`` (its JSON is cut short)."""
        if self.failed:
            return "length"
        return "tool_calls" if self.mode in ("required", "auto") else "stop"


def _tool_call(call: Call, arguments: str) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _content(fragments: Iterable[str]) -> Iterator[tuple[str, Tag]]:
    """Content pieces of the text the fragments make (one empty piece for no text: the engine writes one)."""
    empty = True
    for piece in tokenizer.stream_pieces(fragments):
        empty = False
        yield piece, None
    if empty:
        yield "", None


def json_script(schema: Any, words: Words, fenced: bool = False) -> Script:
    """A JSON value valid against ``schema`` as content (in a ```json block when ``fenced``)."""
    fragments: Iterable[str] = Instance(schema, words).write(schema)
    if fenced:
        fragments = itertools.chain(("```json\n",), fragments, ("\n```",))
    return Script("json", _content(fragments), [])


def text_script(text: str) -> Script:
    """Content written as given (one of a ``choice`` constraint's strings)."""
    return Script("json", _content((text,)), [])


def tool_script(mode: str, chosen: list[Call]) -> Script:
    return Script(mode, _tool_pieces(mode, chosen), chosen)


def _tool_pieces(mode: str, chosen: list[Call]) -> Iterator[tuple[str, Tag]]:
    for index, call in enumerate(chosen):
        if mode == "required":
            yield from _syntax(("[" if index == 0 else ", ") + json.dumps({"name": call.name})[:-1]
                               + ', "parameters": ')
        elif mode == "auto":
            yield from _syntax(("\n" if index else "") + "<tool_call>\n" + json.dumps({"name": call.name})[:-1]
                               + ', "arguments": ', ("head", index))
        first: Tag = ("arg", index) if mode == "auto" else ("first", index)
        rest: Tag = ("arg", index)
        for n, piece in enumerate(tokenizer.stream_pieces(call.fragments)):
            call.written.append(piece)
            yield piece, first if n == 0 else rest
        if mode == "required":
            yield from _syntax("}" + ("]" if index == len(chosen) - 1 else ""))
        elif mode == "auto":
            yield from _syntax("}\n</tool_call>")


def _syntax(text: str, last: Tag = None) -> Iterator[tuple[str, Tag]]:
    """The pieces of tool-call syntax (sent as nothing), the last of them tagged ``last``."""
    pieces = tokenizer.pieces(text)
    for i, piece in enumerate(pieces):
        yield piece, last if i == len(pieces) - 1 else None
