"""The near-miss verifier: between "cosine >= threshold" and "serve".

Embeddings place "convert km to miles" and "convert miles to km" at cosine 0.99: the words are the same,
the answer is not. This check compares what changes an answer (numbers, units and their order, negation,
quantifiers, polar words, times, comparatives, named entities, who does what to what (gateway.cache.roles:
parties swapped, a direction turned around, an action against its opposite), and any small substitution of a
content word) and names the first difference it finds. Features and frames are cached per text.

Korean is read by its morphology (see the Korean section below, and gateway.cache.roles for the analyser's
roles): on multilingual-e5 Korean paraphrases and must-miss pairs both score near 0.97, so these rules, not the
threshold, decide. Until the Korean analyser has loaded, a Korean pair checked on an event loop's thread is
refused ("unread"); the analyser never loads there.
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
    EST_NOT_SUPERLATIVE,
    FILLER,
    KO_B_IRREGULAR,
    KO_BOUNDS,
    KO_COUNTERS,
    KO_ENDING_SYLLABLES,
    KO_LOANWORDS,
    KO_MAN_NOUNS,
    KO_NATIVE_SHORT,
    KO_NATIVE_TENS,
    KO_NATIVE_UNITS,
    KO_NOT_NUMBERS,
    KO_PARTICLE_ORDER,
    KO_PARTICLES,
    KO_SINO_COUNTERS,
    KO_SINO_DIGITS,
    KO_SINO_GROUPS,
    KO_SINO_PLACES,
    KO_TIME_PERIODS,
    KO_TIME_PREFIXES,
    KO_UNITS,
    KO_VERB_ANTONYMS,
    KO_VERB_ENDINGS,
    NEGATIONS,
    NUMBER_WORDS,
    OPPOSITE,
    PLACES,
    POLAR,
    QUANTIFIERS,
    SYNONYM_OF,
    TIME_WORDS,
    UNIT_NEEDS_NUMBER,
    UNIT_OF,
)
from gateway.cache.roles import conflict, frame

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
    compact: str  # the text without spaces or punctuation (띄어쓰기 varies freely)


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


_POLAR_ALL = POLAR | {p for pair in ANTONYMS for p in pair if " " in p}


@lru_cache(maxsize=4096)
def features(text: str) -> Features:
    """Answer-changing features of a question (cached: the same candidate is checked many times)."""
    normal = _normalise(text)
    tokens = _ko_tokens(normal) if any(_hangul(ch) for ch in normal) else tuple(_TOKEN.findall(normal))
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
    polar = frozenset((words | bigrams) & _POLAR_ALL)
    times = frozenset(words & _TIMES) | frozenset(t for t in tokens if re.fullmatch(r"(19|20)\d\d", t)) | {
        # "7 am" / "7 pm": a time only after a number ("I am" is not)
        t for prev, t in itertools.pairwise(tokens) if t in ("am", "pm") and prev[0].isdigit()}
    comparatives = frozenset((words | bigrams) & COMPARATIVES) | frozenset(
        t for t in tokens if t.endswith("est") and len(t) > 5 and t not in EST_NOT_SUPERLATIVE and t.isalpha()
        and t.isascii()) | frozenset(  # 180 이상, 19세 미만: a bound after a number
        t for i, t in enumerate(tokens) if t in KO_BOUNDS and any(p[0].isdigit() for p in tokens[max(0, i - 3): i]))
    compact = _compact(text)
    return Features(tokens, tuple(numbers), tuple(units), negations, polar, times, comparatives,
                    _entities(text, tokens, compact), compact)


def _compact(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).lower() if ch.isalnum())


def _conversion_context(tokens: tuple[str, ...], i: int) -> bool:
    window = tokens[max(0, i - 3): i + 3]
    return any(t in ("to", "into", "from", "convert", "conversion", "per", "in") for t in window)


def _entities(text: str, tokens: tuple[str, ...], compact: str) -> frozenset[str]:
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
    words = set(tokens) | {f"{a} {b}" for a, b in itertools.pairwise(tokens)}
    found.update(words & PLACES)
    if any(_hangul(ch) for ch in compact):
        found.update(p for p in _KO_PLACES if p in compact)
    return frozenset(found)


def _mentions(features: Features, entity: str) -> bool:
    """A Korean name may be glued to what follows it (서울날씨); a Latin one is a whole token."""
    if _hangul(entity[0]):
        return entity in features.compact or entity in features.tokens
    return f" {entity} " in f" {' '.join(features.tokens)} "


def _stems(word: str) -> set[str]:
    """The word and what it may be an inflection of (files -> file, boxes -> box, painted -> paint)."""
    out = {word}
    for suffix in ("ing", "ed", "es", "s", "ly", "d"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out.add(word[: -len(suffix)])
    return out


def _same_meaning(a: str, b: str) -> bool:
    """Same word, an inflection of it (painted / painter / paints; 만들 / 만드, the ㄹ an ending drops), or a listed
    synonym."""
    if a == b or _stems(a) & _stems(b) or b in SYNONYM_OF.get(a, ()):
        return True
    if _hangul(a[0]) and _hangul(b[0]):
        if a[:-1] == b[:-1] and _with_final(a[-1], 0) == _with_final(b[-1], 0):
            return True
        short, long = sorted((a, b), key=len)
        if long == short + long[-1] and long[-1] in "리이히기우추":  # 걸 / 걸리: a stem's last vowel an ending took
            return True
        if _infinitive(a) == b or _infinitive(b) == a:  # 오 / 와
            return True
        return _strip_particle(a)[0] == _strip_particle(b)[0] or b in SYNONYM_OF.get(_ko_stem(a), ())
    shared = len(os.path.commonprefix([a, b]))
    return shared >= 5 and shared >= 0.7 * min(len(a), len(b)) and b not in OPPOSITE.get(a, ())


def verify(query: str, candidate: str) -> str | None:
    """None if serving ``candidate``'s answer for ``query`` is safe; otherwise the reason it is not."""
    if query == candidate:
        return None
    q, c = features(query), features(candidate)
    if q.compact == c.compact:
        return None
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
    if any(not _mentions(c, e) for e in q.entities) or any(not _mentions(q, e) for e in c.entities):
        return "entity"
    korean = any(_hangul(ch) for ch in q.compact + c.compact)
    if short or korean:  # who does what to what (gateway.cache.roles); on passages voice moves phrases
        clash = conflict(frame(query), frame(candidate))
        if clash is not None:
            return clash
    if not short:
        return None
    # Question-length text: one word carries the meaning, so wording changes are checked too. (On passages,
    # rewrites move phrases between active and passive voice, which reads as a swap.)
    if _quantifiers_differ(q, c):
        return "quantifier"
    if _preposition_object_swap(q.tokens, c.tokens):
        return "entity"
    if _small_substitution(q.tokens, c.tokens):
        return "substitution"
    return None


