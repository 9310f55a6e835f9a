"""The embeddings API's object: its input shapes and limits, its exact-only cache question, and a cached answer
replayed and read back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.endpoints import EMBEDDINGS
from gateway.endpoints.embeddings import MAX_EMBEDDING_INPUTS, embedding_inputs
from gateway.errors import InvalidRequest
from gateway.policy.schema import CachePolicy


@pytest.mark.parametrize("value,count", [
    ("text", 1), (["a", "b", "c"], 3), ([1, 2, 3], 1), ([[1, 2], [3]], 2),
    ("", 0), ([], 0), (["a", ""], 0), ([[1], []], 0), ([True, 2], 0), (["a", 1], 0), ({"a": 1}, 0), (None, 0),
])
def test_inputs_are_counted_by_shape_and_each_is_a_sequence(value: object, count: int) -> None:
    assert embedding_inputs({"input": value}) == count
    assert EMBEDDINGS.sequences({"input": value}) == count


@pytest.mark.parametrize("body,param", [
    ({"input": "x"}, "model"),
    ({"model": "e", "input": ["x", 1]}, "input"),
    ({"model": "e", "input": ""}, "input"),
    ({"model": "e", "input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}, "input"),
    ({"model": "e", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "e", "input": "x", "dimensions": 0}, "dimensions"),
    ({"model": "e", "input": "x", "stream": True}, "stream"),
])
def test_a_refusal_names_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        EMBEDDINGS.validate(body)
    assert caught.value.param == param
    assert EMBEDDINGS.validate({"model": "e", "input": ["x"] * MAX_EMBEDDING_INPUTS}) == "e", "the limit itself"


def test_it_serves_embed_models_and_generates_nothing() -> None:
    assert EMBEDDINGS.model_kind == "embed"
    assert EMBEDDINGS.output_field({"model": "e", "input": "x", "max_tokens": 5}) is None


def test_the_question_is_the_input_and_its_parameters_matched_exactly() -> None:
    body = {"model": "e", "input": ["a b"], "dimensions": 8, "user": "ignored"}
    question = EMBEDDINGS.question(body, CachePolicy(enabled=True))
    assert not isinstance(question, str)
    assert question.exact == ["a b"] and question.params == {"dimensions": 8}
    assert question.text == "" and question.system is None, "nothing to compare by meaning"


def test_a_replayed_answer_reads_back_as_the_same_vectors() -> None:
    worker = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -1.0]}],
              "model": "e", "usage": {"prompt_tokens": 3, "total_tokens": 3}}
    read = EMBEDDINGS.answer_from_json(orjson.dumps(worker))
    assert read is not None
    text, finish, usage = read
    assert finish == "stop" and usage == worker["usage"]
    replayed = orjson.loads(EMBEDDINGS.replay_json(text, finish, "e", {"prompt_tokens": 3, "cached": True}))
    assert replayed["data"] == worker["data"] and replayed["model"] == "e" and replayed["usage"]["cached"]
    assert EMBEDDINGS.answer_from_json(orjson.dumps({"data": [], "usage": {}})) is None
    assert EMBEDDINGS.answer_from_sse(b"data: {}\n\n") is None, "never streamed"
