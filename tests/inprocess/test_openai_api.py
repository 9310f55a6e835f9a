"""Request validation and the max_tokens policy, in-process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, Endpoint
from gateway.endpoints.checks import echo
from gateway.endpoints.embeddings import MAX_EMBEDDING_INPUTS, embedding_inputs
from gateway.errors import InvalidRequest
from gateway.openai_api import apply_max_tokens, parse_json
from gateway.policy.loader import TenantView


def tenant(default: int = 512, cap: int = 1024, on_exceed: str = "clamp") -> TenantView:
    return TenantView("t", "standard", None, default, cap, on_exceed)


def applied(body: dict[str, Any], tenant: TenantView, endpoint: Endpoint = CHAT) -> str:
    """The max_tokens policy on the field that bounds the endpoint's output."""
    field = endpoint.output_field(body)
    assert field is not None
    return apply_max_tokens(body, tenant, field)


def test_default_is_applied_when_the_client_says_nothing() -> None:
    body: dict[str, Any] = {}
    assert applied(body, tenant()) == "default; value=512"
    assert body["max_tokens"] == 512
    body = {}
    assert applied(body, tenant(default=512, cap=100)) == "default; value=100", "the cap bounds the default"


def test_requested_values_within_the_cap_are_kept() -> None:
    body = {"max_tokens": 1024}
    assert applied(body, tenant()) == "requested; value=1024" and body["max_tokens"] == 1024


def test_above_the_cap_clamps_or_rejects() -> None:
    body = {"max_tokens": 5000}
    assert applied(body, tenant()) == "clamped; requested=5000; value=1024"
    assert body["max_tokens"] == 1024
    body = {"max_completion_tokens": 5000}
    applied(body, tenant())
    assert body == {"max_completion_tokens": 1024}, "the field the client used is the one clamped"
    with pytest.raises(InvalidRequest) as caught:
        applied({"max_tokens": 5000}, tenant(on_exceed="reject"))
    assert caught.value.code == "max_tokens_exceeded"


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": True}, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}, "stream_options"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
])
def test_chat_validation_names_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        CHAT.validate(body)
    assert caught.value.param == param


def test_completion_prompt_shapes() -> None:
    assert COMPLETIONS.validate({"model": "m", "prompt": "x"}) == "m"
    assert COMPLETIONS.validate({"model": "m", "prompt": [1, 2, 3]}) == "m"
    with pytest.raises(InvalidRequest):
        COMPLETIONS.validate({"model": "m", "prompt": ""})


def test_parse_json_errors_are_400() -> None:
    for raw in (b"{", b"[1, 2]", b"\xff"):
        with pytest.raises(InvalidRequest) as caught:
            asyncio.run(parse_json(raw))
        assert caught.value.code == "invalid_json"


def test_echo_cuts_client_values_short() -> None:
    assert echo("short") == "short"
    assert len(echo("x" * 100_000)) < 80


@pytest.mark.parametrize("value,count", [
    ("text", 1), (["a", "b", "c"], 3), ([1, 2, 3], 1), ([[1, 2], [3]], 2),
    ("", 0), ([], 0), (["a", ""], 0), ([[1], []], 0), ([True, 2], 0), (["a", 1], 0), ({"a": 1}, 0), (None, 0),
])
def test_embedding_inputs_are_counted_by_shape(value: object, count: int) -> None:
    assert embedding_inputs({"input": value}) == count


@pytest.mark.parametrize("body,param", [
    ({"input": "x"}, "model"),
    ({"model": "e", "input": ""}, "input"),
    ({"model": "e", "input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}, "input"),
    ({"model": "e", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "e", "input": "x", "dimensions": 0}, "dimensions"),
    ({"model": "e", "input": "x", "stream": True}, "stream"),
])
def test_embeddings_validation_names_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        EMBEDDINGS.validate(body)
    assert caught.value.param == param
    assert EMBEDDINGS.validate({"model": "e", "input": ["x"] * MAX_EMBEDDING_INPUTS}) == "e"


@pytest.mark.parametrize("body,param", [
    ({"input": "x"}, "model"),
    ({"model": "m", "input": ""}, "input"),
    ({"model": "m", "input": ["text"]}, "input"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "x", "previous_response_id": 7}, "previous_response_id"),
    ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
])
def test_responses_validation_names_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        RESPONSES.validate(body)
    assert caught.value.param == param
    assert RESPONSES.validate({"model": "m", "input": [{"role": "user", "content": "hi"}]}) == "m"


def test_max_output_tokens_is_the_responses_apis_bound() -> None:
    body: dict[str, Any] = {}
    assert applied(body, tenant(), RESPONSES) == "default; value=512" and body == {"max_output_tokens": 512}
    body = {"max_output_tokens": 5000}
    assert applied(body, tenant(), RESPONSES) == "clamped; requested=5000; value=1024"
    assert body == {"max_output_tokens": 1024}


def test_a_responses_stream_keeps_its_usage_and_counts_its_deltas() -> None:
    """The Responses API's events go by unchanged; the usage is read off the final event, and a stream cut
    before it still says how many text deltas it carried."""
    from gateway.endpoints.responses import Home, ResponseHomes
    from gateway.upstream.relay import Relayed

    relayed = Relayed()
    tap = RESPONSES.tap(relayed, False, False)
    created = (b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_abc","usage":null}}'
               b"\n\n")
    deltas = b"".join(b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"a"}'
                      b"\n\n" for _ in range(3))
    done = (b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_abc","usage":'
            b'{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,'
            b'"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12}}}\n\n')
    assert tap(created) == created and tap(deltas) == deltas and relayed.usage is None and relayed.events == 3
    assert tap(done) == done and relayed.usage == {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0},
                                                   "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
                                                   "total_tokens": 12}
    homes = ResponseHomes(size=2)
    assert homes.remember(created, Home("acme", "p", "http://w1")) == "resp_abc"
    assert homes.find("resp_abc", "acme") == Home("acme", "p", "http://w1")
    assert homes.find("resp_abc", "globex") is None, "only the tenant that made it finds it"
    assert homes.remember(b'{"object":"list"}', Home("acme", "p", "http://w1")) is None
    for rid in ("resp_b", "resp_c"):
        homes.remember(b'{"id":"' + rid.encode() + b'"}', Home("acme", "p", "http://w2"))
    assert homes.find("resp_abc", "acme") is None, "bounded: the oldest goes first"