def _swapped(a: frozenset[str], b: frozenset[str], a_tokens: tuple[str, ...], b_tokens: tuple[str, ...],
             short: bool) -> bool:
    """A polar word on one side meets its opposite on the other, or (in a question-length text) a
    different polar word. One side alone carrying one ('make my site faster' / 'speed up my site') is
    left to the substitution check: rephrasings add and drop such words."""
    only_a = {w for w in a - b if not SYNONYM_OF.get(w, set()) & b}
    only_b = {w for w in b - a if not SYNONYM_OF.get(w, set()) & a}
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
    return any("".join(old) != "".join(new) and not all(any(_same_meaning(o, n) for n in new) for o in old)
               for old, new in swaps)


# --- Korean ------------------------------------------------------------------------------------------------------
# A Korean word (어절) is a stem with endings and particles glued on. Each is read as: its negation (안/못/-지 않다/
# 없다/아니다/-지 마), its particle (에서/으로/을/이 ...; the roles they give are gateway.cache.roles'), a
# numeral with its counter, a polar verb's stem (팝니다 -> 팔다), or else the stem left when the endings are
# stripped (해결합니까 -> 해결).

def _hangul(ch: str) -> bool:
    return "\uac00" <= ch <= "\ud7a3"


def _jamo(syllable: str) -> tuple[int, int, int]:
    code = ord(syllable) - 0xAC00
    return code // 588, (code % 588) // 28, code % 28


def _compose(initial: int, vowel: int, final: int) -> str:
    return chr(0xAC00 + initial * 588 + vowel * 28 + final)


_N, _L, _M, _B, _SS = 4, 8, 16, 17, 20  # finals ㄴ ㄹ ㅁ ㅂ ㅆ
_A, _EO = 0, 4  # vowels ㅏ ㅓ


def _with_final(syllable: str, final: int) -> str:
    initial, vowel, _ = _jamo(syllable)
    return _compose(initial, vowel, final)


