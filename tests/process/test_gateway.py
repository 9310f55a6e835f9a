"""The gateway over real loopback HTTP, in front of real simulated worker processes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.auth import hash_key
from tests.conftest import (
    ADMIN_TOKEN,
    BATCH_KEY,
    DEMO_KEY,
    PREMIUM_KEY,
    Proc,
    metric_value,
    policy_dict,
    wait_for,
)
from workers.process import free_port

MODEL = "sim-llama-8b"
Starter = Callable[..., Proc]


def client_for(gateway: Proc, key: str = DEMO_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def post(gateway: Proc, body: dict[str, Any], key: str | None = DEMO_KEY,
         headers: dict[str, str] | None = None) -> httpx.Response:
    headers = {**({"authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def chat(max_tokens: int | None = 5, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hello gateway"}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["message"]


@pytest.fixture
def one_worker(start_sim: Starter, start_gateway: Starter) -> tuple[Proc, Proc]:
    sim = start_sim("--zero-delay")
    policy = policy_dict([sim.url])
    policy["models"]["other-model"]["upstream_model"] = MODEL
    return sim, start_gateway(policy)


def test_auth_and_model_errors(one_worker: tuple[Proc, Proc]) -> None:
    _, gw = one_worker
    assert_openai_error(post(gw, chat(), key=None), 401, "missing_api_key")
    assert_openai_error(post(gw, chat(), key="tg-wrong"), 401, "invalid_api_key")
    assert_openai_error(post(gw, chat(model="no-such-model")), 404, "model_not_found")
    assert_openai_error(post(gw, chat(model="other-model"), key=PREMIUM_KEY), 403, "model_not_allowed")
    with pytest.raises(openai.AuthenticationError):
        client_for(gw, "tg-wrong").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.PermissionDeniedError):
        client_for(gw, PREMIUM_KEY).chat.completions.create(model="other-model",
                                                            messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        client_for(gw).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_models_lists_only_what_the_tenant_may_use(one_worker: tuple[Proc, Proc]) -> None:
    _, gw = one_worker
    assert sorted(m.id for m in client_for(gw).models.list()) == ["other-model", MODEL]
    assert [m.id for m in client_for(gw, PREMIUM_KEY).models.list()] == [MODEL]
    assert httpx.get(gw.url + "/v1/models").status_code == 401


def test_bad_requests_get_openai_errors(one_worker: tuple[Proc, Proc]) -> None:
    _, gw = one_worker
    headers = {"authorization": f"Bearer {DEMO_KEY}", "content-type": "application/json"}
    assert_openai_error(httpx.post(gw.url + "/v1/chat/completions", content=b"{not json", headers=headers),
                        400, "invalid_json")
    assert_openai_error(post(gw, {"model": MODEL, "messages": []}), 400, "invalid_value")
    assert_openai_error(post(gw, chat(temperature=5)), 400, "invalid_value")
    assert_openai_error(post(gw, chat(max_tokens=0)), 400, "invalid_value")
    assert_openai_error(post(gw, {"messages": [{"role": "user", "content": "x"}]}), 400, "missing_model")
    assert_openai_error(post(gw, chat(messages=[{"role": "wizard", "content": "x"}])), 400, "invalid_value")
    big = chat(messages=[{"role": "user", "content": "x" * 70_000}])
    assert_openai_error(post(gw, big), 413, "request_too_large")
    assert_openai_error(httpx.get(gw.url + "/v1/nowhere"), 404, "not_found")
    with pytest.raises(openai.BadRequestError):
        client_for(gw).chat.completions.create(model=MODEL, messages=[])


def test_max_tokens_default_clamp_and_reject(one_worker: tuple[Proc, Proc]) -> None:
    _, gw = one_worker
    response = post(gw, chat(max_tokens=None))
    assert response.headers["x-tollgate-max-tokens"] == "default; value=512"
    assert response.json()["usage"]["completion_tokens"] == 512

    response = post(gw, chat(max_tokens=5000))  # standard tier: cap 1024, clamp
    assert response.headers["x-tollgate-max-tokens"] == "clamped; requested=5000; value=1024"
    assert response.json()["usage"]["completion_tokens"] == 1024

    response = post(gw, chat(max_completion_tokens=7, max_tokens=None))
    assert response.headers["x-tollgate-max-tokens"] == "requested; value=7"
    assert response.json()["usage"]["completion_tokens"] == 7

    batch = chat(model="other-model", max_tokens=None)  # batch tier: default 64, cap 256, reject
    response = post(gw, batch, key=BATCH_KEY)
    assert response.json()["usage"]["completion_tokens"] == 64
    assert_openai_error(post(gw, chat(model="other-model", max_tokens=300), key=BATCH_KEY), 400,
                        "max_tokens_exceeded")


def test_unknown_fields_pass_through_to_the_worker(start_sim: Starter, start_gateway: Starter) -> None:
    sim = start_sim("--zero-delay", "--mean-output-tokens", "2", "--seed", "3")
    gw = start_gateway(policy_dict([sim.url]))
    natural = [post(gw, chat(max_tokens=200, seed=i)).json()["usage"]["completion_tokens"] for i in range(5)]
    assert min(natural) < 200, "with EOS possible, some answers end early"
    forced = [post(gw, chat(max_tokens=200, seed=i, ignore_eos=True)).json()["usage"]["completion_tokens"]
              for i in range(5)]
    assert forced == [200] * 5, "ignore_eos (a vLLM field) reached the worker"


def test_stream_is_unbuffered(start_sim: Starter, start_gateway: Starter) -> None:
    sim = start_sim("--decode-base-ms", "50")
    gw = start_gateway(policy_dict([sim.url]))
    stream = client_for(gw).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=20, stream=True)
    arrivals = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
    assert len(arrivals) == 20
    # 20 tokens at 50 ms a step: the first reaches the client while the worker still has ~1 s of work left.
    assert arrivals[-1] - arrivals[0] > 0.6


def _stream_raw(gw: Proc, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any] | str]]:
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {DEMO_KEY}"}) as response:
        raw = response.read()
    events: list[dict[str, Any] | str] = []
    for event in raw.split(b"\n\n")[:-1]:
        data = event.removeprefix(b"data: ")
        events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return response, events


def test_usage_chunk_is_stripped_unless_asked_for(one_worker: tuple[Proc, Proc]) -> None:
    _, gw = one_worker
    tokens_before = metric_value(gw.url, "tollgate_tokens_total", direction="completion")
    response, events = _stream_raw(gw, chat(max_tokens=4, stream=True))
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    assert events[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and "usage" in e for e in events)
    # ...yet the gateway still read the usage for accounting
    assert wait_for(lambda: metric_value(gw.url, "tollgate_tokens_total", direction="completion")
                    == tokens_before + 4)

    chunks = list(client_for(gw).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_client_disconnect_aborts_the_worker_request(start_sim: Starter, start_gateway: Starter) -> None:
    sim = start_sim("--decode-base-ms", "20")
    gw = start_gateway(policy_dict([sim.url]))
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=chat(max_tokens=500, stream=True),
                      headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as response:
        assert next(response.iter_raw()).startswith(b"data: ")
    assert wait_for(lambda: metric_value(sim.url, "tollgate_sim_requests_aborted_total") == 1)
    assert metric_value(sim.url, "vllm:num_requests_running") == 0
    assert wait_for(lambda: metric_value(gw.url, "tollgate_requests_total", status="499") == 1)


def test_worker_killed_mid_stream_gives_an_sse_error(start_sim: Starter, start_gateway: Starter) -> None:
    sim = start_sim("--decode-base-ms", "20")
    gw = start_gateway(policy_dict([sim.url]))
    received = b""
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=chat(max_tokens=500, stream=True),
                      headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as response:
        for chunk in response.iter_raw():
            received += chunk
            if received.count(b"\n\n") == 3:
                sim.kill()
    events = received.split(b"\n\n")[:-1]
    assert events[-1] == b"data: [DONE]"
    error = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_stream_broken"
    with pytest.raises(openai.APIError):  # and the official client surfaces it as an error
        sim2 = start_sim("--decode-base-ms", "20", "--drop-after", "3")
        gw2 = start_gateway(policy_dict([sim2.url]))
        for _ in client_for(gw2).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                         max_tokens=50, stream=True):
            pass


def test_failover_when_a_worker_is_down_or_failing(start_sim: Starter, start_gateway: Starter) -> None:
    live = start_sim("--zero-delay")
    dead = f"http://127.0.0.1:{free_port()}"
    gw = start_gateway(policy_dict([dead, live.url]))
    for _ in range(6):
        assert post(gw, chat()).status_code == 200

    # A worker that answers 503 is retried on the other one before the first byte, and cooled down.
    failing = start_sim("--zero-delay", "--error-rate", "1", "--error-status", "503")
    gw2 = start_gateway(policy_dict([failing.url, live.url]))
    for _ in range(6):
        assert post(gw2, chat()).status_code == 200
    assert metric_value(failing.url, "tollgate_sim_injected_errors_total") >= 1
    assert metric_value(gw2.url, "tollgate_upstream_retries_total") >= 1

    # With every worker down the client gets a clear 502/503, never a hang.
    live.kill()
    failing.kill()
    response = post(gw2, chat())
    assert response.status_code in (502, 503)
    assert response.json()["error"]["code"] == "upstream_unavailable"


def test_sequential_requests_reuse_one_upstream_connection(one_worker: tuple[Proc, Proc]) -> None:
    sim, gw = one_worker
    assert post(gw, chat()).status_code == 200  # opens the request connection
    before = metric_value(sim.url, "tollgate_sim_connections_accepted_total")
    for i in range(20):
        assert post(gw, chat(stream=i % 2 == 0)).status_code == 200
    # +1: the metrics read below is itself a new connection (the test's, not the gateway's)
    assert metric_value(sim.url, "tollgate_sim_connections_accepted_total") == before + 1


def test_metrics_and_server_timing(one_worker: tuple[Proc, Proc]) -> None:
    _, gw = one_worker
    response = post(gw, chat(), headers={"x-request-id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    timing = response.headers["server-timing"]
    for stage in ("queue_wait;dur=", "upstream_connect;dur=", "ttft;dur="):
        assert stage in timing
    streamed, _ = _stream_raw(gw, chat(stream=True))
    assert "ttft;dur=" in streamed.headers["server-timing"]
    assert len(streamed.headers["x-request-id"]) == 32

    from prometheus_client.parser import text_string_to_metric_families
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(gw.url + "/metrics").text)}
    for name in ("tollgate_ttft_seconds", "tollgate_tpot_seconds", "tollgate_queue_wait_seconds",
                 "tollgate_request_duration_seconds", "tollgate_requests", "tollgate_tokens"):
        assert name in families, name
    ttft = [s for s in families["tollgate_ttft_seconds"].samples
            if s.name.endswith("_count") and s.labels.get("model") == MODEL]
    assert ttft and ttft[0].labels["tier"] == "standard" and ttft[0].value >= 2
    assert metric_value(gw.url, "tollgate_tpot_seconds_count", model=MODEL) >= 1


def test_request_log_line(one_worker: tuple[Proc, Proc]) -> None:
    _, gw = one_worker
    post(gw, chat(messages=[{"role": "user", "content": "secret payload words"}]), headers={"x-request-id": "log-1"})

    def line() -> dict[str, Any] | None:
        for text in gw.output().splitlines():
            if '"request_id":"log-1"' in text:
                return json.loads(text)
        return None
    assert wait_for(lambda: line() is not None)
    entry = line()
    assert entry is not None
    assert entry["tenant"] == "demo" and entry["tier"] == "standard" and entry["status"] == 200
    assert entry["time"].endswith("Z") and entry["time"][:4].isdigit(), "an ISO-8601 UTC timestamp"
    assert entry["completion_tokens"] == 5 and entry["prompt_tokens"] > 0
    assert set(entry["stages_ms"]) == {"queue_wait", "cache", "upstream_connect", "ttft", "tpot", "total"}
    assert entry["cache"] is None, "the cache is off in this policy"
    assert "secret payload" not in gw.output(), "payloads are not logged"


def _admin(gw: Proc, token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_hot_reload_from_file_good_then_bad(one_worker: tuple[Proc, Proc]) -> None:
    _sim, gw = one_worker
    path = gw.extra["policy_path"]
    policy = yaml.safe_load(path.read_text())
    policy["tenants"]["newco"] = {"tier": "premium", "keys": ["sha256:" + hash_key("tg-newco")]}
    path.write_text(yaml.safe_dump(policy))
    assert wait_for(lambda: post(gw, chat(), key="tg-newco").status_code == 200)

    path.write_text("tenants: [this is: not valid")
    assert wait_for(lambda: httpx.get(gw.url + "/admin/policy/status", headers=_admin(gw)).json()["last_error"])
    assert post(gw, chat(), key="tg-newco").status_code == 200, "the running policy stays"
    assert metric_value(gw.url, "tollgate_policy_last_reload_ok") == 0
    assert metric_value(gw.url, "tollgate_policy_reloads_total", result="error") >= 1

    policy["tenants"]["newco"]["tier"] = "gold"  # valid YAML, invalid policy
    path.write_text(yaml.safe_dump(policy))
    assert wait_for(lambda: "tenants.newco.tier" in (
        httpx.get(gw.url + "/admin/policy/status", headers=_admin(gw)).json()["last_error"] or ""))


def test_sighup_reloads_the_policy(one_worker: tuple[Proc, Proc]) -> None:
    """SIGHUP rereads the file even when nothing a watcher looks at (size, mtime, inode) changed."""
    import os
    import signal

    _sim, gw = one_worker
    path = gw.extra["policy_path"]
    before = path.stat()
    text = path.read_text()
    old_hash = hash_key(DEMO_KEY)
    assert old_hash in text
    with open(path, "r+") as f:  # same inode, same size
        f.write(text.replace(old_hash, hash_key("tg-rotated-key")))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    def checks() -> int:
        return httpx.get(gw.url + "/admin/policy/status", headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                         timeout=10).json()["file_checks"]
    written = checks()
    assert wait_for(lambda: checks() >= written + 2), "the watcher looked at the file since it was written"
    assert post(gw, chat()).status_code == 200, "unchanged stamp: not reloaded"
    os.kill(gw.pid, signal.SIGHUP)
    assert wait_for(lambda: post(gw, chat(), key="tg-rotated-key").status_code == 200)
    assert post(gw, chat()).status_code == 401, "the old key is gone"


def test_admin_put_policy(one_worker: tuple[Proc, Proc]) -> None:
    _sim, gw = one_worker
    path = gw.extra["policy_path"]
    policy = yaml.safe_load(path.read_text())
    policy["tiers"]["standard"]["max_tokens_default"] = 9
    url = gw.url + "/admin/policy"
    assert httpx.put(url, content=yaml.safe_dump(policy)).status_code == 401
    assert httpx.put(url, content=yaml.safe_dump(policy), headers=_admin(gw, "wrong")).status_code == 401
    applied = httpx.put(url, content=yaml.safe_dump(policy), headers=_admin(gw))
    assert applied.status_code == 200
    assert applied.json()["diff"]["changed"] == ["tiers.standard.max_tokens_default"]
    assert post(gw, chat(max_tokens=None)).json()["usage"]["completion_tokens"] == 9
    assert yaml.safe_load(path.read_text())["tiers"]["standard"]["max_tokens_default"] == 9, "persisted"

    policy["pools"]["main"]["workers"] = ["not a url"]
    rejected = httpx.put(url, content=yaml.safe_dump(policy), headers=_admin(gw))
    assert rejected.status_code == 400
    assert rejected.json()["error"]["details"][0]["path"] == "pools.main.workers.0"
    assert post(gw, chat(max_tokens=None)).json()["usage"]["completion_tokens"] == 9, "the running policy stays"


def test_in_flight_requests_finish_under_their_policy(start_sim: Starter, start_gateway: Starter) -> None:
    sim = start_sim("--decode-base-ms", "20")
    gw = start_gateway(policy_dict([sim.url]))
    policy = yaml.safe_load(gw.extra["policy_path"].read_text())
    del policy["tenants"]["demo"]
    stream = client_for(gw).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=60, stream=True)
    it = iter(stream)
    next(it)
    assert httpx.put(gw.url + "/admin/policy", content=yaml.safe_dump(policy), headers=_admin(gw)).status_code == 200
    rest = [c for c in it if c.choices and c.choices[0].delta.content]
    assert len(rest) == 60, "the stream that started under the old policy finished"
    assert post(gw, chat()).status_code == 401, "new requests see the new policy"


def test_readiness_follows_worker_health(start_sim: Starter, start_gateway: Starter) -> None:
    sim = start_sim("--zero-delay")
    gw = start_gateway(policy_dict([sim.url]))
    assert httpx.get(gw.url + "/readyz").status_code == 200
    sim.kill()
    assert wait_for(lambda: httpx.get(gw.url + "/readyz").status_code == 503)
    assert httpx.get(gw.url + "/healthz").status_code == 200


def test_one_pool_down_leaves_the_replica_ready_and_its_model_a_503(start_sim: Starter,
                                                                     start_gateway: Starter) -> None:
    """Readiness takes a replica out of its Service for every model, so it waits only for all of them to be down:
    one pool down (a gateway even started so) is that pool's models' 503, seen in /metrics and /admin/queues."""
    sim = start_sim("--zero-delay")
    policy = policy_dict([sim.url])
    policy["pools"]["down"] = {**policy["pools"]["main"], "workers": ["http://127.0.0.1:9"]}  # nothing listens
    policy["models"]["other-model"] = {"pool": "down"}
    gw = start_gateway(policy)  # waits for /readyz: before, a gateway started with a pool down never got there
    ready = httpx.get(gw.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["unavailable_models"] == ["other-model"]
    refused = post(gw, {**chat(), "model": "other-model"})
    assert_openai_error(refused, 503, "upstream_unavailable")
    assert refused.json()["error"]["type"] == "server_error" and "'other-model'" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert post(gw, chat()).status_code == 200, "the other pool's model is served"
    assert metric_value(gw.url, "tollgate_pool_healthy_workers", pool="main") == 1
    assert metric_value(gw.url, "tollgate_pool_healthy_workers", pool="down") == 0
    assert metric_value(gw.url, "tollgate_model_ready", model=MODEL) == 1
    assert metric_value(gw.url, "tollgate_model_ready", model="other-model") == 0
    queues = httpx.get(gw.url + "/admin/queues", headers=_admin(gw)).json()
    assert {name: view["healthy_workers"] for name, view in queues["pools"].items()} == {"main": 1, "down": 0}
    assert queues["models"] == {MODEL: {"pool": "main", "ready": True},
                                "other-model": {"pool": "down", "ready": False}}
    sim.kill()  # now no model can be served
    assert wait_for(lambda: httpx.get(gw.url + "/readyz").status_code == 503)
    assert httpx.get(gw.url + "/readyz").json()["reason"] == "no healthy worker for any model"
    assert metric_value(gw.url, "tollgate_pool_healthy_workers", pool="main") == 0
