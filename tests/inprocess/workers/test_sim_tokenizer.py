"""The simulator's answers speak of what was asked: every token one piece of its own tokenizer (counts stay
exact), a third of them the question's own words, and a question asked in other function words answered alike."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.sim import canonical, tokenizer


def answer(question: str, seed: int = 0, n: int = 60) -> str:
    understood = canonical.understand(question)
    words = understood.words
    rng = tokenizer.output_rng(seed, tokenizer.meaning(f"user: {question}", question, understood.form))
    return "".join(tokenizer.next_piece(rng, words) for _ in range(n))


def test_every_token_is_one_piece_so_counts_stay_exact_in_english_korean_and_both() -> None:
    for question in ("How do I reset my router number 12345?", "비트코인을 사는 방법을 알려주세요",
                     "아이폰 15 Pro Max 가격이 얼마예요?", "Explain internationalization in Kubernetes"):
        assert tokenizer.count_text(answer(question)) == 60, question


def test_the_same_question_gets_the_same_answer_and_another_seed_another() -> None:
    assert answer("How do I reset my router?") == answer("How do I reset my router?")
    assert answer("How do I reset my router?", seed=1) != answer("How do I reset my router?")


def test_the_answer_uses_the_questions_words() -> None:
    text = answer("How do I reset my router?")
    assert canonical.understand("How do I reset my router?").words == (" reset", " rout"), "their stems"
    assert sum(text.count(word) for word in (" reset", " rout")) >= 8, "about a third of 60 tokens"


def test_other_function_words_get_the_same_answer_other_content_words_another() -> None:
    assert answer("How do I reset my router?") == answer("How can I reset my router?")
    assert answer("How do I reset my router?") != answer("How do I reset my printer?")
    assert answer("서울 날씨 어때요?") != answer("부산 날씨 어때요?")
    assert tokenizer.meaning("system: be terse\nuser: hi there", "hi there", "") == "system: be terse\nuser: hi there"


TEXT = st.lists(st.sampled_from([*"ab \n\t{}\":,_-é한1", " " * 17, "abcdefghijkl"]), max_size=60).map("".join)


@settings(max_examples=500, deadline=None)
@given(text=TEXT, cuts=st.lists(st.integers(0, 200), max_size=12))
def test_pieces_made_as_fragments_come_are_the_texts_pieces(text: str, cuts: list[int]) -> None:
    """However a text is cut into fragments, the pieces made as they come are its pieces; they make the text
    again, and none is longer than 26 characters (whitespace runs longer than 16 are tokens of their own)."""
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    fragments = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert list(tokenizer.stream_pieces(fragments)) == tokenizer.pieces(text)
    assert "".join(tokenizer.pieces(text)) == text
    assert all(len(piece) <= 26 for piece in tokenizer.pieces(text))


def test_a_long_run_of_whitespace_is_tokens_not_one_token() -> None:
    assert tokenizer.pieces(" " * 40 + "word") == [" " * 16, " " * 16, " " * 8 + "word"]
    assert tokenizer.count_text(" " * 10**6) == 62_500, "a megabyte of spaces cannot pass for one token"
