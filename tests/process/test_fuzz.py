"""Property-based fuzzing of the request surface over loopback: thousands of generated bodies and headers.

Whatever a client sends, the gateway answers with a status below 500 in the OpenAI error shape (or a real
answer), never loses a worker from routing, and gives every in-flight lease back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import DEMO_KEY, Proc, metric_value, policy_dict, wait_for

MODEL = "sim-llama-8b"
Starter = Callable[..., Proc]

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                           max_leaves=12)
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "robot", ""]),
                           "content": st.one_of(st.text(max_size=60), json_values)}),
    json_values), max_size=4)
known_fields = {
    "model": st.one_of(st.just(MODEL), st.text(max_size=30), json_values),
    "messages": st.one_of(messages, json_values),
    "prompt": json_values,
    "max_tokens": st.one_of(st.integers(min_value=-5, max_value=5000), json_values),
    "max_completion_tokens": st.one_of(st.integers(min_value=-5, max_value=50), json_values),
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": json_values,
    "temperature": st.one_of(st.floats(min_value=-1, max_value=3), json_values),
    "top_p": json_values, "n": st.one_of(st.integers(min_value=-1, max_value=3), json_values),
    "stop": json_values, "seed": json_values, "logprobs": json_values, "tools": json_values,
}
valid_fields = {
    "max_tokens": st.integers(min_value=1, max_value=40), "stream": st.booleans(),
    "temperature": st.floats(min_value=0, max_value=2), "top_p": st.floats(min_value=0, max_value=1),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=2)),
    "seed": st.integers(min_value=0, max_value=2**31),
}
valid_chats = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=80)}), min_size=1, max_size=3)},
    optional=valid_fields).map(lambda d: json.dumps(d).encode())
bodies = st.one_of(
    valid_chats,
    st.fixed_dictionaries({}, optional=known_fields).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"model": st.just(MODEL), "messages": st.just([{"role": "user", "content": "hi"}])},
                          optional={k: v for k, v in known_fields.items() if k not in ("model", "messages")}
                          ).map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.integers(min_value=1, max_value=400).map(lambda n: b'{"model": "x", "messages": ' + b"[" * n + b"]" * n + b"}"),
)
header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(str.strip)
extra_headers = {"x-request-id": header_text, "cache-control": header_text, "x-junk": header_text}
headers = st.one_of(st.fixed_dictionaries({"authorization": st.just(f"Bearer {DEMO_KEY}")}, optional=extra_headers),
                    st.fixed_dictionaries({}, optional={
    "authorization": st.one_of(st.just(f"Bearer {DEMO_KEY}"), st.just(f"bearer {DEMO_KEY}"), header_text),
    "content-type": st.one_of(st.just("application/json"), header_text),
    "x-request-id": header_text,
    "cache-control": header_text,
    "x-junk": header_text,
}))
paths = st.sampled_from(["/v1/chat/completions"] * 4 + ["/v1/completions"] * 2
                        + ["/v1/models", "/v1/nope", "/admin/policy"])
methods = st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE"])


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from loadtest.harness import procs

    tmp = tmp_path_factory.mktemp("fuzz")
    sim = procs.start_sim(tmp, "--zero-delay")
    policy = policy_dict([sim.url])
    policy["tiers"]["standard"].update(max_tokens_default=32, max_tokens_cap=64)  # keep answers short
    gw = procs.start_gateway(tmp, policy)
    client = httpx.Client(timeout=30)
    yield gw, client
    client.close()
    gw.kill()
    sim.kill()


@settings(max_examples=2500, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(method=methods, path=paths, body=bodies, head=headers)
def fuzz(fuzz_target: Any, method: str, path: str, body: bytes, head: dict[str, str]) -> None:
    gw, client = fuzz_target
    reply = client.request(method, gw.url + path, content=body, headers=head)
    assert reply.status_code < 500, (reply.status_code, reply.text[:300])
    if reply.status_code >= 400:
        error = reply.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert error["code"] is None or isinstance(error["code"], str)


def test_no_request_gets_a_5xx_and_the_workers_are_whole_after(fuzz_target: Any) -> None:
    """The campaign, then what it must leave: no request in flight, the worker healthy, and proof that it reached
    the completions path and got real answers (a campaign refused at the door would prove nothing). One test, so
    that no order of running them leaves one checking nothing."""
    fuzz(fuzz_target)
    gw, _ = fuzz_target
    assert wait_for(lambda: metric_value(gw.url, "tollgate_worker_inflight") == 0)
    assert metric_value(gw.url, "tollgate_worker_healthy") == 1
    assert metric_value(gw.url, "tollgate_requests_total") >= 1000, "the fuzz reached the completions path"
    assert metric_value(gw.url, "tollgate_requests_total", status="200") >= 50, "and got real answers too"
