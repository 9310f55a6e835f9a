"""The simulator's answers speak of what was asked: every token one piece of its own tokenizer (counts stay
exact), a third of them the question's own words, and a question asked in other function words answered alike."""

from __future__ import annotations

from workers.sim import tokenizer


def answer(question: str, seed: int = 0, n: int = 60) -> str:
    words = tokenizer.topic(question)
    rng = tokenizer.output_rng(seed, tokenizer.meaning(f"user: {question}", question, words))
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
    assert text.count(" reset") + text.count(" router") >= 8, "about a third of 60 tokens"


def test_other_function_words_get_the_same_answer_other_content_words_another() -> None:
    assert answer("How do I reset my router?") == answer("How can I reset my router?")
    assert answer("How do I reset my router?") != answer("How do I reset my printer?")
    assert answer("서울 날씨 어때요?") != answer("부산 날씨 어때요?")
    assert tokenizer.meaning("system: be terse\nuser: hi there", "hi there", ()) == "system: be terse\nuser: hi there"
