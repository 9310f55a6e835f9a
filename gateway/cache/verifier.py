"""The near-miss verifier: between "cosine >= threshold" and "serve".

Embeddings place "convert km to miles" and "convert miles to km" at cosine 0.99: the words are the same,
the answer is not. This check compares what changes an answer (numbers, units and their order,
negation, which phrase is the source and which the destination, quantifiers, polar words, times,
comparatives, named entities, and any small substitution of a content word) and names the first difference
it finds. It is plain Python on two short strings: tens of
microseconds. It works on English and Korean text (particles stripped, Korean cue words listed).
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from gateway.cache.lexicon import (
    ANTONYMS,
    COMMON_STARTERS,
    COMPARATIVES,
    DESTINATION_PREPOSITIONS,
    EST_NOT_SUPERLATIVE,
    FILLER,
    INFINITIVE_CUES,
    KO_PARTICLES,
    KO_UNITS,
    NEGATIONS,
    NUMBER_WORDS,
    OPPOSITE,
    PHRASE_END,
    PLACES,
    POLAR,
    QUANTIFIERS,
    SOURCE_PREPOSITIONS,
    SYNONYM_OF,
    TIME_WORDS,
    UNIT_NEEDS_NUMBER,
    UNIT_OF,
)

_TOKEN = re.compile(r"°[cfk](?![a-z])|[0-9]+(?:[.,][0-9]+)*|[a-z]+(?:'[a-z]+)?|[\uac00-\ud7a3]+|[°℃℉$€£¥₩%]|[a-z]")
_PREPOSITIONS = {"in", "at", "from", "to", "near", "for", "of", "about", "into", "on", "between", "vs", "versus"}


@dataclass(frozen=True, slots=True)
class Features:
    tokens: tuple[str, ...]
    numbers: tuple[str, ...]
    units: tuple[str, ...]
    negations: int
    polar: frozenset[str]
    times: frozenset[str]
    comparatives: frozenset[str]
    entities: frozenset[str]


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("’", "'").replace("‘", "'")
    text = re.sub(r"\b(can)'t\b", r"\1 not", text)
    text = re.sub(r"\bwon't\b", "will not", text)
    text = re.sub(r"n't\b", " not", text)
    text = re.sub(r"'(s|re|ve|ll|d|m)\b", r" '\1", text)
    text = re.sub(r"(\d)([a-z°%$€£¥₩℃℉])", r"\1 \2", text)  # 10km -> 10 km
    text = re.sub(r"([$€£¥₩])(\d)", r"\1 \2", text)
    return text


def _strip_particle(token: str) -> str:
    if not ("\uac00" <= token[0] <= "\ud7a3") or len(token) < 2:
        return token
    for particle in KO_PARTICLES:
        if token.endswith(particle) and len(token) > len(particle):
            return token[: -len(particle)]
    return token


@lru_cache(maxsize=4096)
def features(text: str) -> Features:
    """Answer-changing features of a question (cached: the same candidate is checked many times)."""
    raw_tokens = _TOKEN.findall(_normalise(text))
    tokens = tuple(_strip_particle(t) for t in raw_tokens)
    numbers, units = [], []
    for i, tok in enumerate(tokens):
        if tok[0].isdigit():
            numbers.append(tok.replace(",", ""))
        elif tok in NUMBER_WORDS and not (tok == "one" and i + 1 < len(tokens) and tokens[i + 1] in ("of",)):
            numbers.append(NUMBER_WORDS[tok])
        unit = UNIT_OF.get(tok)
        if unit is None and "\uac00" <= tok[0] <= "\ud7a3":
            unit = next((UNIT_OF[sp] for sp in KO_UNITS if tok.startswith(sp)), None)
        if unit is not None:
            near_number = any(t[0].isdigit() or t in NUMBER_WORDS for t in tokens[max(0, i - 2): i + 1])
            if tok not in UNIT_NEEDS_NUMBER or near_number or _conversion_context(tokens, i):
                units.append(unit)
    negations = sum(1 for t in tokens if t in NEGATIONS or (len(t) > 3 and t.startswith("un")
                                                              and t[2:] in POLAR))
    words = set(tokens)
    bigrams = {f"{a} {b}" for a, b in itertools.pairwise(tokens)}
    polar = frozenset((words | bigrams) & (POLAR | {p for pair in ANTONYMS for p in pair if " " in p}))
    times = frozenset(words & TIME_WORDS) | frozenset(t for t in tokens if re.fullmatch(r"(19|20)\d\d", t)) | {
        # "7 am" / "7 pm": a time only after a number ("I am" is not)
        t for prev, t in itertools.pairwise(tokens) if t in ("am", "pm") and prev[0].isdigit()}
    comparatives = frozenset((words | bigrams) & COMPARATIVES) | frozenset(
        t for t in tokens if t.endswith("est") and len(t) > 5 and t not in EST_NOT_SUPERLATIVE and t.isalpha()
        and t.isascii())
    return Features(tokens, tuple(numbers), tuple(units), negations, polar, times, comparatives,
                    _entities(text, tokens))


def _conversion_context(tokens: tuple[str, ...], i: int) -> bool:
    window = tokens[max(0, i - 3): i + 3]
    return any(t in ("to", "into", "from", "convert", "conversion", "per", "in") for t in window)


def _entities(text: str, tokens: tuple[str, ...]) -> frozenset[str]:
    """Names: all-caps words, words mixing letters and digits, capitalised words that do not open a sentence
    (an opening word is a name only if it is not a common word), and known places."""
    found = set()
    normal = unicodedata.normalize("NFKC", text)
    lower_words = set(re.findall(r"(?<![A-Za-z])[a-z][a-z]+", normal))
    for match in re.finditer(r"[A-Za-z][A-Za-z0-9\-+.#]*", normal):
        word = match.group().rstrip(".")
        lower = " ".join(_TOKEN.findall(_normalise(word)))
        if not lower or lower == "i":
            continue
        before = normal[: match.start()].rstrip(" \"'`*([")
        opens_sentence = not before or before[-1] in ".?!:\n"
        if word.isupper() and len(word) >= 2 and lower not in ("am", "pm", "ok"):
            found.add(lower)
        elif any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
            found.add(lower)  # gpt-4, python3, iphone15
        elif word[0].isupper() and word.lower() not in lower_words and (
                not opens_sentence or lower not in COMMON_STARTERS | FILLER):
            found.add(lower)
    joined = f" {' '.join(tokens)} "
    found.update(p for p in PLACES if f" {p} " in joined)
    return frozenset(found)


def _stems(word: str) -> set[str]:
    """The word and what it may be an inflection of (files -> file, boxes -> box, painted -> paint)."""
    out = {word}
    for suffix in ("ing", "ed", "es", "s", "ly", "d"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out.add(word[: -len(suffix)])
    return out


def _same_meaning(a: str, b: str) -> bool:
    """Same word, an inflection of it (painted / painter / paints), or a listed synonym."""
    if a == b or _stems(a) & _stems(b) or b in SYNONYM_OF.get(a, ()):
        return True
    shared = len(os.path.commonprefix([a, b]))
    return shared >= 5 and shared >= 0.7 * min(len(a), len(b)) and b not in OPPOSITE.get(a, ())


def verify(query: str, candidate: str) -> str | None:
    """None if serving ``candidate``'s answer for ``query`` is safe; otherwise the reason it is not."""
    if query == candidate:
        return None
    q, c = features(query), features(candidate)
    if sorted(q.numbers) != sorted(c.numbers):
        return "number"
    if q.units and c.units and q.units != c.units:
        return "unit" if sorted(q.units) != sorted(c.units) else "direction"
    if q.negations != c.negations:
        return "negation"
    short = max(len(q.tokens), len(c.tokens)) <= _SHORT
    if _swapped(q.polar, c.polar, q.tokens, c.tokens, short):
        return "antonym"
    if q.times != c.times:
        return "time"
    if _swapped(q.comparatives, c.comparatives, q.tokens, c.tokens, short):
        return "comparative"
    q_text, c_text = f" {' '.join(q.tokens)} ", f" {' '.join(c.tokens)} "
    if any(f" {e} " not in c_text for e in q.entities) or any(f" {e} " not in q_text for e in c.entities):
        return "entity"
    if not short:
        return None
    # Question-length text: one word carries the meaning, so wording changes are checked too. (On passages,
    # rewrites move phrases between active and passive voice, which reads as a swap.)
    if _roles_swapped(q.tokens, c.tokens):
        return "direction"
    if _quantifiers_differ(q, c):
        return "quantifier"
    if _preposition_object_swap(q.tokens, c.tokens):
        return "entity"
    if _operands_swapped(q.tokens, c.tokens, q.entities | c.entities, any(_roles(q.tokens)) and any(_roles(c.tokens))):
        return "direction"
    if _small_substitution(q.tokens, c.tokens):
        return "substitution"
    return None


