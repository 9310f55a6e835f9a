"""Who does what to what: a question's arguments aligned with their roles, and its predicates.

A question's *frame* maps each argument word to the role it plays (subject, object, source, goal (a recipient
too), possessor, comparison) and lists its content predicates. Two questions are interchangeable only if their frames
agree; ``conflict`` names how they do not:

- ``role``: two arguments trade roles (the landlord pays the tenant / the tenant pays the landlord; 집주인이
  세입자에게 / 세입자가 집주인에게);
- ``direction``: an argument moves between the source and the goal (PDF를 엑셀로 / 엑셀을 PDF로; from A to B / from
  B to A);
- ``opposite``: a predicate meets its opposite, derived (enable / disable, 활성화 / 비활성화: a negating prefix on
  the same stem) or listed in the lexicon's antonym pairs; or, on the same object, a predicate that has an opposite
  (start, 켜다) is replaced by another predicate (start / halt a container, 컨테이너를 시작하다 / 멈추다).

Korean is read by kiwipiepy's morphological analyser: each noun phrase takes the role of the particle after it
(이/가, 을/를, 에서, 로/으로, 에게/한테, 까지, 의, 보다 ...), and predicates are the analyser's lemmas (켜, 끄) and
the nouns a 하다/되다 suffix turns into verbs (시작, 중지). A noun phrase is its nouns with a determiner or an
adjective before them (주 서버, 큰 회사): each word takes the role, and so does a phrase of several words as a
whole, so two phrases of one head noun (주 서버 / 복제 서버) that trade places are still seen to. English is read
by a light parse of its own: a noun phrase after from/to/into/than/by/of takes that preposition's role ("to"
before a determiner is always one), and the nearest content words before and after the verb take subject and
object; the verb is the word a modal, "to" or a pronoun subject comes before.

The analyser loads once, lazily, on first use (about a second); ``warm`` loads it ahead, off the event loop.
Called on a thread that runs an event loop before it has loaded, ``korean_frame`` does not load it there: it
returns ``None`` (not analysed) and starts loading on a thread of its own; ``conflict`` then reports ``unread``,
which the verifier treats as a near-miss. Frames are cached per text. Thread-safe: the analyser is only read
once built, under a lock for its construction.
"""

from __future__ import annotations

import asyncio
import re
import threading
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from gateway.cache.lexicon import ANTONYMS, FILLER, INFINITIVE_CUES, KO_LOANWORDS, KO_VERB_ANTONYMS, SYNONYM_OF


class Role(Enum):
    SUBJECT = "subject"
    OBJECT = "object"
    SOURCE = "source"
    GOAL = "goal"
    POSSESSOR = "possessor"
    THAN = "than"


_DIRECTIONAL = {Role.SOURCE, Role.GOAL}


@dataclass(frozen=True, slots=True)
class Frame:
    """Argument word -> its role (a word found in two roles is left out: it proves nothing), and the content
    predicates' lemmas."""

    roles: Mapping[str, Role] = field(default_factory=lambda: MappingProxyType({}))
    predicates: frozenset[str] = frozenset()


# --- opposites ---------------------------------------------------------------------------------------------------

_OPPOSITE: dict[str, set[str]] = {}
for _a, _b in [*ANTONYMS, *KO_VERB_ANTONYMS]:
    if " " not in _a and " " not in _b:
        _OPPOSITE.setdefault(_a, set()).add(_b)
        _OPPOSITE.setdefault(_b, set()).add(_a)
# Opposite verb particles, from the lexicon's phrasal pairs that share their verb (log in / log out: in, out).
_PARTICLE_OPPOSITES = {(a.split()[1], b.split()[1]) for a, b in ANTONYMS if a.count(" ") == b.count(" ") == 1
                       and a.split()[0] == b.split()[0]}
_PARTICLE_OPPOSITES |= {(b, a) for a, b in _PARTICLE_OPPOSITES}
_PARTICLES = {p for pair in _PARTICLE_OPPOSITES for p in pair}
_KO_NEGATING = ("비", "불", "미", "무", "반", "역")
_EN_NEGATING = ("un", "dis", "de", "non", "anti")


def _derived_opposites(a: str, b: str) -> bool:
    """One stem, opposite prefixes: one negates (enable/disable, mute/unmute, 활성화/비활성화), or the two are
    opposites themselves (upgrade/downgrade, overestimate/underestimate)."""
    stem = 0
    while stem < min(len(a), len(b)) and a[-1 - stem] == b[-1 - stem]:
        stem += 1
    if stem < 2 or (stem < 3 and not _hangul(a[-1])):
        return False
    pa, pb = a[: len(a) - stem], b[: len(b) - stem]
    if not pa or not pb:
        return (pa or pb) in (_KO_NEGATING if _hangul(a[-1]) else _EN_NEGATING)
    return pb in _OPPOSITE.get(pa, ())