def salt_of(name: str, prefix_cache: str = "salted", **body: Any) -> str | None:
    from gateway.openai_api import cache_salt

    return cache_salt(TenantView(name, "standard", None, 512, 1024, "clamp", prefix_cache=prefix_cache), body)


def test_each_tenant_has_a_prefix_cache_salt_of_its_own() -> None:
    """One salt for all of a tenant's requests (its system prompts still hit the engine's prefix cache), another
    for every other tenant; a client's own salt is folded in, never sent as it is, so it can only narrow the
    sharing: naming another tenant's salt gives a third one."""
    a, b = salt_of("a"), salt_of("b")
    assert a is not None and b is not None and a != b and salt_of("a") == a
    assert len(a) <= 128 and a.isalnum(), "vLLM takes at most 128 characters, none of '@/\\' or NUL"
    assert salt_of("b", cache_salt=a) not in (a, b), "a client cannot name another tenant's salt"
    narrowed = salt_of("a", cache_salt="conversation-7")
    assert narrowed not in (a, "conversation-7") and narrowed == salt_of("a", cache_salt="conversation-7")
    assert salt_of("c", "shared") is None, "a shared tenant uses the engine-wide cache"
    shared = salt_of("c", "shared", cache_salt="x")
    assert shared == salt_of("d", "shared", cache_salt="x") and shared not in ("x", salt_of("c", cache_salt="x"))
    for bad in ("", 7, ["a"]):
        with pytest.raises(InvalidRequest) as caught:
            salt_of("a", cache_salt=bad)
        assert caught.value.param == "cache_salt"


def test_the_salt_is_set_where_the_worker_body_is_built() -> None:
    """serialise writes the tenant's salt over the client's, or takes the client's out for a shared tenant."""
    from gateway.openai_api import Call, serialise
    from gateway.policy.schema import ModelRoute

    def sent(salt: str | None, body: dict[str, Any]) -> dict[str, Any]:
        call = Call(body, ModelRoute(pool="p"), False, False, False, 10, 8, "max_tokens", 1, cache_salt=salt)
        return orjson.loads(asyncio.run(serialise(call)))

    assert sent("s" * 64, {"model": "m", "cache_salt": "theirs"})["cache_salt"] == "s" * 64
    assert "cache_salt" not in sent(None, {"model": "m", "cache_salt": "theirs"})


def test_the_gateway_key_outlives_a_restart(tmp_path: Path) -> None:
    """The key the salts come from is kept in the data directory: a restarted process (or another process on
    the host) derives the same salts; another directory, another key."""
    from gateway.state.secret import FILE, Secret

    first, again, elsewhere = Secret(), Secret(), Secret()
    first.load(tmp_path)
    again.load(tmp_path)
    (tmp_path / "other").mkdir()
    elsewhere.load(tmp_path / "other")
    assert first.derive(b"cache_salt", b"a") == again.derive(b"cache_salt", b"a")
    assert first.derive(b"cache_salt", b"a") != elsewhere.derive(b"cache_salt", b"a")
    assert first.derive(b"cache_salt", b"a") != first.derive(b"other", b"a"), "one key, purposes apart"
    assert (tmp_path / FILE).stat().st_mode & 0o077 == 0, "readable by the gateway's user only"
    (tmp_path / FILE).write_bytes(b"torn")
    repaired = Secret()
    repaired.load(tmp_path)
    assert len((tmp_path / FILE).read_bytes()) == 32 and repaired.derive(b"p", b"m") != first.derive(b"p", b"m")