def _swapped(a: frozenset[str], b: frozenset[str], a_tokens: tuple[str, ...], b_tokens: tuple[str, ...],
             short: bool) -> bool:
    """A polar word on one side meets its opposite on the other, or (in a question-length text) a
    different polar word. One side alone carrying one ('make my site faster' / 'speed up my site') is
    left to the substitution check: rephrasings add and drop such words."""
    only_a, only_b = a - b, b - a
    if short and only_a and only_b:
        return True
    words_a, words_b = set(a_tokens), set(b_tokens)
    return any(OPPOSITE.get(w, set()) & words_b for w in only_a) or any(
        OPPOSITE.get(w, set()) & words_a for w in only_b)


def _preposition_object_swap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """'weather in oslo' vs 'weather in bergen': the same preposition governs different content words."""
    objects_a = {(p, o) for p, o in itertools.pairwise(a) if p in _PREPOSITIONS and o not in FILLER}
    objects_b = {(p, o) for p, o in itertools.pairwise(b) if p in _PREPOSITIONS and o not in FILLER}
    for prep, obj in objects_a:
        others = {o for p, o in objects_b if p == prep}
        if others and not any(_same_meaning(obj, o) for o in others) and obj not in b:
            return True
    return False


_SHORT = 20  # tokens: a question rather than a passage

