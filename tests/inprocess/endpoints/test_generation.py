"""What chat and completions share: the sampling checks, and the bypasses and parameters of their cache
question."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.endpoints import CHAT, COMPLETIONS
from gateway.endpoints.generation import Generation, validate_sampling
from gateway.errors import InvalidRequest
from gateway.policy.schema import CachePolicy

SPEC = CachePolicy(enabled=True)


def chat(**extra: Any) -> dict[str, Any]:
    """A cacheable chat body (greedy) with ``extra``; temperature=None leaves the temperature out."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, **extra}
    return {k: v for k, v in body.items() if v is not None}


@pytest.mark.parametrize("extra,param", [
    ({"stream": "yes"}, "stream"), ({"stream": True, "stream_options": []}, "stream_options"),
    ({"temperature": 2.5}, "temperature"), ({"n": 129}, "n"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 1.5}, "max_completion_tokens"), ({"stop": ["a", 1]}, "stop"),
    ({"presence_penalty": -3}, "presence_penalty"),
])
def test_the_shared_sampling_checks_name_the_parameter(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate_sampling({"model": "m", **extra})
    assert caught.value.param == param
    assert validate_sampling({"model": "m", "temperature": 0, "stop": ["a"], "seed": -1}) == "m"


@pytest.mark.parametrize("extra,reason", [
    ({"n": 2}, "n_gt_1"), ({"logprobs": True}, "logprobs"), ({"echo": True}, "logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"functions": [{"name": "f"}]}, "tools"),
])
def test_what_makes_an_answer_one_of_many_is_a_bypass(extra: dict[str, Any], reason: str) -> None:
    assert CHAT.question(chat(**extra), SPEC) == reason
    assert COMPLETIONS.question({"model": "m", "prompt": "hi", "temperature": 0, **extra}, SPEC) == reason


def test_the_parameters_that_change_an_answer_are_in_the_question_and_the_temperature_beside_them() -> None:
    """The temperature is not a parameter of the question: whether it keeps a request from the cache, and
    whether it joins the scope, is the tenant's cacheability (tests/inprocess/cache/test_cacheability.py)."""
    def question(**extra: Any) -> Any:
        asked = CHAT.question(chat(**extra), CachePolicy(enabled=True, tools=True))
        assert not isinstance(asked, str)
        return asked

    assert question(temperature=0).params == {} and question(temperature=1.5).temperature == 1.5
    assert question(seed=4, user="u").params["seed"] == 4 and "user" not in question(user="u").params
    assert question(tools=[{"type": "function"}]).params["tools"] == [{"type": "function"}]


def test_a_request_without_temperature_samples_at_the_engines_default() -> None:
    """OpenAI's and vLLM's default temperature is 1.0 (``cache.default_temperature``)."""
    unsent = CHAT.question(chat(temperature=None), SPEC)
    completion = COMPLETIONS.question({"model": "m", "prompt": "hi"}, SPEC)
    assert not isinstance(unsent, str) and not isinstance(completion, str)
    assert unsent.temperature == completion.temperature == 1.0
    greedy = CHAT.question(chat(temperature=None), CachePolicy(enabled=True, default_temperature=0))
    assert not isinstance(greedy, str) and greedy.temperature == 0.0


def test_a_generation_api_that_leaves_out_a_hook_cannot_be_built() -> None:
    """Each kind says how its body asks and where its choices hold text: one that forgets a hook fails when it is
    built (at import), not at its first cached request."""
    class Partial(Generation):
        __slots__ = ()

        def asked(self, body: dict[str, Any], spec: CachePolicy) -> str:
            return "empty"

    with pytest.raises(TypeError, match="abstract"):
        Partial("partial", "/v1/partial")