def opposite(a: str, b: str) -> bool:
    """Two predicates' lemmas are opposites, by a negating prefix on one stem or the lexicon's antonym pairs."""
    if a == b:
        return False
    if " " in a and " " in b:  # check in / check out: one verb, opposite particles
        (verb_a, particle_a), (verb_b, particle_b) = a.split(" ", 1), b.split(" ", 1)
        return verb_a == verb_b and (particle_a, particle_b) in _PARTICLE_OPPOSITES
    if _derived_opposites(a, b):
        return True
    return b in _OPPOSITE.get(a, ()) or f"{b}다" in _OPPOSITE.get(f"{a}다", ())


def _polar(lemma: str) -> bool:
    """A predicate with a listed or derived opposite: replacing it changes the action."""
    return lemma in _OPPOSITE or f"{lemma}다" in _OPPOSITE or any(
        lemma.startswith(p) and len(lemma) - len(p) >= 2 for p in (_KO_NEGATING if _hangul(lemma[0]) else ()))


def _same(a: str, b: str) -> bool:
    return a == b or b in SYNONYM_OF.get(a, ()) or a in SYNONYM_OF.get(b, ())


# --- comparing frames --------------------------------------------------------------------------------------------

def conflict(a: Frame | None, b: Frame | None) -> str | None:
    """How two frames disagree ("role", "direction", "opposite"), "unread" if either is None, or None: they agree."""
    if a is None or b is None:
        return "unread"
    shared = [w for w in a.roles.keys() & b.roles.keys() if w not in FILLER]
    for word in shared:
        ra, rb = a.roles[word], b.roles[word]
        if ra != rb and {ra, rb} <= _DIRECTIONAL:
            return "direction"  # from X / to X, X에서 / X로
    for i, x in enumerate(shared):
        for y in shared[i + 1:]:
            ax, ay, bx, by = a.roles[x], a.roles[y], b.roles[x], b.roles[y]
            if ax != ay and ax == by and ay == bx:
                return "role" if Role.SUBJECT in (ax, ay) else "direction"
    # a role's word replaced by a word the other question has in another role (파이썬 코드를 자바로 / 자바 코드를
    # 파이썬으로: 코드 keeps its role, 파이썬 and 자바 trade theirs)
    for mine, theirs in ((a, b), (b, a)):
        for word, role in mine.roles.items():
            if word in FILLER or word in theirs.roles or role not in _DIRECTIONAL or " " in word:
                continue  # (a whole phrase missing from the other question is its words, compared one by one)
            for other, other_role in theirs.roles.items():
                if other_role == role and other in mine.roles and mine.roles[other] != role and other not in FILLER:
                    return "direction"
    only_a = {p for p in a.predicates if not any(_same(p, q) for q in b.predicates)}
    only_b = {p for p in b.predicates if not any(_same(p, q) for q in a.predicates)}
    if any(opposite(p, q) for p in only_a for q in only_b):
        return "opposite"
    acted_on = {w for w, r in a.roles.items() if r is Role.OBJECT and b.roles.get(w) is Role.OBJECT}
    if acted_on and only_a and only_b and (any(map(_polar, only_a)) or any(map(_polar, only_b))):
        return "opposite"  # the same thing acted on, an action with an opposite replaced by another
    return None


# --- Korean ------------------------------------------------------------------------------------------------------

def _hangul(ch: str) -> bool:
    return "\uac00" <= ch <= "\ud7a3"


_KO_ROLE_OF_PARTICLE: dict[str, Role] = {
    "에서": Role.SOURCE, "에게서": Role.SOURCE, "한테서": Role.SOURCE, "로부터": Role.SOURCE, "으로부터": Role.SOURCE,
    "부터": Role.SOURCE, "에서부터": Role.SOURCE,
    "로": Role.GOAL, "으로": Role.GOAL, "까지": Role.GOAL,
    "에게": Role.GOAL, "한테": Role.GOAL, "께": Role.GOAL, "더러": Role.GOAL,
    "보고": Role.GOAL, "에": Role.GOAL,
    "보다": Role.THAN, "의": Role.POSSESSOR, "은": Role.SUBJECT, "는": Role.SUBJECT,
}
_KO_GLUED = ("으로", "에서", "에게", "한테", "로")
_KO_TAG_ROLE = {"JKS": Role.SUBJECT, "JKO": Role.OBJECT, "JKG": Role.POSSESSOR}
_KO_NOUN = ("NNG", "NNP", "NNB", "SL", "SH", "SN", "XR")  # NNB: 엔, 원 read as counters
_KO_LIGHT = {"하", "되", "있", "없", "주", "보", "싶", "않", "같", "어떻", "이렇", "그렇", "수", "이", "아니", "가능",
             "필요", "말", "위하", "대하", "통하", "관하"}


