"""Plausible log-probabilities for the simulator's tokens, in vLLM's two shapes (chat: one entry per token with its
``top_logprobs`` list, the sampled token first; completions: parallel lists with a dict of the top ``k`` + 1).

Made as the answer is written out, never in the engine loop, and only when asked for: the sampled token's value
is near 0 (mostly between -2 and 0, as a model's at a usual temperature), each alternative below the one before.
The same request gets the same values (the generator is seeded by the answer's own seed)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

from workers.sim.tokenizer import WORDS


class Logprobs:
    """The values of one choice's tokens, in the order they are written."""

    def __init__(self, seed: int, top: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.top = top

    def fresh(self) -> Logprobs:
        """The same values again from the first token (a whole answer written in passes, a list at a time)."""
        return Logprobs(self.seed, self.top)

    def _step(self, token: str, wanted: int) -> tuple[float, list[tuple[str, float]]]:
        rng = self.rng
        value = max(-9999.0, -rng.expovariate(1.5))
        alternatives: list[tuple[str, float]] = []
        below = value
        for index in rng.sample(range(len(WORDS)), min(wanted + 1, len(WORDS))):
            word = " " + WORDS[index]
            if word == token or len(alternatives) == wanted:
                continue
            below -= 0.1 + rng.expovariate(1.0)
            alternatives.append((word, round(below, 6)))
        return round(value, 6), alternatives

    def chat(self, token: str) -> dict[str, Any]:
        """One entry of ``choices[i].logprobs.content``."""
        value, alternatives = self._step(token, max(0, self.top - 1))
        top = [(token, value), *alternatives][: self.top]
        return {"token": token, "logprob": value, "bytes": list(token.encode()),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top]}

    def completion(self, tokens: list[str], offset: int, first_unscored: bool = False) -> dict[str, Any]:
        """A completion choice's ``logprobs`` for ``tokens`` starting at ``offset`` in its text (an echoed prompt's
        first token has no value: nothing came before it)."""
        offsets, values, tops = [], [], []
        for i, (value, top) in enumerate(self.steps(tokens, first_unscored)):
            offsets.append(offset)
            offset += len(tokens[i])
            values.append(value)
            tops.append(top)
        return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops}

    def steps(self, tokens: Iterable[str], first_unscored: bool = False) -> Iterator[tuple[float | None,
                                                                                        dict[str, float] | None]]:
        """Each token's value and its completion ``top_logprobs`` entry (the token and ``top`` alternatives), in
        order, made as they are read."""
        for i, token in enumerate(tokens):
            if first_unscored and i == 0:
                yield None, None
                continue
            value, alternatives = self._step(token, self.top)
            yield value, dict([(token, value), *alternatives])
