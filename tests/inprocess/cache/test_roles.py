"""Who does what to what (gateway.cache.roles), as properties over generated questions in Korean and English:
swapping two arguments' roles, turning a conversion around, or replacing an action by its opposite is always a
near-miss; moving a free adverbial, or writing a particle in its other form, never is. Positive control: a
role-blind reading of the same frames (every argument in one role) passes the swaps, so the properties can fail."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.cache import roles
from gateway.cache.roles import Frame, Role, conflict, english_frame, frame, korean_frame, opposite
from gateway.cache.verifier import verify

_KO_PARTIES = ["집주인", "세입자", "고용주", "직원", "판매자", "구매자", "은행", "고객", "부모", "자녀", "선생님",
               "학생", "보험사", "가입자", "출판사", "작가", "의사", "환자", "회사", "근로자"]
_KO_GIVING = ["돌려줘야 하는 돈", "보내야 하는 서류", "지급하는 수수료", "청구할 수 있는 비용", "알려야 하는 내용",
              "요구할 수 있는 것"]
_KO_FORMATS = ["PDF", "엑셀", "워드", "한글 파일", "JSON", "CSV", "마크다운", "HTML", "이미지", "동영상"]
_KO_ADVERBIALS = ["보통", "한 달에", "계약이 끝나면", "법적으로", "일반적으로"]
_EN_PARTIES = ["landlord", "tenant", "employer", "employee", "seller", "buyer", "insurer", "policyholder",
               "publisher", "author", "client", "server", "parent", "child", "franchisor", "franchisee"]
_EN_VERBS = ["owe", "pay", "send", "notify", "charge", "tell"]
_EN_FORMATS = ["PDF", "Word", "Excel", "JSON", "YAML", "CSV", "HTML", "markdown", "PNG", "SVG"]
_EN_ADVERBIALS = ["each month", "in winter", "after a move", "when the lease ends", "in California"]


def _final(word: str) -> int:
    last = word[-1]
    if "\uac00" <= last <= "\ud7a3":
        return (ord(last) - 0xAC00) % 28
    return 1 if last.upper() in "LMNR" else 0  # Latin names read aloud: PDF (에프) ends in a vowel here


def _ko(word: str, vowel: str, consonant: str) -> str:
    return word + (consonant if _final(word) else vowel)


def _ko_to(word: str) -> str:
    final = _final(word)
    return word + ("로" if final in (0, 8) else "으로")  # ㄹ takes 로


_pair = st.lists(st.sampled_from(_KO_PARTIES), min_size=2, max_size=2, unique=True)


@settings(max_examples=40, deadline=None)
@given(_pair, st.sampled_from(_KO_GIVING), st.sampled_from(["에게", "한테"]))
def test_korean_parties_swapped_are_a_near_miss(parties: list[str], what: str, dative: str) -> None:
    a, b = parties
    first = f"{_ko(a, '가', '이')} {b}{dative} {what}은?"
    swapped = f"{_ko(b, '가', '이')} {a}{dative} {what}은?"
    assert conflict(korean_frame(first), korean_frame(swapped)) in ("role", "direction")
    assert verify(first, swapped) is not None and verify(swapped, first) is not None
    blind = _role_blind(korean_frame(first)), _role_blind(korean_frame(swapped))
    assert conflict(*blind) is None, "positive control: without roles the swap passes"


@settings(max_examples=40, deadline=None)
@given(_pair, st.sampled_from(_KO_GIVING), st.sampled_from(_KO_ADVERBIALS))
def test_korean_free_adverbials_and_particle_forms_keep_the_question(parties: list[str], what: str,
                                                                     adverbial: str) -> None:
    a, b = parties
    first = f"{_ko(a, '가', '이')} {b}에게 {adverbial} {what}은?"
    moved = f"{adverbial} {b}한테 {_ko(a, '가', '이')} {what}은?"  # adverbial and arguments moved, 에게 -> 한테
    assert conflict(korean_frame(first), korean_frame(moved)) is None


_formats = st.lists(st.sampled_from(_KO_FORMATS), min_size=2, max_size=2, unique=True)


@settings(max_examples=40, deadline=None)
@given(_formats, st.sampled_from(["바꾸는 방법", "변환하는 법", "옮기는 방법"]))
def test_korean_conversion_turned_around_is_a_near_miss(formats: list[str], how: str) -> None:
    x, y = formats
    there = f"{_ko(x, '를', '을')} {_ko_to(y)} {how}"
    back = f"{_ko(y, '를', '을')} {_ko_to(x)} {how}"
    assert conflict(korean_frame(there), korean_frame(back)) == "direction"
    assert verify(there, back) is not None
    assert conflict(korean_frame(there), korean_frame(f"{_ko_to(y)} {_ko(x, '를', '을')} {how}")) is None
    assert conflict(_role_blind(korean_frame(there)), _role_blind(korean_frame(back))) is None


_en_pair = st.lists(st.sampled_from(_EN_PARTIES), min_size=2, max_size=2, unique=True)


@settings(max_examples=40, deadline=None)
@given(_en_pair, st.sampled_from(_EN_VERBS), st.sampled_from(_EN_ADVERBIALS))
def test_english_parties_swapped_are_a_near_miss(parties: list[str], verb: str, adverbial: str) -> None:
    a, b = parties
    first = f"What does the {a} {verb} the {b} {adverbial}?"
    swapped = f"What does the {b} {verb} the {a} {adverbial}?"
    assert conflict(english_frame(first), english_frame(swapped)) == "role"
    assert verify(first, swapped) is not None
    moved = f"{adverbial.capitalize()}, what does the {a} {verb} the {b}?"
    assert conflict(english_frame(first), english_frame(moved)) is None
    assert conflict(_role_blind(english_frame(first)), _role_blind(english_frame(swapped))) is None


_en_formats = st.lists(st.sampled_from(_EN_FORMATS), min_size=2, max_size=2, unique=True)


@settings(max_examples=40, deadline=None)
@given(_en_formats, st.sampled_from(["convert", "turn", "export", "migrate"]), st.sampled_from(["to", "into"]))
def test_english_conversion_turned_around_is_a_near_miss(formats: list[str], verb: str, to: str) -> None:
    x, y = formats
    there = f"How do I {verb} {x} {to} {y}?"
    back = f"How do I {verb} {y} {to} {x}?"
    assert conflict(english_frame(there), english_frame(back)) == "direction"
    assert verify(there, back) is not None
    route = f"How do I {verb} from {x} {to} {y}?", f"How do I {verb} {to} {y} from {x}?"
    assert conflict(english_frame(route[0]), english_frame(route[1])) is None  # the same route, reordered


def test_opposites_derived_from_a_shared_stem_or_listed() -> None:
    for a, b in [("enable", "disable"), ("mute", "unmute"), ("activate", "deactivate"), ("활성화", "비활성화"),
                 ("공개", "비공개"), ("켜", "끄"), ("시작", "종료")]:
        assert opposite(a, b) and opposite(b, a)
    for a, b in [("start", "restart"), ("convert", "convert"), ("바꾸", "변환"), ("able", "table")]:
        assert not opposite(a, b)


def _ko_conflict(a: str, b: str) -> str | None:
    return conflict(korean_frame(a), korean_frame(b))


def _en_conflict(a: str, b: str) -> str | None:
    return conflict(english_frame(a), english_frame(b))


def test_an_action_replaced_on_the_same_arguments() -> None:
    assert _ko_conflict("컨테이너를 시작하는 명령어", "컨테이너를 멈추는 명령어") == "opposite"
    assert _ko_conflict("가상환경을 활성화하는 명령어", "가상환경을 비활성화하는 명령어") == "opposite"
    assert _en_conflict("How do I start a container?", "How do I halt a container?") == "opposite"
    assert _en_conflict("How do I mute a channel?", "How do I unmute a channel?") == "opposite"
    assert _en_conflict("How do I upgrade from Postgres 15?", "How do I downgrade from Postgres 15?") == "opposite"
    assert _ko_conflict("컨테이너를 시작하는 명령어", "컨테이너 시작할 때 쓰는 명령어가 뭐야?") is None
    assert _en_conflict("How do I start a container?", "Which command starts a container?") is None


def test_the_analyser_is_never_loaded_on_an_event_loop() -> None:
    """On a thread that runs a loop, an unloaded analyser gives no frame (the verifier refuses: "unread") and loads
    elsewhere; once loaded, frames come on the loop too."""
    saved = roles._ANALYSER
    roles._ANALYSER = roles._Analyser()
    roles._korean_frame.cache_clear()
    try:
        async def on_loop() -> tuple[Frame | None, str | None]:
            return frame("와이파이를 켜는 방법"), verify("와이파이를 켜는 방법", "와이파이 켜는 법 알려줘")
        found, verdict = asyncio.run(on_loop())
        assert found is None and verdict == "unread"
        roles.warm()
        found, verdict = asyncio.run(on_loop())
        assert found is not None and verdict is None
    finally:
        roles._ANALYSER = saved
        roles._korean_frame.cache_clear()


def _role_blind(found: Frame | None) -> Frame:
    assert found is not None
    return Frame(MappingProxyType(dict.fromkeys(found.roles, Role.OBJECT)), found.predicates)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["원", "엔", "위안", "달러", "유로", "파운드", "바트"]), min_size=2, max_size=2,
                unique=True))
def test_korean_units_read_as_bound_nouns_still_take_roles(units: list[str]) -> None:
    x, y = units
    there, back = f"{_ko(x, '를', '을')} {_ko_to(y)} 계산해줘", f"{_ko(y, '를', '을')} {_ko_to(x)} 계산해줘"
    assert _ko_conflict(there, back) == "direction"


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([("HTTP", "HTTPS"), ("FTP", "FTPS"), ("SMTP", "SMTPS"), ("WS", "WSS")]),
       st.sampled_from(["redirect", "switch", "move"]))
def test_english_arguments_that_differ_by_a_final_s_are_two_arguments(pair: tuple[str, str], verb: str) -> None:
    x, y = pair
    assert _en_conflict(f"How do I {verb} {x} to {y}?", f"How do I {verb} {y} to {x}?") == "direction"


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["check", "log", "sign", "opt", "turn", "switch", "scale"]),
       st.sampled_from([("in", "out"), ("on", "off"), ("up", "down")]),
       st.sampled_from(["for my flight", "of the app", "online", "now"]))
def test_english_phrasal_verbs_with_opposite_particles(verb: str, particles: tuple[str, str], rest: str) -> None:
    one, other = particles
    assert _en_conflict(f"How do I {verb} {one} {rest}?", f"How do I {verb} {other} {rest}?") == "opposite"
    assert _en_conflict(f"How do I {verb} {one} {rest}?", f"How can I {verb} {one} {rest}?") is None


_KO_MODIFIERS = ["새", "주", "큰", "작은", "긴", "짧은", "빠른", "느린", "넓은", "좁은", "높은", "낮은", "개인", "회사"]
_KO_HEADS = ["서버", "폴더", "계정", "모니터", "디스크", "요금제", "브랜치", "노트북", "저장소"]


def _read_as_written(text: str, head: str) -> bool:
    """Did the analyser read ``text`` as written: the head noun twice as one noun, and no verb but the question's
    own? It does not always: 새 디스크를 after a particle as 새다's 새어 (leaking), 요금제로 as 요금 + 제로 (zero),
    큰 저장소 as 큰 저 장소 (that place). Those misreadings are the analyser's, a gap this property leaves out."""
    tokens = roles._ANALYSER.get().tokenize(text)
    return sum(t.form == head for t in tokens) == 2 and all(
        t.form in ("옮기",) for t in tokens if t.tag.startswith("VV"))