def _infinitive(stem: str) -> str:
    """The 아/어 form: 사 -> 사, 켜 -> 켜, 끄 -> 꺼, 올리 -> 올려, 줄이 -> 줄여, 닫 -> 닫아, 빠르 -> 빨라, 하 -> 해."""
    last = stem[-1]
    initial, vowel, final = _jamo(last)
    bright = vowel in (_A, 8) if len(stem) == 1 else _jamo(stem[-2])[1] in (_A, 8)
    if last == "하":
        return stem[:-1] + "해"
    if final:
        return stem + ("아" if vowel in (_A, 8) else "어")
    if last == "르" and len(stem) > 1:
        before = stem[-2]
        return stem[:-2] + _with_final(before, _L) + ("라" if _jamo(before)[1] in (_A, 8) else "러")
    contracted = {18: _A if bright and len(stem) > 1 else _EO, 20: 6, 8: 9, 13: 14, 11: 10}.get(vowel, vowel)
    return stem[:-1] + _compose(initial, contracted, 0)


def _verb_forms(stem: str) -> dict[str, bool | str]:
    """Surface forms of a stem, each with whether it needs an ending after it (파 alone is not 팔다)."""
    forms: dict[str, bool | str] = {stem: False}
    last = stem[-1]
    _, _, final = _jamo(last)
    if stem in KO_B_IRREGULAR:
        soft = stem[:-1] + _with_final(last, 0)
        forms.update({soft + "우": True, soft + "운": False, soft + "울": False, soft + "워": False, soft + "웠": True})
        return forms
    if final == 0:
        for coda in (_N, _L, _B, _M):
            forms[stem[:-1] + _with_final(last, coda)] = coda == _B
    elif final == _L:  # the ㄹ drops before ㄴ, ㅂ, ㅅ and 오 (파는, 판, 팝니다, 파세요): 아이 is no form of 알다
        forms[stem[:-1] + _with_final(last, 0)] = "dropped"
        forms[stem[:-1] + _with_final(last, _N)] = True
        forms[stem[:-1] + _with_final(last, _B)] = True
    else:
        forms[stem + "으"] = True
        forms[stem + "습"] = True
    inf = _infinitive(stem)
    forms.setdefault(inf, False)
    if _jamo(inf[-1])[2] == 0:
        forms.setdefault(inf[:-1] + _with_final(inf[-1], _SS), True)
    return forms


def _build_verb_forms() -> dict[str, tuple[str, bool | str]]:
    out: dict[str, tuple[str, bool | str]] = {}
    for stem in sorted({s for pair in KO_VERB_ANTONYMS for s in pair}, key=len):
        for form, needs_ending in _verb_forms(stem).items():
            out[form] = (f"{stem}다", needs_ending)
    return out


_KO_VERB_FORMS = _build_verb_forms()
_KO_LONGEST_FORM = max(map(len, _KO_VERB_FORMS))
_KO_KNOWN = {w for w in TIME_WORDS | COMPARATIVES | POLAR | set(QUANTIFIERS) | PLACES | set(KO_LOANWORDS)
             | set(KO_BOUNDS) | set(UNIT_OF) | set(SYNONYM_OF) if w and _hangul(w[0]) and len(w) > 1}
_KO_PLACES = [p for p in PLACES if _hangul(p[0])]
_KO_COUNTER_SET = set(KO_COUNTERS)
_KO_NUMERAL_STARTS = {w[0] for w in (*KO_NATIVE_UNITS, *KO_NATIVE_SHORT, *KO_NATIVE_TENS, *KO_SINO_DIGITS,
                                    *KO_SINO_PLACES, *KO_SINO_GROUPS)}
_KO_TENS = sorted(KO_NATIVE_TENS.items(), key=lambda kv: -len(kv[0]))
_KO_TIMES = {prefix + period for prefix in set(KO_TIME_PREFIXES.values()) for period in KO_TIME_PERIODS}
_TIMES = TIME_WORDS | _KO_TIMES
_KO_MAL = {"마", "마요", "마세요", "마라", "말라", "말아", "말아요", "말고", "맙시다", "말자", "마십시오", "말아라",
           "말아줘", "마시오", "말지", "말까", "말까요", "말길"}
_KO_NEG_PREFIX = ("안되", "안돼", "안됩", "안된", "안될", "안됐", "안해", "안하", "안했", "안합", "안한", "안할")
_KO_MOT = ("못하", "못해", "못했", "못합", "못한", "못할", "못함")
_KO_ANI = ("아니", "아닌", "아냐", "아닙", "아녜", "아닐", "아님")


