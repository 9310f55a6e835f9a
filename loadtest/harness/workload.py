"""Request bodies for a spec: prompt lengths, max_tokens, and exact or paraphrased repeats, all seeded."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import orjson

from loadtest.harness.spec import RequestClass, Spec
from workers.sim.tokenizer import WORDS

# Rewrites that keep a question's meaning (the semantic cache should still hit) but change its text.
_PARAPHRASE_PREFIXES = ("", "Please ", "Could you tell me: ", "Quick question: ", "I wonder, ")
_PARAPHRASE_SWAPS = {"good": "fine", "great": "excellent", "work": "job", "people": "folks", "make": "create",
                     "get": "obtain", "see": "look at", "know": "understand", "little": "small", "long": "lengthy"}


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    cls: RequestClass
    path: str
    body: bytes
    kind: str  # fresh | exact | paraphrase


class Workload:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.words_rng = self.rng if spec.words_seed is None else random.Random(spec.words_seed)
        self.words = _corpus_words(spec.corpus)
        self._weights = [c.weight for c in spec.classes]
        self._history: dict[str, list[str]] = {c.name: [] for c in spec.classes}

    def next(self) -> PreparedRequest:
        cls = self.rng.choices(self.spec.classes, self._weights)[0]
        history = self._history[cls.name]
        roll = self.rng.random()
        if history and roll < cls.repeat_exact:
            prompt, kind = self.rng.choice(history), "exact"
        elif history and roll < cls.repeat_exact + cls.repeat_paraphrase:
            prompt, kind = paraphrase(self.rng.choice(history), self.rng), "paraphrase"
        else:
            n = cls.prompt_tokens.sample(self.rng)
            prompt, kind = " ".join(self.words_rng.choice(self.words) for _ in range(n)), "fresh"
            history.append(prompt)
            if len(history) > 1000:
                del history[: len(history) - 1000]
        body: dict[str, object] = {"model": cls.model, "max_tokens": cls.max_tokens.sample(self.rng)}
        if cls.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = prompt
            path = "/v1/completions"
        if cls.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if cls.ignore_eos:
            body["ignore_eos"] = True
        return PreparedRequest(cls, path, orjson.dumps(body), kind)


def paraphrase(text: str, rng: random.Random) -> str:
    words = [_PARAPHRASE_SWAPS.get(w, w) if rng.random() < 0.5 else w for w in text.split()]
    return rng.choice(_PARAPHRASE_PREFIXES) + " ".join(words)


def _corpus_words(corpus: str | None) -> list[str]:
    if corpus is None:
        return list(WORDS)
    words = Path(corpus).read_text(errors="replace").split()
    if not words:
        raise ValueError(f"corpus {corpus} has no words")
    return words
