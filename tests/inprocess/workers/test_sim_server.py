"""The simulated worker's answers over its HTTP API, in-process: exact token counts whole and streamed (English,
Korean, both), the same request the same bytes, and answers that speak of what was asked."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import orjson

from workers.sim import canonical, tokenizer
from workers.sim.engine import EngineConfig
from workers.sim.server import SimServer

ZERO = EngineConfig(decode_base_s=0.0, decode_per_seq_s=0.0, prefill_per_token_s=0.0, mean_output_tokens=0)
QUESTIONS = ("How do I reset my home router password?", "서울에서 부산까지 기차로 얼마나 걸려요?",
             "아이폰 15 Pro Max 가격이 얼마예요?", "Explain internationalization in Kubernetes, 쿠버네티스 국제화")

# (question, paraphrase): some in other function words only, some in other content words too
PAIRS = (
    ("What is the capital city of France?", "Which city is the capital of France?"),
    ("How do I reset my home router password?", "What's the way to reset the password on my router at home?"),
    ("Recommend a good book about Roman history", "Which book on the history of Rome would you recommend?"),
    ("How long should I boil an egg for a soft yolk?", "For a soft yolk, how many minutes do I boil eggs?"),
    ("Why is the sky blue during the day?", "What makes the daytime sky look blue?"),
    ("서울에서 부산까지 기차로 얼마나 걸려요?", "기차로 서울에서 부산 가는 데 시간이 얼마나 걸리나요?"),
    ("How do I convert Celsius to Fahrenheit?", "What is the formula to convert Celsius into Fahrenheit?"),
)


def ask(requests: list[dict[str, Any]]) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        server = SimServer(ZERO, "m")
        server.engine.start()
        transport = httpx.ASGITransport(app=server.app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            answers = [await client.post(r.pop("path", "/v1/chat/completions"), json={"model": "m", **r})
                       for r in requests]
        await server.engine.stop()
        return answers
    return asyncio.run(main())


def chat(question: str, max_tokens: int = 48, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, **kw}


def streamed(response: httpx.Response) -> tuple[str, dict[str, Any]]:
    chunks = [orjson.loads(line[6:]) for line in response.text.split("\n\n")
              if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, chunks[-1]["usage"]


def jaccard(a: str, b: str) -> float:
    x, y = set(a.casefold().split()), set(b.casefold().split())
    return len(x & y) / len(x | y)


def test_counts_are_exact_whole_and_streamed_and_a_stream_is_the_same_bytes() -> None:
    requests = [chat(q) for q in QUESTIONS]
    requests += [chat(q, stream=True, stream_options={"include_usage": True}) for q in QUESTIONS]
    requests += [{"path": "/v1/completions", "prompt": q, "max_tokens": 30} for q in QUESTIONS]
    answers = ask(requests)
    n = len(QUESTIONS)
    for question, whole, stream, completion in zip(QUESTIONS, answers[:n], answers[n:2 * n], answers[2 * n:],
                                                  strict=True):
        text = whole.json()["choices"][0]["message"]["content"]
        assert whole.json()["usage"]["completion_tokens"] == tokenizer.count_text(text) == 48, question
        stream_text, usage = streamed(stream)
        assert stream_text == text and usage["completion_tokens"] == 48, question
        body = completion.json()
        assert body["usage"]["completion_tokens"] == tokenizer.count_text(body["choices"][0]["text"]) == 30
        words = set(canonical.understand(question).words)
        assert words & set(tokenizer.pieces(text)), "the answer uses the question's words"


def test_the_same_request_gets_the_same_bytes_another_seed_another_and_temperature_changes_nothing() -> None:
    question = QUESTIONS[1]
    first, again, seeded, cold = ask([chat(question), chat(question), chat(question, seed=7),
                                      chat(question, temperature=0.0)])
    text = first.json()["choices"][0]["message"]["content"]
    assert again.json()["choices"][0]["message"]["content"] == text
    assert seeded.json()["choices"][0]["message"]["content"] != text
    assert cold.json()["choices"][0]["message"]["content"] == text, "the simulator samples alike at any temperature"


def test_answers_to_paraphrases_share_words_and_to_unrelated_questions_few() -> None:
    questions = [q for pair in PAIRS for q in pair]
    texts = dict(zip(questions, (r.json()["choices"][0]["message"]["content"] for r in ask([chat(q) for q in
                                                                                          questions])), strict=True))
    paraphrase = [jaccard(texts[a], texts[b]) for a, b in PAIRS]
    unrelated = [jaccard(texts[a], texts[b]) for (a, _), (b, _) in itertools.permutations(PAIRS, 2)]
    mean_paraphrase, mean_unrelated = sum(paraphrase) / len(paraphrase), sum(unrelated) / len(unrelated)
    assert mean_paraphrase > 2 * mean_unrelated, (paraphrase, mean_unrelated)
    assert max(paraphrase) == 1.0, "a question asked in other function words only gets the same answer"
    for a, b in PAIRS:  # what the two answers share includes most words the two questions share (a third of 48
        asked = set(canonical.understand(a).words) & set(canonical.understand(b).words)  # tokens are theirs)
        shared = set(tokenizer.pieces(texts[a])) & set(tokenizer.pieces(texts[b]))
        assert asked and len(asked & shared) * 2 >= len(asked), a
