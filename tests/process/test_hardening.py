"""Hostile input, slow clients and worker faults: one test per finding, over real loopback HTTP.

Each test names the finding it covers; each failed on the main branch before the hardening work.
"""

from __future__ import annotations

import json
import random
import select
import socket
import string
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, Proc, metric_value, policy_dict, wait_for

MODEL = "sim-llama-8b"
Starter = Callable[..., Proc]
AUTH = {"authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def strict_policy(workers: list[str], **server: Any) -> dict[str, Any]:
    policy = policy_dict(workers)
    policy["server"].update({"idle_timeout_s": 1.0, "header_timeout_s": 1.0, "body_timeout_s": 1.0,
                             "max_header_bytes": 8192, "max_headers": 50, **server})
    return policy


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


def raw_exchange(url: str, data: bytes, wait_s: float = 5.0) -> bytes:
    """Send raw bytes, return whatever comes back until the server closes (or wait_s passes)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                part = s.recv(65536)
            except TimeoutError:
                break
            if not part:
                break
            out += part
        return out


def inflight(gw: Proc) -> float:
    return metric_value(gw.url, "tollgate_worker_inflight")


@pytest.fixture
def sim_and_gateway(start_sim: Starter, start_gateway: Starter) -> tuple[Proc, Proc]:
    sim = start_sim("--decode-base-ms", "40")
    return sim, start_gateway(strict_policy([sim.url]))


def test_1_non_streaming_disconnects_give_the_in_flight_count_back(sim_and_gateway: tuple[Proc, Proc]) -> None:
    sim, gw = sim_and_gateway
    for _ in range(10):  # 64 tokens at 40 ms a step take ~2.6 s: each client leaves after 0.6 s
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=64, ignore_eos=True), headers=AUTH,
                       timeout=httpx.Timeout(10, read=0.6))
    assert wait_for(lambda: inflight(gw) == 0, timeout=10), "every exit gives the lease back"
    assert wait_for(lambda: metric_value(sim.url, "vllm:num_requests_running") == 0, timeout=10)
    answer = httpx.post(gw.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=30)
    assert answer.status_code == 200 and inflight(gw) == 0


def test_2_an_oversized_header_is_refused_before_it_is_read(sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    big = b"x" * (4 * 1024 * 1024)
    started = time.monotonic()
    reply = raw_exchange(gw.url, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-junk: " + big + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "headers_too_large"
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(200))
    assert raw_exchange(gw.url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431")
    long_line = b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n"
    assert raw_exchange(gw.url, long_line).startswith(b"HTTP/1.1 414")
    assert time.monotonic() - started < 5
    assert metric_value(gw.url, "tollgate_worker_healthy") == 1, "the worker stayed in routing"
    assert httpx.post(gw.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=30).status_code == 200


def read_to_close(sock: socket.socket) -> bytes:
    """What the server sent until it closed (a reset after its answer ends the read like a close)."""
    out = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not part:
            return out
        out += part


def test_2b_a_header_that_never_ends_is_refused_as_it_arrives(sim_and_gateway: tuple[Proc, Proc]) -> None:
    """httptools keeps an unfinished header whole: counted only once complete, one without an end took 114 MB."""
    _, gw = sim_and_gateway
    host, port = gw.url.removeprefix("http://").split(":")
    junk, sent = b"x" * 65536, 0
    with socket.create_connection((host, int(port)), timeout=10) as attacker:
        attacker.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-junk: ")
        assert httpx.get(gw.url + "/healthz").status_code == 200, "a head in progress holds nothing up"
        try:
            while sent < 8 * 1024 * 1024 and not select.select([attacker], [], [], 0)[0]:
                attacker.sendall(junk)
                sent += len(junk)
                assert httpx.get(gw.url + "/healthz").status_code == 200
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while this was still sending
        reply = read_to_close(attacker)
    assert reply.startswith(b"HTTP/1.1 431"), (sent, reply[:100])
    head, body = reply.split(b"\r\n\r\n", 1)
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"] == {"message": "The request headers are too large or too many.",
                                         "type": "invalid_request_error", "param": None,
                                         "code": "headers_too_large"}
    assert httpx.get(gw.url + "/healthz").status_code == 200


def test_2d_a_refused_client_that_keeps_sending_is_cut_off_by_bytes(sim_and_gateway: tuple[Proc, Proc]) -> None:
    """After a 431 the gateway reads and drops what the client still sends (so its answer is not lost to a
    reset), but only so much: a client writing on at loopback speed pushed 3.5 GB through it in the 2 s linger."""
    _, gw = sim_and_gateway
    host, port = gw.url.removeprefix("http://").split(":")
    junk, sent = b"x" * 65536, 0
    with socket.create_connection((host, int(port)), timeout=10) as attacker:
        attacker.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-junk: ")
        try:
            while sent < 1024 * 1024 * 1024:
                attacker.sendall(junk)
                sent += len(junk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert sent < 64 * 1024 * 1024, f"{sent / 2**20:.0f} MiB read and dropped before the gateway hung up"
    assert httpx.get(gw.url + "/healthz").status_code == 200


def at_the_head_limit(extra: int = 0) -> bytes:
    """A chat request whose head is the whole head limit (strict_policy: 8192 for the request line, 8192 for the
    headers, counted together as they arrive) plus ``extra`` bytes, with its body in the same write."""
    body = json.dumps(chat()).encode() + b" " * 20_000  # more than the head's room, sent with it
    line = b"POST /v1/chat/completions?pad=" + b"a" * (8192 - 30) + b" HTTP/1.1\r\n"
    fields = b"host: x\r\nauthorization: Bearer %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        DEMO_KEY.encode(), len(body))
    pad = 16384 + extra - len(line) - len(fields) - len(b"x-pad: \r\n\r\n")
    head = line + fields + b"x-pad: " + b"b" * pad + b"\r\n\r\n"
    assert len(head) == 16384 + extra
    return head + body


def test_2c_a_head_at_the_limit_is_served_and_each_request_has_its_own_count(
        sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    # two at the limit, pipelined in one write (the last one closes): neither is charged the other's bytes or
    # the body that came with its head
    last = at_the_head_limit().replace(b"host: x\r\n", b"host: x\r\nconnection: close\r\n", 1)
    last = last.replace(b"b" * 19, b"", 1)  # the same length: the connection header's room taken from x-pad
    reply = raw_exchange(gw.url, at_the_head_limit() + last, wait_s=30)
    assert reply.count(b"HTTP/1.1 200") == 2, reply[:300]
    assert raw_exchange(gw.url, at_the_head_limit(extra=1)).startswith(b"HTTP/1.1 431")


def test_3_an_empty_policy_never_replaces_the_live_one(sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    path = gw.extra["policy_path"]
    before = path.read_text()
    for text in ("", "tenants: {}\n", yaml.safe_dump({**yaml.safe_load(before), "models": {}})):
        reply = httpx.put(gw.url + "/admin/policy", content=text, headers=ADMIN)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_policy"
    no_admin = yaml.safe_load(before)
    del no_admin["server"]["admin_token_sha256"]
    reply = httpx.put(gw.url + "/admin/policy", content=yaml.safe_dump(no_admin), headers=ADMIN)
    assert reply.status_code == 400, "the admin API does not lock itself out"
    assert path.read_text() == before, "nothing was written"
    assert httpx.get(gw.url + "/readyz").status_code == 200
    assert httpx.post(gw.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=30).status_code == 200
    changed = yaml.safe_load(before)
    changed["tiers"]["standard"]["max_tokens_default"] = 7
    assert httpx.put(gw.url + "/admin/policy", content=yaml.safe_dump(changed), headers=ADMIN).status_code == 200
    assert yaml.safe_load(path.read_text())["tiers"]["standard"]["max_tokens_default"] == 7
    assert path.with_name(path.name + ".bak").read_text() == before, "the previous file is kept"


def test_3b_readyz_is_503_without_a_routable_model(start_gateway: Starter) -> None:
    policy = policy_dict(["http://127.0.0.1:9"])  # nothing listens on the discard port
    gw = start_gateway(policy, ready="/healthz")
    reply = httpx.get(gw.url + "/readyz")
    assert reply.status_code == 503 and "no healthy worker" in reply.json()["reason"]


def test_4_client_chosen_model_names_never_become_metric_labels(sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    with httpx.Client(headers=AUTH, timeout=30) as client:
        assert client.post(gw.url + "/v1/chat/completions", json=chat(model="first-unknown")).status_code == 404
        size_before = len(httpx.get(gw.url + "/metrics").content)
        for _ in range(300):
            name = "".join(random.choices(string.ascii_lowercase, k=24))
            assert client.post(gw.url + "/v1/chat/completions", json=chat(model=name)).status_code == 404
        huge = client.post(gw.url + "/v1/chat/completions", json=chat(model="m" * 60_000))
    assert huge.status_code == 404 and len(huge.json()["error"]["message"]) < 200, "echoed values are cut short"
    text = httpx.get(gw.url + "/metrics").text
    assert abs(len(text) - size_before) < 200, "the series stay the same, whatever the names (only counts change)"
    assert "m" * 100 not in text


def test_4b_metrics_can_require_a_token(start_sim: Starter, start_gateway: Starter) -> None:
    from gateway.auth import hash_key

    sim = start_sim("--zero-delay")
    gw = start_gateway(strict_policy([sim.url], metrics_token_sha256="sha256:" + hash_key("scraper-token")))
    assert httpx.get(gw.url + "/metrics").status_code == 401
    assert httpx.get(gw.url + "/metrics", headers={"authorization": "Bearer scraper-token"}).status_code == 200


def test_5_slow_and_silent_clients_are_timed_out(sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    started = time.monotonic()
    assert raw_exchange(gw.url, b"", wait_s=5) == b"", "an idle connection is closed"
    assert time.monotonic() - started < 3
    partial_head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    assert raw_exchange(gw.url, partial_head, wait_s=5).startswith(b"HTTP/1.1 408")
    body = json.dumps(chat()).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + DEMO_KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body))
    reply = raw_exchange(gw.url, head + body[:10], wait_s=5)
    assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply[:80]
    assert httpx.post(gw.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=30).status_code == 200


def test_6_json_too_deep_to_forward_is_a_400_and_logged_as_one(sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    deep = b"[" * 300 + b"1" + b"]" * 300
    body = json.dumps(chat())[:-1].encode() + b', "metadata": ' + deep + b"}"
    reply = httpx.post(gw.url + "/v1/chat/completions", content=body, timeout=30,
                       headers={**AUTH, "content-type": "application/json", "x-request-id": "deep-1"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json"

    def line() -> dict[str, Any] | None:
        found = [json.loads(t) for t in gw.output().splitlines() if '"request_id":"deep-1"' in t]
        return found[0] if found else None
    assert wait_for(lambda: line() is not None)
    assert line()["status"] == 400, "the log line says what the client got"  # type: ignore[index]


def test_8_worker_failures_become_the_gateways_own_errors(sim_and_gateway: tuple[Proc, Proc]) -> None:
    sim, gw = sim_and_gateway
    httpx.post(sim.url + "/sim/faults", json={"error_rate": 1.0, "error_statuses": [503]})
    reply = httpx.post(gw.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=30)
    assert reply.status_code == 502
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "upstream_broken"
    httpx.post(sim.url + "/sim/faults", json={"error_rate": 0, "drop_after": 2})
    # the 503 cooled the worker down for the policy's 1 s: wait until the scraper has it back in routing
    assert wait_for(lambda: metric_value(gw.url, "tollgate_worker_healthy") == 1, timeout=10)
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=chat(max_tokens=20, stream=True),
                      headers=AUTH, timeout=30) as stream:
        text = "".join(stream.iter_text())
    events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
    message = events[-1]["error"]["message"]
    assert events[-1]["error"]["code"] == "upstream_stream_broken"
    assert "Error" not in message and "127.0.0.1" not in text, "no exception class, no address"


def test_10_purge_answers_what_it_removed(sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    reply = httpx.delete(gw.url + "/admin/cache?tenant=a&tenant=b", headers=ADMIN)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "repeated_parameter"


def test_12_two_authorization_headers_are_refused(sim_and_gateway: tuple[Proc, Proc]) -> None:
    _, gw = sim_and_gateway
    headers = [("authorization", "Bearer wrong"), ("authorization", f"Bearer {DEMO_KEY}")]
    for path, method in (("/v1/chat/completions", "POST"), ("/v1/models", "GET")):
        reply = httpx.request(method, gw.url + path, json=chat() if method == "POST" else None,
                              headers=headers, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "duplicate_header", path


def test_tenant_concurrency_cap_answers_429_with_retry_after(start_sim: Starter, start_gateway: Starter) -> None:
    import concurrent.futures

    sim = start_sim("--decode-base-ms", "40")
    gw = start_gateway(strict_policy([sim.url], tenant_max_concurrency=2))

    def one(_: int) -> httpx.Response:
        return httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=20, ignore_eos=True), headers=AUTH,
                          timeout=30)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(one, range(6)))
    limited = [r for r in replies if r.status_code == 429]
    assert limited and all(r.headers["retry-after"] == "1" for r in limited)
    assert limited[0].json()["error"]["code"] == "tenant_concurrency_exceeded"
    assert sum(r.status_code == 200 for r in replies) >= 2
    assert wait_for(lambda: inflight(gw) == 0)


def test_a_queued_client_that_leaves_sends_nothing_upstream(start_sim: Starter, start_gateway: Starter) -> None:
    """The queue is the gateway's; a client that gives up while queued is gone from it at once."""
    sim = start_sim("--decode-base-ms", "40")
    policy = strict_policy([sim.url])
    policy["pools"]["main"]["max_inflight_per_worker"] = 1
    policy["scheduling"] = {"tiers": {"standard": {"max_queue_wait_ms": 20_000}}}
    gw = start_gateway(policy)
    import threading

    first = threading.Thread(target=lambda: httpx.post(
        gw.url + "/v1/chat/completions", json=chat(max_tokens=60, ignore_eos=True), headers=AUTH, timeout=30))
    first.start()
    assert wait_for(lambda: inflight(gw) == 1)
    with pytest.raises(httpx.ReadTimeout):  # queued behind the first, gives up after 0.5 s
        httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=60, ignore_eos=True), headers=AUTH,
                   timeout=httpx.Timeout(10, read=0.5))
    assert wait_for(lambda: metric_value(gw.url, "tollgate_queue_depth") == 0, timeout=5), "it left the queue"
    first.join()
    # the positive control: a request sent after the leaver runs to its end; had the leaver been forwarded (it
    # was ahead of the control in the queue), the worker would have finished or aborted it by then
    assert httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=4), headers=AUTH,
                      timeout=30).status_code == 200
    assert metric_value(sim.url, "vllm:request_success_total") == 2, "the first and the control, not the leaver"
    assert metric_value(sim.url, "tollgate_sim_requests_aborted_total") == 0
    queues = httpx.get(gw.url + "/admin/queues", headers=ADMIN).json()
    assert queues["mode"] == "priority" and queues["pools"]["main"]["granted"] == 0