class _Analyser:
    """kiwipiepy's Kiwi, built once (lazily, under a lock) and only read after."""

    def __init__(self) -> None:
        self._kiwi: Any = None
        self._lock = threading.Lock()
        self._loading: threading.Thread | None = None

    def get(self) -> Any:
        if self._kiwi is None:
            with self._lock:
                if self._kiwi is None:
                    from kiwipiepy import Kiwi

                    kiwi = Kiwi(num_workers=-1, load_multi_dict=False, load_typo_dict=False)
                    for word in KO_LOANWORDS:  # product and language names the analyser would split (자바 -> 자 바)
                        kiwi.add_user_word(word, "NNP")
                    kiwi.tokenize("준비")  # the first analysis allocates the model's buffers: here, not in a lookup
                    self._kiwi = kiwi
        return self._kiwi

    @property
    def ready(self) -> bool:
        return self._kiwi is not None

    def load_in_background(self) -> None:
        with self._lock:
            if self._kiwi is None and self._loading is None:
                self._loading = threading.Thread(target=self.get, name="kiwi-load", daemon=True)
                self._loading.start()


_ANALYSER = _Analyser()


def warm() -> None:
    """Load the Korean analyser now. Blocking, and it holds the interpreter's lock for about two seconds (kiwipiepy
    builds its model and first analysis in C++ without releasing it), so a thread does not hide it from an event
    loop: call it before the loop serves (gateway.cli does)."""
    _ANALYSER.get()


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def korean_frame(text: str) -> Frame | None:
    """The frame of a Korean question, or None if the analyser is not loaded and this thread runs an event loop
    (it then loads on a thread of its own)."""
    if not _ANALYSER.ready and _on_loop():
        _ANALYSER.load_in_background()
        return None
    return _korean_frame(unicodedata.normalize("NFKC", text))


