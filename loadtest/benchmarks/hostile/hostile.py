"""A hostile tenant's probes against money and batches (python -m loadtest run hostile).

1. Spend against a $0.002 budget (and a tokens-per-minute limit) under 100 concurrent requests of each kind:
   ordinary, n=128, a 64-prompt list, punctuation near one token a byte. The upstream is a fake engine that
   answers at once and reports the most a real one could: every prompt byte a token, max_tokens for every
   sequence. Prints spend / budget from the ledger, and tokens / TPM.
2. A 20 MB batch input file of one line of ``{}`` elements: the gateway's memory growth and the slowest
   /healthz answer while it validates the file.
3. 1,100 requests refused by the cost-anomaly rule: how many webhooks a local receiver gets.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web

from loadtest.harness.fixtures import DEMO_KEY, FINANCE_TOKEN
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import free_port, start_gateway

MODEL = "sim-llama-8b"
TPM = 10_000


def worst_usage(body: dict[str, Any]) -> dict[str, int]:
    """What a real engine could report for this body at most."""
    if "messages" in body:
        prompt = sum(len(orjson.dumps(m.get("content"))) for m in body["messages"])
        prompts = 1
    else:
        given = body["prompt"]
        listed = given if isinstance(given, list) and given and not isinstance(given[0], int) else [given]
        prompt, prompts = sum(len(orjson.dumps(p)) for p in listed), len(listed)
    sequences = prompts * max(body.get("n") or 1, body.get("best_of") or 1)
    completion = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16) * sequences
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def fake_engine(port: int, received: list[int]) -> web.AppRunner:
    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(1)
        usage = worst_usage(body)
        return web.json_response({"id": "x", "object": "chat.completion", "model": MODEL, "created": 0,
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                               "finish_reason": "length"}], "usage": usage})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.post("/v1/chat/completions", complete), web.post("/v1/completions", complete),
                    web.get("/health", health), web.get("/metrics", health)])
    return web.AppRunner(app)


def serve(runner_of: Any, port: int) -> None:
    async def main() -> None:
        runner = runner_of
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()
    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()


def ledger(gw_url: str) -> list[dict[str, Any]]:
    return httpx.get(gw_url + "/admin/ledger", params={"format": "json"}, timeout=60,
                     headers={"authorization": f"Bearer {FINANCE_TOKEN}"}).json()["data"]


async def burst(url: str, body: dict[str, Any]) -> list[int]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100)) as client:
        replies = await asyncio.gather(*(client.post(url, json=body, headers={
            "authorization": f"Bearer {DEMO_KEY}"}) for _ in range(100)))
    return [r.status_code for r in replies]


def spend_probe(tmp: Path, engine_url: str) -> None:
    kinds = {
        "ordinary": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 16,
                                              "messages": [{"role": "user", "content": "What is a queue?"}]}),
        "n=128": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 16, "n": 128,
                                           "messages": [{"role": "user", "content": "What is a queue?"}]}),
        "64 prompts": ("/v1/completions", {"model": MODEL, "max_tokens": 16, "prompt": ["What is a queue?"] * 64}),
        "punctuation": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 16,
                                                 "messages": [{"role": "user", "content": "!?." * 600}]}),
    }
    for name, (path, body) in kinds.items():
        policy = build_policy([engine_url])
        policy["prices"]["class_multipliers"] = {}
        policy["tenants"]["demo"]["budget"] = {"limit_usd": 0.002, "period": "day"}
        policy["tenants"]["demo"]["rate_limit"] = {"tokens_per_minute": TPM}
        policy["tenants"]["demo"]["anomaly"] = {"k": 1e9}
        policy["scheduling"] = {"tiers": {"standard": {"max_queue_wait_ms": 60_000}}}
        gw = start_gateway(tmp, policy)
        try:
            statuses = asyncio.run(burst(gw.url + path, body))
            time.sleep(1.0)  # the ledger writer flushes every 0.1 s
            rows = ledger(gw.url)
            spent = sum(r["cost_usd"] for r in rows)
            tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
            print(f"{name:12s} ok {statuses.count(200):3d}/100  spend {spent / 0.002:5.2f}x the budget  "
                  f"tokens {tokens / TPM:5.2f}x the TPM")
        finally:
            gw.kill()


def memory_probe(tmp: Path, engine_url: str) -> None:
    policy = build_policy([engine_url])
    gw = start_gateway(tmp, policy)
    try:
        line = (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"a": ['
                + b"{}," * 7_000_000 + b"{}]}}\n")
        rss = lambda: int(Path(f"/proc/{gw.pid}/status").read_text().split("VmRSS:")[1].split()[0]) * 1024  # noqa: E731
        before = rss()
        client = httpx.Client(base_url=gw.url, timeout=120, headers={"authorization": f"Bearer {DEMO_KEY}"})
        uploaded = client.post("/v1/files", files={"file": ("bomb.jsonl", io.BytesIO(line))},
                               data={"purpose": "batch"}).json()
        worst, peak = 0.0, 0
        batch = client.post("/v1/batches", json={"input_file_id": uploaded["id"], "completion_window": "24h",
                                                 "endpoint": "/v1/chat/completions"}).json()
        deadline = time.monotonic() + 120
        status = batch["status"]
        while status == "validating" and time.monotonic() < deadline:
            started = time.perf_counter()
            httpx.get(gw.url + "/healthz", timeout=60)
            worst = max(worst, time.perf_counter() - started)
            peak = max(peak, rss())
            status = client.get(f"/v1/batches/{batch['id']}").json()["status"]
            time.sleep(0.01)
        print(f"a {len(line) / 1e6:.0f} MB one-line file: batch {status}; gateway memory "
              f"+{(peak - before) / 1e6:.0f} MB at most; slowest /healthz {worst * 1000:.0f} ms")
    finally:
        gw.kill()


def alert_probe(tmp: Path, engine_url: str) -> None:
    hooks: list[int] = []
    port = free_port()

    async def hook(request: web.Request) -> web.Response:
        hooks.append(1)
        return web.Response(text="ok")
    app = web.Application()
    app.add_routes([web.post("/hook", hook)])
    serve(web.AppRunner(app), port)
    policy = build_policy([engine_url])
    policy["spend"] = {"webhook_url": f"http://127.0.0.1:{port}/hook"}
    policy["tenants"]["demo"]["anomaly"] = {"k": 2, "action": "reject", "default_baseline_usd": 0.000001}
    gw = start_gateway(tmp, policy)
    try:
        body = {"model": MODEL, "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=30) as client:
            codes = [client.post(gw.url + "/v1/chat/completions", json=body,
                                 headers={"authorization": f"Bearer {DEMO_KEY}"}).status_code for _ in range(1_100)]
        time.sleep(2.0)  # deliveries are in the background
        alerts = httpx.get(gw.url + "/admin/anomalies", timeout=30,
                           headers={"authorization": "Bearer tg-test-admin-token"}).json()["data"]
        print(f"1,100 refused requests ({codes.count(400)} answered 400): {len(alerts)} alert(s) listed, "
              f"count {alerts[0]['count'] if alerts else 0}; {len(hooks)} webhook(s) received")
    finally:
        gw.kill()


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    port, received = free_port(), []
    serve(fake_engine(port, received), port)
    engine_url = f"http://127.0.0.1:{port}"
    spend_probe(tmp, engine_url)
    memory_probe(tmp, engine_url)
    alert_probe(tmp, engine_url)


if __name__ == "__main__":
    main()
