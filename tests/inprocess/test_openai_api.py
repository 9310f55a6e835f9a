"""Request validation and the max_tokens policy, in-process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.endpoints import CHAT, RESPONSES, Endpoint
from gateway.endpoints.checks import echo
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


def test_parse_json_errors_are_400() -> None:
    for raw in (b"{", b"[1, 2]", b"\xff"):
        with pytest.raises(InvalidRequest) as caught:
            asyncio.run(parse_json(raw))
        assert caught.value.code == "invalid_json"


def test_echo_cuts_client_values_short() -> None:
    assert echo("short") == "short"
    assert len(echo("x" * 100_000)) < 80


def test_max_output_tokens_is_the_responses_apis_bound() -> None:
    body: dict[str, Any] = {}
    assert applied(body, tenant(), RESPONSES) == "default; value=512" and body == {"max_output_tokens": 512}
    body = {"max_output_tokens": 5000}
    assert applied(body, tenant(), RESPONSES) == "clamped; requested=5000; value=1024"
    assert body == {"max_output_tokens": 1024}


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


def test_prepare_records_the_cost_centres_and_forwards_metadata_and_user_unchanged() -> None:
    """The header (handed down by the edge) and the body's metadata and user become ctx.tags; the worker gets
    the body's metadata and user as sent (vLLM takes both); tags that break the rules are a 400 before any
    worker is asked, with no tags recorded."""
    from gateway import pipeline
    from gateway.context import RequestContext
    from gateway.sink import BufferSink
    from tests.fakes import FakeWorker, chat, completion_json, json_of, running_gateway

    async def send(gw: Any, body: dict[str, Any], header: bytes | None) -> tuple[RequestContext, BufferSink]:
        ctx = RequestContext("r", gw.store.current, CHAT)
        ctx.tenant = gw.store.current.tenants["demo"]
        sink = BufferSink()
        async with pipeline.Lifecycle(gw, ctx, sink):
            await pipeline.run(gw, ctx, orjson.dumps(body), sink, tags=header)
        return ctx, sink

    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as w, running_gateway([w.url]) as gw:
            metadata = {"Project": "ranker", "note": "x" * 100}
            ctx, sink = await send(gw, chat(metadata=metadata, user="u-17"), b"cost_center=search")
            assert sink.status == 200 and ctx.tags == f"cost_center=search,note={'x' * 64},project=ranker,user=u-17"
            assert (w.requests[-1]["metadata"], w.requests[-1]["user"]) == (metadata, "u-17")
            ctx, sink = await send(gw, chat(), None)
            assert sink.status == 200 and ctx.tags is None and "metadata" not in w.requests[-1]
            asked = len(w.requests)
            ctx, sink = await send(gw, chat(user="u"), b"project=a\x01b")
            assert sink.status == 400 and sink.error is not None and sink.error.param == "X-Tollgate-Tags"
            ctx, sink = await send(gw, chat(metadata={"team": 7}), None)
            assert sink.status == 400 and sink.error is not None and sink.error.param == "metadata.team"
            assert ctx.tags is None and len(w.requests) == asked, "no worker was asked"
            ctx, sink = await send(gw, chat(model="nope"), b"project=p")
            assert sink.status == 404 and ctx.tags == "project=p", "a request refused later keeps its tags"
    asyncio.run(main())