@lru_cache(maxsize=4096)
def _korean_frame(text: str) -> Frame:
    tokens = _ANALYSER.get().tokenize(text)
    roles: dict[str, set[Role]] = {}
    predicates: dict[str, int] = {}  # lemma -> where its word starts
    phrase: list[str] = []
    prefix = modifier = ""
    end = -1  # where the last noun ended: a noun glued to it is one word with it (집주인 read as 집 + 주인)
    for i, tok in enumerate(tokens):
        form, tag = tok.form, tok.tag.split("-")[0]
        if tag == "VX" and form == "주" and i >= 2 and tokens[i - 2].tag.startswith("VV"):
            # V-어 주다: a verb of its own where the lexicon pairs it (빌려주다 / 빌리다), a favour asked otherwise
            verb = tokens[i - 2]
            lexical = text[verb.start: tok.start + tok.len].replace(" ", "")
            if f"{lexical}다" in _OPPOSITE:
                predicates.pop(verb.form, None)
                predicates[lexical] = verb.start
            continue
        if tag == "XPN":
            prefix = form
            continue
        if tag in _KO_NOUN and len(form) >= 3 and form.endswith(_KO_GLUED) and (
                i + 1 == len(tokens) or tokens[i + 1].start > tok.start + tok.len):
            # a word the analyser does not know, its particle left on (바트로): split it off
            particle = next(p for p in _KO_GLUED if form.endswith(p))
            phrase.append((prefix + form[: -len(particle)]).lower())
            for word in _arguments(phrase):
                roles.setdefault(word, set()).add(_KO_ROLE_OF_PARTICLE[particle])
            phrase.clear()
            prefix = ""
            continue
        if tag in _KO_NOUN:
            if phrase and tok.start == end and not prefix:
                phrase[-1] += form.lower()
            else:
                if modifier and not phrase:
                    phrase.append(modifier)
                phrase.append((prefix + form).lower())
            end = tok.start + tok.len
            prefix = modifier = ""
            continue
        if tag == "MM" and not (form == "이" and tok.start == end):
            # a determiner is part of its noun phrase (주 서버 and 복제 서버: the analyser reads the same 주 as a
            # noun in one question and a determiner in the other)
            phrase.append((prefix + form).lower())
            end = tok.start + tok.len
            prefix = ""
            continue
        prefix = ""
        if tag == "XSN" and phrase:
            phrase[-1] += form  # 활성 + 화
            end = tok.start + tok.len
            continue
        if tag in ("XSV", "XSA") and phrase:
            noun = phrase.pop()  # 시작 + 하다: the noun is the predicate
            if noun not in _KO_LIGHT:
                predicates[noun] = tok.start
            phrase.clear()
            continue
        role = _KO_TAG_ROLE.get(tag) or (_KO_ROLE_OF_PARTICLE.get(form) if tag in ("JKB", "JX") else None)
        if tag == "MM" and form == "이" and tok.start == end:
            role = Role.SUBJECT  # 선생님이 read as 선생님 + 이 (this): glued to the noun it is the particle
        if role is not None:
            # the argument is the word as written up to its particle, whatever the analyser made of it (바트로
            # read as 바 + 트 + 로)
            start = tok.start
            while start > 0 and not text[start - 1].isspace():
                start -= 1
            written = text[start: tok.start].lower()
            if written and all(ch.isalnum() for ch in written) and not (phrase and phrase[-1] == written):
                predicates = {p: at for p, at in predicates.items() if at < start}  # misread inside the word
                if phrase and written.endswith(phrase[-1]) and tok.start == end:
                    phrase[-1] = written
                elif not phrase or tok.start != end:
                    phrase = [*phrase[:-1], written] if phrase and tok.start != end else [written]
        if role is not None and phrase:
            for word in _arguments(phrase):
                roles.setdefault(word, set()).add(role)
        if tag in ("VV", "VA") and form not in _KO_LIGHT:
            predicates[form] = tok.start
        if tag.startswith("J") or tag[0] in "VEM" or tag.startswith("S"):
            phrase.clear()
        end = -1
        # an adjective before a noun is part of its phrase (큰 회사, 작은 회사): kept across its ending (-ㄴ)
        following = tokens[i + 1].tag if i + 1 < len(tokens) else ""
        modifier = form if tag == "VA" and following == "ETM" else modifier if tag == "ETM" else ""
    return Frame(MappingProxyType({w: next(iter(r)) for w, r in roles.items() if len(r) == 1}),
                 frozenset(predicates))


def _arguments(phrase: list[str]) -> list[str]:
    """The argument words a noun phrase gives its role: each word, and the phrase as a whole when it has several.
    A word the phrases share (서버 in 주 서버 and 복제 서버) is in two roles and proves nothing; the whole phrases
    still trade roles when the questions swap them, and a phrase of several words is never filler."""
    return [*phrase, " ".join(phrase)] if len(phrase) > 1 else phrase


# --- English -----------------------------------------------------------------------------------------------------

_EN_TOKEN = re.compile(r"[a-z0-9]+(?:[.'+#-][a-z0-9]+)*")
_EN_ROLE_OF_PREPOSITION = {"from": Role.SOURCE, "to": Role.GOAL, "into": Role.GOAL, "onto": Role.GOAL,
                           "toward": Role.GOAL, "towards": Role.GOAL, "than": Role.THAN, "of": Role.POSSESSOR,
                           "by": Role.SUBJECT}
_EN_OTHER_PREPOSITIONS = {"in", "at", "on", "for", "with", "without", "about", "after", "before", "during",
                          "against", "under", "over", "between", "through", "via", "using", "per", "across",
                          "when", "while", "if", "and", "or", "but", "because", "so", "as", "like", "out", "up",
                          "off", "down", "back", "away", "each", "every", "month", "year", "week", "day", "night"}
_EN_VERB_CUES = {"to", "i", "you", "we", "they", "can", "could", "should", "would", "will", "must", "may", "might",
                 "shall", "not", "please", "let's", "lets", "and", "or"}
_EN_AUX = {"do", "does", "did", "is", "are", "was", "were", "can", "could", "should", "would", "will", "must",
           "may", "might", "shall", "has", "have", "had"}
_EN_DETERMINERS = {"a", "an", "the", "my", "your", "our", "their", "his", "her", "its", "this", "that", "these",
                   "those", "some", "any", "all", "each", "every", "no"}
_EN_QUESTION = {"what", "which", "who", "whom", "how", "why", "when", "where", "whose", "much", "many", "often",
                "long", "is", "are", "do", "does", "did", "can", "could", "should", "would", "will", "must", "may"}
