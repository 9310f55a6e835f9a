"""The Responses API's object and where its answers live: what it refuses, its stream tap, the homes kept by
tenant, and the previous_response_id lookup."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.endpoints import RESPONSES
from gateway.endpoints.responses import Home, ResponseHomes
from gateway.errors import InvalidRequest, NotFound
from gateway.policy.schema import CachePolicy
from gateway.upstream.relay import Relayed


@pytest.mark.parametrize("body,param", [
    ({"input": "x"}, "model"),
    ({"model": "m", "input": ""}, "input"),
    ({"model": "m", "input": ["text"]}, "input"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
     "input[0].content[0].text"),
    ({"model": "m", "input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "x", "previous_response_id": 7}, "previous_response_id"),
    ({"model": "m", "input": "x", "store": "yes"}, "store"),
    ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "input": "x", "background": True}, "background"),
])
def test_a_refusal_names_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        RESPONSES.validate(body)
    assert caught.value.param == param


def test_its_output_bound_and_usage_are_its_own_and_its_answers_are_not_cached() -> None:
    body = {"model": "m", "input": "x", "stream": True}
    assert RESPONSES.output_field(body) == "max_output_tokens"
    assert RESPONSES.ask_usage(body, True) == (True, True) and "stream_options" not in body
    assert RESPONSES.question(body, CachePolicy(enabled=True)) == "endpoint"
    assert RESPONSES.homed


def test_the_tap_passes_events_unchanged_counts_deltas_and_reads_the_final_usage() -> None:
    relayed = Relayed()
    tap = RESPONSES.tap(relayed, False, False)
    created = b'data: {"type":"response.created","response":{"id":"resp_1","usage":null}}\n\n'
    delta = b'data: {"type":"response.output_text.delta","delta":"a"}\n\n'
    done = (b'data: {"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":4,'
            b'"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"total_tokens":6}}}\n\n')
    assert tap(created) == created and relayed.usage is None
    assert tap(delta + delta) == delta + delta and relayed.events == 2, "a cut stream is estimated from these"
    assert tap(done) == done
    assert relayed.usage == {"input_tokens": 4, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2,
                             "total_tokens": 6}


def test_a_home_is_found_only_by_the_tenant_that_made_it_and_the_oldest_goes_first() -> None:
    homes = ResponseHomes(size=2)
    assert homes.remember(b'{"id":"resp_a","object":"response"}', Home("acme", "p", "http://w1", 30)) == "resp_a"
    assert homes.find("resp_a", "acme") == Home("acme", "p", "http://w1", 30)
    assert homes.find("resp_a", "globex") is None
    assert homes.remember(b'{"object":"list"}', Home("acme", "p", "http://w1")) is None, "names no response"
    homes.remember(b'{"id":"resp_b"}', Home("acme", "p", "http://w2"))
    homes.remember(b'{"id":"resp_a"}', Home("acme", "p", "http://w1"))  # remembered again: the newest now
    homes.remember(b'{"id":"resp_c"}', Home("acme", "p", "http://w3"))
    assert homes.find("resp_b", "acme") is None and homes.find("resp_a", "acme") is not None


def test_a_follow_up_goes_home_and_an_unknown_previous_response_is_a_404() -> None:
    homes = ResponseHomes()
    homes.remember(b'{"id":"resp_a"}', Home("acme", "p", "http://w1", 12))
    assert homes.of_previous({"input": "x"}, "acme") is None, "it continues nothing"
    assert homes.of_previous({"previous_response_id": "resp_a"}, "acme") == Home("acme", "p", "http://w1", 12)
    for tenant, rid in (("globex", "resp_a"), ("acme", "resp_" + "z" * 500)):
        with pytest.raises(NotFound) as caught:
            homes.of_previous({"previous_response_id": rid}, tenant)
        assert caught.value.param == "previous_response_id" and len(str(caught.value)) < 300
