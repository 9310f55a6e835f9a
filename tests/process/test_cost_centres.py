"""Cost centres (gateway.tags) through a gateway process on a simulated worker, with the real `openai` client:
metadata=, user= and the X-Tollgate-Tags header end up in the ledger's tags and in the report grouped by them;
hostile tags are a 400 that records nothing odd."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY, FINANCE_TOKEN, Proc, policy_dict, wait_for

MODEL = "sim-llama-8b"
FINANCE = {"Authorization": f"Bearer {FINANCE_TOKEN}"}
SEARCH = "cost_center=search,project=ranker,user=u-17"


def ledger(gateway: Proc) -> dict[str, dict[str, Any]]:
    response = httpx.get(gateway.url + "/admin/ledger", params={"format": "json"}, headers=FINANCE, timeout=30)
    assert response.status_code == 200, response.text
    return {row["request_id"]: row for row in response.json()["data"]}


def ask(client: openai.OpenAI, rid: str, header: str | None = None, **tags: Any) -> Any:
    headers = {"X-Request-ID": rid, **({"X-Tollgate-Tags": header} if header is not None else {})}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"question {rid}"}],
                                          max_tokens=4, extra_headers=headers, **tags)


def refused(gateway: Proc, rid: str, body: dict[str, Any], header: bytes | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {DEMO_KEY}", "X-Request-ID": rid}
    if header is not None:
        headers["X-Tollgate-Tags"] = header  # type: ignore[assignment]
    response = httpx.post(gateway.url + "/v1/chat/completions", timeout=30, headers=headers, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error" and len(response.text) < 1000, "the value is echoed cut short"
    return error


def raw_request(gateway: Proc, headers: bytes) -> bytes:
    """A request written by hand (``headers``: more header lines), for bytes no HTTP client library will send."""
    body = b'{"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Authorization: Bearer " + DEMO_KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n" + headers + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def raw_refusal(gateway: Proc, headers: bytes) -> dict[str, Any]:
    head, _, body = raw_request(gateway, headers).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    error: dict[str, Any] = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    return error


def test_metadata_user_and_the_header_are_recorded_and_reported_as_cost_centres(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc]) -> None:
    sim = start_sim("--decode-base-ms", "2")
    gateway = start_gateway(policy_dict([sim.url]))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=DEMO_KEY, max_retries=0)

    for i in range(3):
        ask(client, f"search-{i}", "project=ranker", metadata={"Cost_Center": "search"}, user="u-17")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a stream"}], max_tokens=4, stream=True,
        metadata={"cost_center": "search", "project": "ranker"}, user="u-17",
        extra_headers={"X-Request-ID": "search-stream"})
    assert list(stream)
    ask(client, "header-wins", "project=from-header", metadata={"project": "from-metadata"}, user="u-9")
    ask(client, "plain")
    made = client.responses.create(model=MODEL, input="hello", max_output_tokens=4, metadata={"team": "ads"},
                                   user="u-2", extra_headers={"X-Request-ID": "responses"})
    assert made.usage is not None and made.usage.output_tokens > 0, "the worker took the metadata and user"

    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "wrong-type", metadata={"cost_center": 7})
    assert caught.value.body["param"] == "metadata.cost_center"  # type: ignore[index]
    hostile = {
        "huge-header": refused(gateway, "huge-header", {}, b"project=" + b"x" * 10_240),
        "many-pairs": refused(gateway, "many-pairs", {}, b", ".join(b"k%d=v" % i for i in range(100))),
        "tab-in-header": refused(gateway, "tab-in-header", {}, b"project=a\tb"),
        "control-in-metadata": refused(gateway, "control-in-metadata", {"metadata": {"project": "a\u0001b"}}),
        "newline-in-metadata": refused(gateway, "newline-in-metadata", {"metadata": {"project": "a\r\nb=c"}}),
        "many-metadata": refused(gateway, "many-metadata", {"metadata": {f"k{i}": "v" for i in range(100)}}),
        # a C1 control character (U+0085, as UTF-8): no client library sends it, the HTTP parser lets it by
        "c1-in-header": raw_refusal(gateway, b"X-Tollgate-Tags: project=a\xc2\x85b\r\nX-Request-ID: c1-in-header"),
    }
    assert {rid: e["param"] for rid, e in hostile.items()} == {
        "huge-header": "X-Tollgate-Tags", "many-pairs": "X-Tollgate-Tags", "tab-in-header": "X-Tollgate-Tags",
        "control-in-metadata": "metadata.project", "newline-in-metadata": "metadata.project",
        "many-metadata": "metadata", "c1-in-header": "X-Tollgate-Tags"}
    # a C0 one the HTTP parser refuses itself: the request never reaches the gateway's app (and makes no record)
    assert raw_request(gateway, b"X-Tollgate-Tags: project=a\x01b").startswith(b"HTTP/1.1 400 ")

    asked = {"search-0", "search-1", "search-2", "search-stream", "header-wins", "plain", "responses",
             "wrong-type", *hostile}
    assert wait_for(lambda: asked <= set(ledger(gateway)), timeout=15), sorted(ledger(gateway))
    rows = ledger(gateway)
    assert set(rows) == asked, "one record for each request the app saw"
    assert {rows[f"search-{i}"]["tags"] for i in range(3)} | {rows["search-stream"]["tags"]} == {SEARCH}
    assert rows["header-wins"]["tags"] == "project=from-header,user=u-9"
    assert rows["plain"]["tags"] is None
    assert rows["responses"]["tags"] == "team=ads,user=u-2"
    for rid in ("wrong-type", *hostile):
        assert (rows[rid]["status"], rows[rid]["tags"]) == (400, None), rid
    for row in rows.values():  # nothing odd anywhere: pairs that read back, short, printable
        pairs = row["tags"].split(",") if row["tags"] else []
        assert len(pairs) <= 8 and all(p.count("=") == 1 and len(p) <= 32 + 1 + 64 and p.isprintable()
                                       for p in pairs), row["tags"]
    assert "xxxxxxxxxxxx" not in str(rows) and "k99" not in str(rows)

    report = httpx.get(gateway.url + "/admin/reports/costs", params={"group_by": "tag"}, headers=FINANCE,
                       timeout=30).json()
    by_tag = {row["tag"]: row for row in report["data"]}
    assert by_tag[SEARCH]["requests"] == 4 and by_tag[SEARCH]["cost_usd"] > 0
    assert by_tag["project=from-header,user=u-9"]["requests"] == 1
    assert by_tag[None]["requests"] == 1 + 1 + len(hostile), "the plain request and every refused one"
    assert by_tag[None]["errors"] == 1 + len(hostile)