_EN_LIGHT = {"be", "is", "are", "was", "were", "do", "does", "did", "have", "has", "had", "get", "make", "use",
             "go", "need", "want", "know", "tell", "find", "see", "take", "give", "keep", "let", "happen", "mean",
             "cost", "work", "try"}


def english_frame(text: str) -> Frame:
    """The frame of an English question (see the module's docstring)."""
    return _english_frame(unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'"))


def _lemma(word: str) -> str:
    for suffix, repl in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: -len(suffix)] + repl
    return word


@lru_cache(maxsize=4096)
def _english_frame(text: str) -> Frame:
    words = [w[:-2] if w.endswith("'s") else w for w in _EN_TOKEN.findall(text)]
    possessed = {i for i, w in enumerate(_EN_TOKEN.findall(text)) if w.endswith("'s")}
    verb = _verb_index(words)
    roles: dict[str, set[Role]] = {}
    predicates: set[str] = set()
    if verb is not None and _lemma(words[verb]) not in _EN_LIGHT:
        particle = words[verb + 1] if verb + 1 < len(words) and words[verb + 1] in _PARTICLES else ""
        predicates.add(f"{_lemma(words[verb])} {particle}".strip())  # a phrasal verb with its particle
    role: Role | None = None
    for i, word in enumerate(words):
        if word in _EN_ROLE_OF_PREPOSITION and not (word == "to" and _infinitive(words, i)):
            role = _EN_ROLE_OF_PREPOSITION[word]
            continue
        if word in _EN_OTHER_PREPOSITIONS or word in _EN_AUX or (verb is not None and i == verb):
            role = None
            continue
        if word in FILLER or word in _EN_DETERMINERS or word in _EN_QUESTION:
            continue
        here = role
        if here is None and verb is not None:
            here = Role.SUBJECT if i < verb else Role.OBJECT
        if i in possessed:
            here = Role.POSSESSOR
        if here is not None:
            roles.setdefault(word, set()).add(here)  # as written: "https" is no plural of "http"
    return Frame(MappingProxyType({w: next(iter(r)) for w, r in roles.items() if len(r) == 1}),
                 frozenset(predicates))


def _infinitive(words: list[str], i: int) -> bool:
    """'to' before a verb ("how to convert", "the command to start"), not a goal ("to Paris", and never "to" before
    a determiner: "the plan to the monthly plan")."""
    before = words[i - 1] if i else ""
    if i + 1 < len(words) and words[i + 1] in _EN_DETERMINERS:
        return False
    return before in INFINITIVE_CUES or before in ("command", "it", "is", "okay", "ok", "cheaper", "quicker")


def _verb_index(words: list[str]) -> int | None:
    """The main verb: the word after "to" of an infinitive, after a modal or pronoun subject, or after the noun
    phrase an auxiliary opens ("does a landlord | owe"); an imperative's first word."""
    for i, word in enumerate(words[:-1]):
        if word == "to" and _infinitive(words, i):
            return i + 1
        if word in ("i", "you", "we", "they") and words[i + 1] not in FILLER:
            return i + 1
    stops = _EN_DETERMINERS | _EN_OTHER_PREPOSITIONS | set(_EN_ROLE_OF_PREPOSITION)
    for i, word in enumerate(words):
        if word in _EN_AUX and i + 1 < len(words):
            j = i + 1
            if words[j] in ("i", "you", "we", "they", "it", "he", "she", "not"):
                return j + 1 if j + 1 < len(words) else None
            if words[j] not in _EN_DETERMINERS:  # a bare subject is one word: "do cats | chase dogs"
                return j + 1 if j + 1 < len(words) and words[j + 1] not in stops else None
            # a determiner's phrase, then the verb: the last word before a determiner, a preposition or the end
            # ("does the parent process inherit | from the child")
            j += 1
            k = j + 1
            while k < len(words) and words[k] not in stops and k - j < 4:
                k += 1
            return k - 1 if k - j >= 2 else None
    if words and words[0] not in _EN_QUESTION and words[0] not in FILLER:
        return 0
    return None


def _looks_verb(words: list[str], j: int) -> bool:
    """A word after a noun that opens a determiner's phrase: a verb ("the tenant | pay the landlord")."""
    return j + 1 < len(words) and words[j + 1] in _EN_DETERMINERS


def frame(text: str) -> Frame | None:
    """The frame of a question, by its script: Korean if it holds Hangul, else English."""
    if any(_hangul(ch) for ch in text):
        return korean_frame(text)
    return english_frame(text)


def frames(texts: Iterable[str]) -> list[Frame | None]:
    return [frame(t) for t in texts]