def _ending(rest: str) -> bool:
    if rest in KO_VERB_ENDINGS:
        return True
    return any(rest.startswith(e) and rest[len(e):] in KO_VERB_ENDINGS for e in KO_VERB_ENDINGS if e)


def _ko_verb(word: str) -> str | None:
    """The polar verb a word is a form of (팝니다 -> 팔다, 꺼줘 -> 끄다), longest form first."""
    for size in range(min(len(word), _KO_LONGEST_FORM), 0, -1):
        hit = _KO_VERB_FORMS.get(word[:size])
        if hit is not None:
            rest = word[size:]
            if hit[1] == "dropped" and not (rest and (_jamo(rest[0])[0] in (2, 9) or rest[0] == "오")):
                continue
            if (rest or not hit[1]) and _ending(rest):
                return hit[0]
    return None


def _strip_particle(word: str) -> tuple[str, str | None, bool]:
    """(stem, particle, only): the longest particle whose sound fits the syllable before it; 만 read as "only"."""
    for particle in KO_PARTICLE_ORDER:
        if not word.endswith(particle) or len(word) <= len(particle):
            continue
        stem = word[: -len(particle)]
        sound = KO_PARTICLES[particle][1]
        final = _jamo(stem[-1])[2]
        if (sound == "c" and not final) or (sound == "v" and final and not (particle.startswith("로") and final == _L)):
            continue
        if "만" in particle and stem + "만" in KO_MAN_NOUNS:
            continue
        return stem, particle, "만" in particle
    return word, None, False


def _ko_stem(word: str) -> str:
    """The word less its predicate endings (해결합니까 -> 해결, 포유류인가요 -> 포유류); a known word keeps its
    shape."""
    for size in range(len(word), 1, -1):
        if word[:size] in _KO_KNOWN and all(ch in KO_ENDING_SYLLABLES for ch in word[size:]):
            return word[:size]
    stem = word
    while len(stem) > 1 and stem[-1] in KO_ENDING_SYLLABLES:
        stem = stem[:-1]
    if stem != word and _jamo(stem[-1])[2] in (_B, _L, _N) and word[len(stem)] in "니까게래다데가지":
        stem = stem[:-1] + _with_final(stem[-1], 0)  # 걸립니까 -> 걸리, 살까 -> 사: the ending's consonant
    return stem


def _sino(word: str) -> int | None:
    """A Sino-Korean numeral (삼십 -> 30, 이십만 -> 200000), or None."""
    total = group = digit = 0
    seen = False
    for ch in word:
        if ch in KO_SINO_DIGITS:
            if seen and digit:
                return None
            digit, seen = KO_SINO_DIGITS[ch], True
        elif ch in KO_SINO_PLACES:
            group += (digit or 1) * KO_SINO_PLACES[ch]
            digit, seen = 0, True
        elif ch in KO_SINO_GROUPS:
            total += (group + digit or 1) * KO_SINO_GROUPS[ch]
            group = digit = 0
            seen = True
        else:
            return None
        if ch not in KO_SINO_DIGITS:
            seen = False
    return total + group + digit


def _native(word: str) -> tuple[int, bool] | None:
    """A native numeral (스물다섯 -> 25) and whether it is a short form that needs a counter (세, 열, 스무)."""
    value, short = 0, False
    for tens, n in _KO_TENS:
        if word.startswith(tens):
            value, word, short = n, word[len(tens):], tens in ("열", "스무")
            break
    if not word:
        return (value, short) if value else None
    for table, is_short in ((KO_NATIVE_UNITS, False), (KO_NATIVE_SHORT, True)):
        if word in table:
            return value + table[word], is_short
    return None


def _counter(word: str) -> str | None:
    """The counter a word starts with, if only a particle follows it (세개에; 두세요 is no counter)."""
    for size in (3, 2, 1):
        if word[:size] in _KO_COUNTER_SET and len(word) >= size:
            rest = word[size:]
            if not rest or rest in KO_PARTICLES:
                return word[:size]
    return None


