"""What the simulator takes a question to mean: a canonical form that wordings of one question share.

A real engine at temperature 0 gives one answer to a question however it is worded; the simulator has no model,
so it answers a canonical form of the question instead of its text. The form keeps what decides an answer and
drops what only words it:

- the question's content words, each reduced to a stem (English: lower-cased, plural ``-s``, ``-ed``/``-ing``/
  ``-er`` and a final ``-e`` cut, at most 7 letters; Korean: one particle cut from each word, the polite and
  plain sentence endings cut, the stem's last 아/어 contraction undone, at most 4 letters of its jamo), as a set:
  word order, function words, politeness and inflection do not change the answer;
- the closed classes that change it kept as words: negation (not, no, never, without, 안, 못, ...),
  quantifiers (all, any, every, some, ...), numbers, and every content word that is not a function word;
- who does what to whom kept as roles: the word after ``from`` (or a Korean word marked 에서/부터) is the source,
  after ``to``/``into`` following a content word (or marked 로/으로/까지/에게/한테) the destination, so swapping the
  two ends changes the form ("km to miles" / "miles to km", "집주인이 세입자에게" / "세입자가 집주인에게").

What it cannot see, it does not pretend to: synonyms ("exit"/"quit"), numerals in words ("세 개"/"3개") and a
word borrowed in another script ("아이폰"/"iPhone") are other forms, so the simulator answers them as another
question (the cache audit then sees the engine answer two paraphrases differently, as it would on an engine that
did). A role carried by word order alone ("the landlord pays the tenant" / "the tenant pays the landlord") is
not seen either. Pure and cheap: ~7 us a question (a longer prompt is answered by its text), no model,
nothing shared with the gateway.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from workers.sim import tokenizer

_WORD = re.compile(r"[^\W_]+|[%°$€£¥#+]")
_HANGUL = re.compile(r"[\uac00-\ud7a3]")
_ENGLISH_FUNCTION = frozenset(
    "a an the do does did doing done can could would should will shall may might must ca wo i me my mine myself "
    "you your yours we our us it its is are was were be been being am how what which who whom whose why when where "
    "there here this that these those please tell explain show let know way ways s t d ll ve re m of on at by "
    "with for about as and or if so just really actually get got getting use using in on have has had out up some one "
    "single at all mean means".split()
) - frozenset("all some one".split())  # quantifiers and numbers carry meaning
_UNIVERSAL = frozenset({"every", "each", "all"})  # one quantifier, three words
_NEGATION_EN = re.compile(r"n['\u2019]t\b")
_SOURCE_EN = frozenset({"from"})
_DESTINATION_EN = frozenset({"to", "into", "toward", "towards"})
# Korean particles, longest first: one is cut from a word. The role a particle marks, if any.
_PARTICLES = (("에서부터", "src"), ("에게서", "src"), ("에서는", "src"), ("에서", "src"), ("부터", "src"),
              ("에게는", "dst"), ("한테는", "dst"), ("에게", "dst"), ("한테", "dst"), ("까지", "dst"),
              ("으로", "dst"), ("로", "dst"), ("께", "dst"), ("이랑", ""), ("랑", ""), ("하고", ""),
              ("와", ""), ("과", ""), ("의", ""), ("을", ""), ("를", ""), ("은", ""), ("는", ""), ("이", ""),
              ("가", ""), ("도", ""), ("만", ""), ("에", ""))
_AFTER_CONSONANT = frozenset({"이", "을", "은", "과", "으로", "이랑"})
_AFTER_VOWEL = frozenset({"가", "를", "는", "와", "로", "랑"})
# Sentence endings (polite, plain, question), longest first, cut from the last letters of a predicate.
_ENDINGS = ("습니까", "습니다", "ㅂ니까", "ㅂ니다", "십시오", "주세요", "세요", "나요", "가요", "까요", "예요", "에요",
            "어요", "아요", "해요", "이에요", "이야", "니까", "는지", "ㄹ까", "냐", "니", "죠", "지", "요", "야",
            "줘", "어", "아", "다", "면", "는", "ㄴ", "ㄹ")
# Words that only frame a question, as stems: 주다 "give" as a helper verb, 알려 "tell", 좀, 뭐, 어떻게,
# 방법/법 "way", 하다, 되다.
_KOREAN_FUNCTION = frozenset({"ㅈㅜ", "ㅈㅗㅁ", "ㅁㅜ", "ㅇㅏㄹㄹ", "ㅇㅓㄸㅓ", "ㅇㅓㄸㅓㅎㄱㅔ", "ㅂㅏㅇㅂ",
                              "ㅂㅓㅂ", "ㅎㅏ", "ㄷㅚ"})
# A stem's last vowel as 아/어 contracted it: 리+어=려, 주+어=줘, 오+아=와, 되+어=돼, 하+여=해.
_CONTRACTED = {"ㅕ": "ㅣ", "ㅝ": "ㅜ", "ㅘ": "ㅗ", "ㅙ": "ㅚ", "ㅐ": "ㅏ"}
_LEADS = "ㄱㄲㄴㄷㄸㄹㅁㅂㅃㅅㅆㅇㅈㅉㅊㅋㅌㅍㅎ"
_VOWELS = "ㅏㅐㅑㅒㅓㅔㅕㅖㅗㅘㅙㅚㅛㅜㅝㅞㅟㅠㅡㅢㅣ"
_TAILS = ("", "ㄱ", "ㄲ", "ㄳ", "ㄴ", "ㄵ", "ㄶ", "ㄷ", "ㄹ", "ㄺ", "ㄻ", "ㄼ", "ㄽ", "ㄾ", "ㄿ", "ㅀ", "ㅁ", "ㅂ",
          "ㅄ", "ㅅ", "ㅆ", "ㅇ", "ㅈ", "ㅊ", "ㅋ", "ㅌ", "ㅍ", "ㅎ")
MAX_CHARS = 2000  # a question is shorter; the form costs ~0.15 us a character
# 하다 ("do"), 주다 ("give") and the copula 이다 after a noun or a verb:
# 삭제하는 = 삭제, 알려 줘 = 알려, 얼마입니까 = 얼마
_LIGHT_VERBS = ("ㅎㅏ", "ㅈㅜ", "ㅇㅣ")
_JAMO_STEM = 4  # a short stem's first letters: enough for an irregular verb's two forms (만들어/만드나요)
_JAMO_WHOLE = 7  # a stem this long (three syllables or more) is kept whole: 로그인 is not 로그아웃
_BINDS = frozenset({"many", "much"})


def jamo(word: str) -> str:
    """A Hangul word as its letters (jamo), other characters as they are."""
    out = []
    for ch in word:
        code = ord(ch) - 0xAC00
        if 0 <= code < 11172:
            out += [_LEADS[code // 588], _VOWELS[code % 588 // 28], _TAILS[code % 28]]
        else:
            out.append(ch)
    return "".join(out)


_ENDING_JAMO = tuple(jamo(ending) for ending in _ENDINGS)


def _english_stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    for suffix in ("ing", "ed", "er", "or"):
        if len(word) - len(suffix) >= 4 and word.endswith(suffix):
            word = word[:-len(suffix)]
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word[:7]


def _attaches(stem: str, particle: str) -> bool:
    """Whether ``particle`` can follow ``stem``: 이/을/은/과/으로 only after a final consonant (받침), 가/를/는/와
    only after a vowel (로 after a vowel or ㄹ), so a noun that ends in one (와이파이, 회의) keeps it."""
    last = ord(stem[-1]) - 0xAC00
    if not 0 <= last < 11172:
        return particle not in _AFTER_CONSONANT
    if len(particle) == 1 and particle not in _AFTER_CONSONANT | _AFTER_VOWEL:
        return len(stem) >= 2  # 의, 도, 만, 에 end many a two-syllable noun (회의, 포도): cut after two syllables
    tail = last % 28
    if particle in _AFTER_CONSONANT:
        return tail != 0
    return tail == 0 or (particle == "로" and tail == 8) if particle in _AFTER_VOWEL else True


def _korean(word: str) -> tuple[str, str]:
    """A Korean word's stem (its first jamo) and the role its particle marks ('' for none)."""
    role = ""
    for particle, marks in _PARTICLES:
        if word.endswith(particle) and len(word) > len(particle) and _attaches(word[:-len(particle)], particle):
            word, role = word[:-len(particle)], marks
            break
    letters = jamo(word)
    for _ in range(2):  # an ending and the one it ends on: 맞는 표현인가요 = 표현이
        for ending in _ENDING_JAMO:
            if letters.endswith(ending) and len(letters) > len(ending) + 1:
                letters = letters[:-len(ending)]
                break
    if letters and letters[-1] in _CONTRACTED:
        letters = letters[:-1] + _CONTRACTED[letters[-1]]
    for light in _LIGHT_VERBS:
        if letters.endswith(light) and len(letters) > len(light):
            letters = letters[:-len(light)]
            break
    return (letters if len(letters) >= _JAMO_WHOLE else letters[:_JAMO_STEM]), role


