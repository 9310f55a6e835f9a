"""The field checks every API's validation is made of, and the echo of a client's value in an error.

Hand-written over plain dicts rather than pydantic models: a body is checked once per request on the hot path,
and it is forwarded to vLLM with unknown fields intact (``top_k``, ``min_p``, ``ignore_eos`` ... are vLLM's to
accept).
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest

ECHO_LIMIT = 64  # characters of a client-chosen value echoed back in an error


def echo(value: object) -> str:
    """A client-chosen value, cut short for an error message or a log line."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= ECHO_LIMIT else text[:ECHO_LIMIT] + "..."


def bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, "invalid_value", param=param)


def model_of(body: dict[str, Any]) -> str:
    """The model a body names (every API requires one)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", "missing_model", param="model")
    return model


def number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise bad(name, f"'{name}' must be a number between {low:g} and {high:g}, got {value!r}.")


def integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"between {low} and {high}"
        raise bad(name, f"'{name}' must be an integer {limit}, got {value!r}.")


def parts(items: list[Any], param: str) -> None:
    """Content parts are objects with a string ``type``, and a text part's ``text`` is a string: the prefix
    index, the cache key and the prompt estimate read them, and the worker would refuse anything else."""
    for j, part in enumerate(items):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad(f"{param}[{j}]", f"{param}[{j}] must be an object with a string 'type'.")
        if "text" in part and not isinstance(part["text"], str):
            raise bad(f"{param}[{j}].text", f"{param}[{j}].text must be a string.")