_DIRECTIONAL = {"to", "into", "from", "than", "vs", "versus", "over", "per", "에서", "까지"}


def _operands_swapped(a: tuple[str, ...], b: tuple[str, ...], entities: frozenset[str], roles_known: bool) -> bool:
    """'X to Y' vs 'Y to X', 'A faster than B' vs 'B faster than A': the same words, the other direction."""
    def pairs(tokens: tuple[str, ...]) -> set[tuple[str, str, str]]:
        content = [t for t in tokens if t not in FILLER or t in _DIRECTIONAL]
        out = set()
        for i, tok in enumerate(content):
            if tok in _DIRECTIONAL and 0 < i < len(content) - 1:
                before = [t for t in content[:i] if t not in _DIRECTIONAL and t not in COMPARATIVES]
                if before:
                    out.add((before[-1], tok, content[i + 1]))
        return out
    pa, pb = pairs(a), pairs(b)
    if any((y, p, x) in pb for x, p, y in pa if x != y):
        return True
    # the order in which the named things appear, where the question has a direction and the phrases' roles
    # did not settle it ("from London to Paris" / "to Paris from London": roles on both sides, none swapped)
    if _DIRECTIONAL & set(a) and _DIRECTIONAL & set(b) and not roles_known:
        order_a = [t for t in a if t in entities]
        order_b = [t for t in b if t in entities]
        return sorted(order_a) == sorted(order_b) and len(set(order_a)) > 1 and order_a != order_b
    return False


def _quantifiers_differ(a: Features, b: Features) -> bool:
    """Both quantify, differently: any/some vs every/all/each vs none/no vs most. Under a negation ("does not
    mention any" = "mentions none") the classes shift, and the negation check has compared that already."""
    if a.negations or b.negations:
        return False
    classes_a, classes_b = _quantifier_classes(a.tokens), _quantifier_classes(b.tokens)
    return bool(classes_a and classes_b and classes_a != classes_b)


def _quantifier_classes(tokens: tuple[str, ...]) -> set[str]:
    """Idioms that only look quantified ("at all", "after all") do not count."""
    return {QUANTIFIERS[t] for i, t in enumerate(tokens)
            if t in QUANTIFIERS and not (t == "all" and i and tokens[i - 1] in ("at", "after"))}


def _canon(word: str) -> str:
    return word[:-1] if word.endswith("s") and len(word) > 3 and not word.endswith("ss") else word


def _roles(tokens: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """Content words where something comes from (after "from", or the object right before "to") and where it
    goes (after "to", "into" ...). Each phrase runs to the next preposition, conjunction or clause word."""
    source: set[str] = set()
    destination: set[str] = set()
    for i, token in enumerate(tokens):
        if token in SOURCE_PREPOSITIONS:
            role = source
        elif token in DESTINATION_PREPOSITIONS and not (i == 0 or tokens[i - 1] in INFINITIVE_CUES):
            role = destination
            for before in reversed(tokens[:i]):  # the thing that moves: "copy the unix timestamp | to ..."
                if before in PHRASE_END:
                    break
                if before not in FILLER:
                    source.add(_canon(before))
        else:
            continue
        for after in tokens[i + 1:]:
            if after in PHRASE_END:
                break
            if after not in FILLER:
                role.add(_canon(after))
    return source, destination


def _roles_swapped(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """A phrase is where something goes in one question and where it comes from in the other ("from my laptop
    to a remote server" / "from a remote server to my laptop"). Words in both roles on one side prove nothing."""
    source_a, destination_a = _roles(a)
    source_b, destination_b = _roles(b)
    moved = (destination_a & source_b) - source_a - destination_b
    moved_back = (source_a & destination_b) - destination_a - source_b
    return bool(moved or moved_back)


def _small_substitution(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Nearly identical wording with a content word swapped for an unrelated one ('peel an apple' vs
    'peel an orange'). Rephrasings change framing words; these keep the frame and change the subject."""
    content_a = [t for t in a if t not in FILLER]
    content_b = [t for t in b if t not in FILLER]
    matcher = difflib.SequenceMatcher(a=content_a, b=content_b, autojunk=False)
    changed = 0
    swaps: list[tuple[list[str], list[str]]] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        changed += max(i2 - i1, j2 - j1)
        if op == "replace":
            swaps.append((content_a[i1:i2], content_b[j1:j2]))
    if not swaps or changed > 2:
        return False
    return any(not all(any(_same_meaning(o, n) for n in new) for o in old) for old, new in swaps)
