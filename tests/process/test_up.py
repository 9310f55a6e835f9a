"""`tollgate up`: workers from the policy, the gateway, a demo key that works, and a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import yaml

from tests.conftest import ROOT, ledger_records, wait_for
from workers.process import free_port

FINANCE = "tg-finance-demo-change-me"  # the embedded default's finance token


def _pids_of(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_up_serves_the_demo_key_and_stops_its_workers(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    ports = [free_port(), free_port(), free_port()]
    policy["pools"]["local-sim"]["workers"] = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    policy["pools"]["local-embed"]["workers"] = [f"http://127.0.0.1:{ports[2]}"]
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    gateway_port = free_port()
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "gateway", "up", "--policy", str(path), "--port",
                               str(gateway_port), "--data-dir", str(tmp_path / "data")], cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        assert wait_for(lambda: _ready(url), timeout=90), (tmp_path / "up.log").read_text()
        banner = (tmp_path / "up.log").read_text()
        assert f"{url}/v1" in banner and "tg-demo-key-change-me" in banner
        for token in ("tg-admin-demo-change-me", FINANCE, "tg-demo-premium-change-me", f"{url}/reports"):
            assert token in banner, (token, banner)
        workers = set().union(*(_pids_of(f"workers.sim --port {p}") for p in ports))
        assert len(workers) == 3
        client = openai.OpenAI(base_url=url + "/v1", api_key="tg-demo-key-change-me", max_retries=0)
        answer = client.chat.completions.create(model="sim-llama-8b", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3)
        assert answer.usage is not None and answer.usage.completion_tokens == 3
        _embeddings(client, url)
        _responses(client, url)
        _cached_with_the_clients_defaults(client, url)
        up.send_signal(signal.SIGTERM)
        up.wait(20)
        assert wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=10), "workers outlived `up`"
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)


def _embeddings(client: openai.OpenAI, url: str) -> None:
    """The official client's embeddings (it asks for base64 and decodes it) through the embedded default: an
    embedding model listed, priced in the ledger, the same input answered again from the cache."""
    assert any("embed" in m.id for m in client.models.list().data)
    texts = ["The invoice is overdue.", "Where is my parcel?"]
    raw = client.embeddings.with_raw_response.create(model="sim-embed-small", input=texts,
                                                     extra_headers={"x-request-id": "embed-first"})
    first = raw.parse()
    assert [len(d.embedding) for d in first.data] == [384, 384] and first.usage.prompt_tokens > 0
    assert raw.headers["x-tollgate-cache"] == "miss"
    again = client.embeddings.with_raw_response.create(model="sim-embed-small", input=texts)
    assert again.headers["x-tollgate-cache"] == "hit-exact"
    assert [d.embedding for d in again.parse().data] == [d.embedding for d in first.data]
    other = client.embeddings.create(model="sim-embed-small", input=texts[:1], dimensions=64)
    assert len(other.data[0].embedding) == 64
    try:
        client.chat.completions.create(model="sim-embed-small", messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("a chat request to an embedding model was answered")
    except openai.BadRequestError as exc:
        assert exc.code == "model_not_supported"
    records = ledger_records(url, FINANCE, count=3, endpoint="embeddings")
    assert len(records) == 3
    fresh = next(r for r in records if r["request_id"] == "embed-first")
    assert fresh["cache"] == "miss" and sum(r["cache"] == "hit-exact" for r in records) == 1
    assert fresh["prompt_tokens"] == first.usage.prompt_tokens and fresh["completion_tokens"] == 0
    assert float(fresh["cost_usd"]) > 0  # type: ignore[arg-type]


def _cached_with_the_clients_defaults(client: openai.OpenAI, url: str) -> None:
    """The demo tenant is an FAQ service (cache answers: any_temperature): the official client with its defaults
    (no temperature) asking a question again is answered from the cache; the personalised demo-premium never."""
    def asked(key_client: openai.OpenAI) -> str:
        raw = key_client.chat.completions.with_raw_response.create(
            model="sim-llama-8b", messages=[{"role": "user", "content": "What are your opening hours?"}])
        return raw.headers["x-tollgate-cache"]
    assert asked(client).split(";")[0] == "miss"  # with the nearest of the tenant's entries ("hi", above)
    assert wait_for(lambda: asked(client) == "hit-exact", timeout=10), "the answer is stored after it is sent"
    other = openai.OpenAI(base_url=url + "/v1", api_key="tg-demo-premium-change-me", max_retries=0)
    assert asked(other) == "bypass; reason=tenant_opt_out"


def _responses(client: openai.OpenAI, url: str) -> None:
    """The official client's Responses API, streamed, through two workers: each follow-up reaches the worker
    holding its previous response (the simulator, like vLLM, answers 404 anywhere else), the tier's max_tokens
    policy applies as max_output_tokens, and the ledger counts the usage the final event carried."""
    events = list(client.responses.create(model="sim-llama-8b", input="Tell me about invoices.", stream=True,
                                          max_output_tokens=6, extra_body={"ignore_eos": True},
                                          extra_headers={"x-request-id": "resp-first"}))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds.count("response.output_text.delta") == 6
    final = events[-1].response  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.output_tokens == 6
    previous = final.id
    for turn in range(4):  # two workers: an unpinned follow-up would miss half the time
        follow = client.responses.with_raw_response.create(model="sim-llama-8b", input=f"And then {turn}?",
                                                           previous_response_id=previous)
        assert follow.headers["x-tollgate-max-tokens"] == "default; value=512"
        previous = follow.parse().id
    assert client.responses.retrieve(previous).id == previous
    other = openai.OpenAI(base_url=url + "/v1", api_key="tg-demo-premium-change-me", max_retries=0)
    for call in (lambda: other.responses.retrieve(previous),
                 lambda: other.responses.create(model="sim-llama-8b", input="x", previous_response_id=previous),
                 lambda: client.responses.create(model="sim-llama-8b", input="x", previous_response_id="resp_x")):
        try:
            call()
            raise AssertionError("another tenant's, or an unknown, response was found")
        except openai.NotFoundError as exc:
            assert exc.code == "response_not_found"
    records = ledger_records(url, FINANCE, request_id="resp-first")
    assert records[0]["endpoint"] == "responses" and records[0]["completion_tokens"] == 6
    assert records[0]["prompt_tokens"] == final.usage.input_tokens and not records[0]["estimated"]


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