@dataclass(frozen=True, slots=True)
class Understood:
    """A question as the simulator understands it: its canonical form, and the words an answer to it speaks of
    (its stems, each one token of the simulator's tokenizer), both the same for wordings it sees through."""

    form: str
    words: tuple[str, ...]


def understand(question: str) -> Understood:
    """The question's canonical form and the words its answer uses; a prompt longer than ``MAX_CHARS`` (a load
    test's, not a question) is its own form, its answer using its words (``tokenizer.topic``)."""
    if len(question) > MAX_CHARS:
        return Understood("", tokenizer.topic(question))
    form = canonical(question)
    stems = (stem.rpartition(":")[2] for stem in form.split())
    words = (_compose(stem)[:10] if _JAMO_LETTER.search(stem) else stem[:10] for stem in stems)
    kept = (w for w in words if w.isalpha() and (len(w) >= 2 or not w.isascii()))
    return Understood(form, tuple(dict.fromkeys(f" {w}" for w in kept)))


_JAMO_LETTER = re.compile(r"[\u3131-\u3163]")


def _compose(letters: str) -> str:
    """Jamo back into syllables, as far as they make whole ones (a stem cut inside a syllable loses the rest)."""
    out, i = [], 0
    while i + 1 < len(letters) and letters[i] in _LEADS and letters[i + 1] in _VOWELS:
        tail = 0
        if i + 2 < len(letters) and letters[i + 2] in _TAILS[1:] and not (
                i + 3 < len(letters) and letters[i + 3] in _VOWELS):
            tail = _TAILS.index(letters[i + 2])
        out.append(chr(0xAC00 + _LEADS.index(letters[i]) * 588 + _VOWELS.index(letters[i + 1]) * 28 + tail))
        i += 3 if tail else 2
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def canonical(question: str) -> str:
    """The question's canonical form (see the module): equal for wordings of one question it can see through,
    different when a content word, a negation, a quantifier, a number or a role differs."""
    text = _NEGATION_EN.sub(" not", unicodedata.normalize("NFKC", question).lower())
    words = _WORD.findall(text)
    plain: set[str] = set()
    roles: set[str] = set()
    pending = ""  # the role the next English content word takes
    bind = ""  # a number (or "how many") is one with the unit it counts
    previous_content = False
    for word in words:
        if _HANGUL.search(word):
            stem, role = _korean(word)
            if not stem or stem in _KOREAN_FUNCTION:
                continue
            role, pending = role or pending, ""
            (roles if role else plain).add(f"{role}:{stem}" if role else stem)
            previous_content = True
            continue
        if word in _SOURCE_EN:
            pending = "src"
            continue
        if word in _DESTINATION_EN:
            pending = "dst" if previous_content else pending
            previous_content = False
            continue
        if word in _ENGLISH_FUNCTION:
            previous_content = False
            continue
        if word in _UNIVERSAL:
            word = "all"
        if not word.isalpha() or word in _BINDS:
            bind = f"{bind}{word}:"
            continue
        stem = bind + _english_stem(word)
        bind = ""
        if pending:
            roles.add(f"{pending}:{stem}")
            pending = ""
        else:
            plain.add(stem)
        previous_content = True
    if bind:
        plain.add(bind)
    if not plain and not roles:
        return unicodedata.normalize("NFKC", question).strip().lower()
    return " ".join(sorted(plain)) + " | " + " ".join(sorted(roles))
