"""The completions API's object: its prompt shapes, the sequences a body asks for, the question the cache keys
on, and a cached answer replayed and read back."""

from __future__ import annotations

import orjson
import pytest

from gateway.endpoints.completions import COMPLETIONS
from gateway.errors import InvalidRequest
from gateway.policy.schema import CachePolicy

SPEC = CachePolicy(enabled=True)
USAGE = {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


@pytest.mark.parametrize("prompt", ["", [], [{"a": 1}], None, 5])
def test_a_prompt_of_no_known_shape_is_refused(prompt: object) -> None:
    with pytest.raises(InvalidRequest) as caught:
        COMPLETIONS.validate({"model": "m", "prompt": prompt})
    assert caught.value.param == "prompt"


def test_each_prompt_of_a_list_is_a_sequence_and_token_ids_are_one_prompt() -> None:
    assert COMPLETIONS.validate({"model": "m", "prompt": [1, 2, 3]}) == "m"
    assert COMPLETIONS.sequences({"prompt": [1, 2, 3]}) == 1
    assert COMPLETIONS.sequences({"prompt": ["a", "b"], "n": 2, "best_of": 3}) == 6
    assert COMPLETIONS.sequences({"prompt": [[1], [2], [3]]}) == 3


def test_only_a_text_prompt_is_a_question() -> None:
    question = COMPLETIONS.question({"model": "m", "prompt": "Say  hi", "temperature": 0}, SPEC)
    assert not isinstance(question, str)
    assert question.text == "Say hi" and question.system == [] and question.exact == [("prompt", "Say hi")]
    assert COMPLETIONS.question({"model": "m", "prompt": ["a", "b"], "temperature": 0}, SPEC) == "prompt_not_text"
    assert COMPLETIONS.question({"model": "m", "prompt": "x", "logprobs": 1}, SPEC) == "logprobs"


def test_a_replayed_answer_reads_back_as_the_same_answer() -> None:
    body = COMPLETIONS.replay_json(" hi\nthere", "stop", "m", USAGE)
    data = orjson.loads(body)
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert COMPLETIONS.answer_from_json(body) == (" hi\nthere", "stop", USAGE)
    stream = COMPLETIONS.replay_sse(" hi\nthere", "length", "m", USAGE)
    assert COMPLETIONS.answer_from_sse(stream) == (" hi\nthere", "length", USAGE)
    two = orjson.dumps({"choices": [{"text": "a"}, {"text": "b"}], "usage": USAGE})
    assert COMPLETIONS.answer_from_json(two) is None, "one choice or none kept"
