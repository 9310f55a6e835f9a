"""The field checks every API's validation is made of, and the echo of a client's value."""

from __future__ import annotations

import pytest

from gateway.endpoints.checks import echo, integer, model_of, number, parts
from gateway.errors import InvalidRequest


def test_echo_cuts_client_values_short() -> None:
    assert echo("short") == "short" and echo(7) == "7"
    assert len(echo("x" * 100_000)) < 80


def test_numbers_and_integers_are_bounded_and_a_boolean_is_neither() -> None:
    number({"t": 1.5}, "t", 0, 2)
    integer({"n": 3}, "n", 1, 3)
    integer({}, "n", 1)
    for body, check in (({"t": 2.5}, lambda b: number(b, "t", 0, 2)), ({"t": True}, lambda b: number(b, "t", 0, 2)),
                        ({"n": 1.0}, lambda b: integer(b, "n", 1)), ({"n": False}, lambda b: integer(b, "n", 0)),
                        ({"n": 4}, lambda b: integer(b, "n", 1, 3))):
        with pytest.raises(InvalidRequest) as caught:
            check(body)
        assert caught.value.param in body


def test_a_model_is_a_non_empty_string() -> None:
    assert model_of({"model": "m"}) == "m"
    for body in ({}, {"model": ""}, {"model": 3}):
        with pytest.raises(InvalidRequest) as caught:
            model_of(body)
        assert caught.value.code == "missing_model"


def test_a_content_part_has_a_string_type_and_its_text_is_a_string() -> None:
    parts([{"type": "text", "text": "a"}, {"type": "image_url"}], "p")
    with pytest.raises(InvalidRequest) as caught:
        parts([{"type": "text", "text": "a"}, {"type": 1}], "p")
    assert caught.value.param == "p[1]"
    with pytest.raises(InvalidRequest) as caught:
        parts([{"type": "text", "text": ["a"]}], "p")
    assert caught.value.param == "p[0].text"