def _ko_number(word: str, following: str) -> tuple[str, str] | None:
    """(digits, what follows the numeral) if the word is a numeral: alone when unambiguous, else before a counter
    glued on (세개, 삼십분) or in the next word (세 개, 오 분)."""
    if word in KO_NOT_NUMBERS or word[0] not in _KO_NUMERAL_STARTS:
        return None
    for size in range(len(word), 0, -1):
        head, rest = word[:size], word[size:]
        counter = _counter(rest) if rest else _counter(following)
        native = _native(head)
        if native is not None and (counter or (not rest and not native[1])):
            return str(native[0]), rest
        sino = _sino(head)
        if sino is not None:
            sino_counter = next((c for c in KO_SINO_COUNTERS if (rest or following).startswith(c)
                                 and _counter(rest or following)), None)
            placed = any(ch in KO_SINO_PLACES or ch in KO_SINO_GROUPS for ch in head)
            if (placed and size > 1 and (not rest or counter)) or sino_counter:
                return str(sino), rest
    return None


def _ko_words(word: str, previous: str, following: str, numbered: bool) -> tuple[list[str], bool]:
    """One Korean word as tokens, and whether it says "only"."""
    if word in ("안", "못") or word.startswith(("않", "없", *_KO_NEG_PREFIX, *_KO_MOT, *_KO_ANI)):
        return ["not"], False
    if word in _KO_MAL and previous.endswith("지"):
        return ["not"], False
    for marker in ("지않", "지못", "지마", "지말", "지맙", "없"):
        at = word.find(marker, 1)
        if at > 0:
            head = word[: at + 1] if marker.startswith("지") else word[:at]
            tokens, only = _ko_words(head, previous, "", numbered)
            return [*tokens, "not"], only
    stem, _, only = (word, None, False) if word in _KO_KNOWN else _strip_particle(word)
    if stem in KO_LOANWORDS:
        return [KO_LOANWORDS[stem]], only
    for size in range(len(stem) - 1, 1, -1):  # 파이썬설치 -> python + 설치
        if stem[:size] in KO_LOANWORDS:
            after, _ = _ko_words(stem[size:], "", following, False)
            return [KO_LOANWORDS[stem[:size]], *after], only
    whole = None if numbered and _counter(word) else _ko_number(word, following)
    if whole is not None:  # 이십만 is a number, not 이십 + 만 ("only")
        stem, only = word, False
    number = whole or (None if numbered and _counter(word) else _ko_number(stem, following))
    if number is not None:
        digits, rest = number
        return [digits, *([_ko_stem(rest)] if rest else [])], only
    for prefix, canonical in KO_TIME_PREFIXES.items():
        if stem.startswith(prefix) and stem[len(prefix):] in KO_TIME_PERIODS:
            return [canonical + stem[len(prefix):]], only
    for size in range(len(stem) - 1, 1, -1):  # 오늘밤 -> 오늘 밤
        if stem[:size] in TIME_WORDS and stem[size:] in TIME_WORDS:
            return [stem[:size], stem[size:]], only
    verb = None if numbered or stem in _KO_KNOWN else (_ko_verb(stem) or _ko_verb(word))
    if verb is not None:
        return [verb], only
    return [_ko_stem(stem)], only


def _ko_tokens(text: str) -> tuple[str, ...]:
    """Tokens of a normalised text with its Korean words read (see _ko_words)."""
    raw = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]
    tokens: list[str] = []
    for i, (word, start, _) in enumerate(raw):
        if not _hangul(word[0]):
            tokens.append(word)
            continue
        previous = raw[i - 1][0] if i else ""
        glued = bool(i) and raw[i - 1][2] == start and not _hangul(previous[0])
        if glued and previous[0].isdigit():
            group = next((g for g in KO_SINO_GROUPS if word.startswith(g)), None)
            if group and tokens and tokens[-1][0].isdigit():  # 5만 -> 50000, 3억
                try:
                    tokens[-1] = str(int(float(tokens[-1]) * KO_SINO_GROUPS[group]))
                except ValueError:
                    pass
                word = word[len(group):]
                if not word:
                    continue
        if glued and word in KO_PARTICLES:  # Java에서, String을
            if "만" in word:
                tokens.append("~만")
            continue
        following = raw[i + 1][0] if i + 1 < len(raw) else ""
        numbered = bool(tokens) and tokens[-1][0].isdigit()
        out, only = _ko_words(word, previous, following, numbered)
        tokens.extend(out)
        if only:
            tokens.append("~만")
    merged: list[str] = []
    for token in tokens:  # 이번 주 -> 이번주
        if merged and merged[-1] in KO_TIME_PREFIXES and token in KO_TIME_PERIODS:
            merged[-1] = KO_TIME_PREFIXES[merged[-1]] + token
        else:
            merged.append(token)
    return tuple(merged)

