"""The simulator answers what a question means: wordings of one question share an answer, questions that differ
in who does what to what do not. Each property has a positive control: a simulator that answers the question's
text fails the first, one that answers its bag of words fails the second."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.sim import canonical

THINGS = ("photos", "invoices", "contacts", "backups", "playlists", "spreadsheets")
PLACES = ("laptop", "phone", "server", "tablet", "printer", "camera")
ACTIONS = (("enable", "disable"), ("upload", "download"), ("encrypt", "decrypt"), ("install", "uninstall"),
           ("lock", "unlock"), ("import", "export"))
FRAMES = ("How do I {v} {o}?", "How can I {v} {o}?", "how do i {v} the {o}", "What's the way to {v} my {o}?",
          "Please tell me how to {v} {o}.", "HOW DO I {V} {O}?")
KO_NOUNS = ("비트코인", "블루투스", "와이파이", "스크린샷", "포스트그레스", "노트북", "회의")
KO_VERBS = (("켜는", "끄는"), ("사는", "파는"), ("찍는", "지우는"))
KO_FRAMES = ("{o}{p} {v} 방법을 알려주세요", "{o} {v} 법 알려줘", "{o}{p} {v} 방법이 뭐예요?",
             "{o} {v} 방법 알려 주세요")

Form = Callable[[str], str]


def object_particle(noun: str) -> str:
    """을 after a final consonant, 를 after a vowel."""
    return "을" if (ord(noun[-1]) - 0xAC00) % 28 else "를"


def text_form(question: str) -> str:
    return question


def bag_form(question: str) -> str:
    return " ".join(sorted(set(question.lower().replace("?", "").split())))


def wording_kept(form: Form, frames: tuple[str, ...], verb: str, thing: str, i: int, j: int) -> bool:
    p = object_particle(thing) if not thing.isascii() else ""
    a = frames[i].format(v=verb, o=thing, p=p, V=verb.upper(), O=thing.upper())
    b = frames[j].format(v=verb, o=thing, p=p, V=verb.upper(), O=thing.upper())
    return form(a) == form(b)


@settings(max_examples=200, deadline=None)
@given(pair=st.sampled_from(ACTIONS), thing=st.sampled_from(THINGS), i=st.integers(0, len(FRAMES) - 1),
       j=st.integers(0, len(FRAMES) - 1), ko=st.booleans())
def test_wordings_of_one_question_share_its_form(pair: tuple[str, str], thing: str, i: int, j: int,
                                                 ko: bool) -> None:
    if ko:
        verbs, noun = KO_VERBS[i % len(KO_VERBS)], KO_NOUNS[j % len(KO_NOUNS)]
        assert wording_kept(canonical.canonical, KO_FRAMES, verbs[0], noun, i % 4, j % 4)
    else:
        assert wording_kept(canonical.canonical, FRAMES, pair[0], thing, i, j)


def test_a_simulator_answering_the_text_fails_the_wording_property() -> None:
    assert not wording_kept(text_form, FRAMES, "enable", "photos", 0, 1)


def swapped(form: Form, a: str, b: str, thing: str, verb: str, ko: bool) -> bool:
    """True if the form tells the two directions (and the two opposite actions) apart."""
    if ko:
        there, back = f"{a}에서 {b}로 {thing} 옮기는 법", f"{b}에서 {a}로 {thing} 옮기는 법"
    else:
        there, back = f"How do I copy {thing} from my {a} to my {b}?", f"How do I copy {thing} from my {b} to my {a}?"
    return form(there) != form(back)


@settings(max_examples=200, deadline=None)
@given(places=st.lists(st.sampled_from((*PLACES, "서버", "노트북", "휴대폰")), min_size=2, max_size=2, unique=True),
       thing=st.sampled_from(THINGS), pair=st.sampled_from(ACTIONS), ko=st.booleans())
def test_swapped_roles_and_opposite_actions_change_the_form(places: list[str], thing: str, pair: tuple[str, str],
                                                            ko: bool) -> None:
    assert swapped(canonical.canonical, places[0], places[1], thing, pair[0], ko)
    assert canonical.canonical(f"How do I {pair[0]} {thing}?") != canonical.canonical(f"How do I {pair[1]} {thing}?")
    a, b = KO_NOUNS[len(thing) % len(KO_NOUNS)], KO_VERBS[len(thing) % len(KO_VERBS)]
    assert canonical.canonical(f"{a} {b[0]} 법") != canonical.canonical(f"{a} {b[1]} 법")
    assert canonical.canonical("집주인이 세입자에게 내는 돈") != canonical.canonical("세입자가 집주인에게 내는 돈")


def test_a_simulator_answering_the_bag_of_words_fails_the_roles_property() -> None:
    assert not swapped(bag_form, "laptop", "phone", "photos", "copy", False)


def test_the_words_an_answer_uses_are_one_token_each_and_shared_by_the_wordings() -> None:
    a, b = canonical.understand("How do I reset my router?"), canonical.understand("How can I reset the router")
    assert a == b and a.words
    long = canonical.understand("word " * 1000)
    assert long.form == "", "a load test's prompt is answered by its text"