_modifiers = st.lists(st.sampled_from(_KO_MODIFIERS), min_size=2, max_size=2, unique=True)


@settings(max_examples=40, deadline=None)
@given(_modifiers, st.sampled_from(_KO_HEADS), st.sampled_from(["파일", "데이터", "설정", "코드"]))
def test_korean_phrases_of_one_head_noun_turned_around_are_a_near_miss(modifiers: list[str], head: str,
                                                                       what: str) -> None:
    """The same noun in both places, told apart only by what modifies it (주 서버 / 복제 서버, 큰 회사 / 작은
    회사, a determiner or an adjective): the phrases trade places, so the question is another."""
    x, y = (f"{m} {head}" for m in modifiers)
    there = f"{x}에서 {_ko_to(y)} {_ko(what, '를', '을')} 옮기는 방법"
    back = f"{y}에서 {_ko_to(x)} {_ko(what, '를', '을')} 옮기는 방법"
    doer = f"{_ko(x, '가', '이')} {_ko(y, '를', '을')} 관리하는 방법"
    done = f"{_ko(y, '가', '이')} {_ko(x, '를', '을')} 관리하는 방법"
    assume(all(_read_as_written(text, head) for text in (there, back, doer, done)))
    assert conflict(korean_frame(there), korean_frame(back)) in ("role", "direction")
    assert verify(there, back) is not None
    moved = f"{_ko(what, '를', '을')} {x}에서 {_ko_to(y)} 옮기는 방법"
    assert conflict(korean_frame(there), korean_frame(moved)) is None, "the same phrases in the same roles"
    assert conflict(korean_frame(doer), korean_frame(done)) in ("role", "direction")
    assert conflict(_role_blind(korean_frame(there)), _role_blind(korean_frame(back))) is None


_EN_MODIFIERS = ["old", "new", "annual", "monthly", "primary", "backup", "free", "premium", "left", "right"]
_EN_HEADS = ["plan", "server", "drive", "account", "branch", "tier", "monitor", "database"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(_EN_MODIFIERS), min_size=2, max_size=2, unique=True), st.sampled_from(_EN_HEADS),
       st.sampled_from(["move", "switch", "migrate", "copy"]))
def test_english_phrases_of_one_head_noun_turned_around_are_a_near_miss(modifiers: list[str], head: str,
                                                                        verb: str) -> None:
    """"from the annual plan to the monthly plan" and back: "to" before a determiner is a goal, never an
    infinitive, even after a noun that can take one ("plan to")."""
    x, y = (f"the {m} {head}" for m in modifiers)
    there, back = f"How to {verb} from {x} to {y}", f"How to {verb} from {y} to {x}"
    assert conflict(english_frame(there), english_frame(back)) == "direction"
    assert verify(there, back) is not None
    assert conflict(english_frame(there), english_frame(f"How do I {verb} to {y} from {x}?")) is None
    assert conflict(_role_blind(english_frame(there)), _role_blind(english_frame(back))) is None
