"""The cache audit, measured (python -m loadtest.bench_cache_audit).

1. planted: a gateway process (cache on, the policy's default audit: every 10th hit of an entry, its first
   included) in front of a worker that answers each question from a table. The first answer to "How do I buy
   bitcoin on Coinbase?" is an answer to another question, and the cache keeps it; then paraphrases of the question
   arrive one after another. Reported: how many of them got the wrong answer before the audit purged it, how long
   that took, what the worker was asked again, and the scope's row in GET /admin/cache. Then a false match the
   verifier is turned off for (buying served for selling): the scope's threshold rises.
2. live traffic: a simulated worker of 4 sequences near capacity with standard-class streams, half of them
   paraphrases of stored questions (semantic hits, each audited: `every: 1`), half new; the same run with the
   audit off, each on a fresh worker. Reported: the TTFT p50/p95/p99 of the standard requests the cache did not
   answer (those the engine served) in each, and how many audits ran. The audits are batch work, granted only
   capacity the live classes leave.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from aiohttp import web

from gateway.auth import hash_key
from loadtest.bench_cache import KEY, questions
from loadtest.bench_cache_hog import rephrase
from loadtest.procs import start_gateway, start_sim
from loadtest.stats import percentile

MODEL = "sim-llama-8b"
ADMIN = "tg-bench-admin"
ASKED = "How do I buy bitcoin on Coinbase?"
PARAPHRASES = ["How can I buy bitcoin on Coinbase?", "how do i buy bitcoin on coinbase", "How do I buy Bitcoin on "
               "Coinbase?", "How do I purchase bitcoin on Coinbase?", "How can I buy bitcoin using Coinbase?",
               "What's the way to buy bitcoin on Coinbase?", "How do you buy bitcoin on Coinbase?",
               "How should I buy bitcoin on Coinbase?", "How do I buy bitcoin on Coinbase ?",
               "Buying bitcoin on Coinbase: how do I do it?"] * 3
RIGHT = "Open the Coinbase app, choose Buy, pick bitcoin, enter an amount and confirm the purchase."
WRONG = "Paris is the capital of France, on the Seine, with about two million people."
SELL = "How do I sell bitcoin on Coinbase?"
SOLD = "Selling is a payout: the dollars reach your linked bank account in one to three business days, minus a fee."


def policy(worker: str, cache: dict[str, Any], **pool: Any) -> dict[str, Any]:
    return {"server": {"admin_token_sha256": "sha256:" + hash_key(ADMIN)},
            "tenants": {"bench": {"tier": "standard", "keys": ["sha256:" + hash_key(KEY)]}},
            "models": {MODEL: {"pool": "p"}}, "pools": {"p": {"workers": [worker], **pool}},
            "cache": {"enabled": True, "max_entries_per_tenant": 100_000, **cache}}


class TableWorker:
    """A worker that answers each question from a table, after an engine's pace (50 ms), and logs what it is asked."""

    def __init__(self) -> None:
        self.table: dict[str, str] = {}
        self.asked: list[dict[str, Any]] = []

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.asked.append({"question": body["messages"][-1]["content"], "temperature": body.get("temperature"),
                           "at": time.monotonic()})
        await asyncio.sleep(0.05)
        return web.json_response({"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "message": {"role": "assistant", "content": self.table[body["messages"][-1]["content"]]},
             "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 20, "total_tokens": 29}})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_get("/health", lambda r: web.Response(text=""))
        app.router.add_get("/metrics", lambda r: web.Response(text="vllm:num_requests_running 0\n"
                                                                       "vllm:num_requests_waiting 0\n"))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


async def planted(tmp: Path) -> dict[str, Any]:
    worker = TableWorker()
    url = await worker.start()
    out: dict[str, Any] = {}
    # the false match at 0.95 (buying against selling: cosine 0.979, under e5's default 0.98)
    for case, cache in (("planted wrong answer", {}), ("false match, verifier off", {"verifier": False,
                                                                                     "threshold": 0.95})):
        gw = await asyncio.to_thread(start_gateway, tmp, policy(url, cache), timeout=120)
        try:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30,
                                         headers={"authorization": f"Bearer {KEY}"}) as client:
                async def ask(q: str) -> httpx.Response:
                    return await client.post("/v1/chat/completions", json={
                        "model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 32,
                        "temperature": 0})
                if case.startswith("planted"):
                    worker.table = {ASKED: WRONG, **dict.fromkeys(PARAPHRASES, RIGHT)}
                    first, asked = await ask(ASKED), PARAPHRASES
                    worker.table[ASKED] = RIGHT
                else:
                    worker.table = {ASKED: RIGHT, SELL: SOLD}
                    first, asked = await ask(ASKED), [SELL] * 10
                assert first.status_code == 200
                await asyncio.sleep(1.0)  # the answer is stored after it is sent
                started, served_wrong, results = time.monotonic(), 0, []
                for q in asked:
                    r = await ask(q)
                    results.append(r.headers.get("x-tollgate-cache"))
                    text = r.json()["choices"][0]["message"]["content"]
                    served_wrong += text != worker.table[q]
                    await asyncio.sleep(0.2)
                status = (await client.get("/admin/cache", headers={"authorization": f"Bearer {ADMIN}"})).json()
            out[case] = {"asked": len(asked), "served_wrong": served_wrong, "results": results,
                         "asked_of_the_worker_after_the_plant": [a["question"] for a in worker.asked
                                                       if a["temperature"] == 0 and a["at"] > started][:4],
                         "admin_cache": status}
        finally:
            gw.stop()
    return out


async def stream(session: aiohttp.ClientSession, url: str, q: str) -> tuple[float | None, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 16, "temperature": 0,
            "stream": True}
    started, ttft = time.perf_counter(), None
    async with session.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}) as r:
        async for line in r.content:
            if ttft is None and line.startswith(b"data:"):
                ttft = time.perf_counter() - started
        return ttft, r.headers.get("x-tollgate-cache", "")


async def live(tmp: Path, n: int, rate: float) -> dict[str, Any]:
    """Each run on a fresh simulated worker: an engine that has seen the prompts answers sooner from its prefix
    cache, and then the lookups lose their race more often (seen: 53 semantic hits in the first run, 8 in the
    second, on one worker)."""
    out: dict[str, Any] = {}
    for name, audit in (("audit on (every hit)", {"every": 1, "max_pending": 10_000}),
                        ("audit off", {"enabled": False})):
        sim = start_sim(tmp, "--max-num-seqs", "4")
        gw = start_gateway(tmp, policy(sim.url, {"audit": audit}), timeout=120)
        try:
            stored = questions(n // 2, 31)
            async with httpx.AsyncClient(timeout=30) as client:
                for q in stored:
                    await client.post(gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                                      json={"model": MODEL, "messages": [{"role": "user", "content": q}],
                                            "max_tokens": 16, "temperature": 0})
            await asyncio.sleep(2.0)
            items = [rephrase(q) for q in stored] + questions(n // 2, 41)
            random.Random(5).shuffle(items)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                start, tasks = time.perf_counter(), []
                for i, q in enumerate(items):
                    delay = start + i / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.ensure_future(stream(session, gw.url, q)))
                rows = await asyncio.gather(*tasks)
            results: dict[str, int] = {}
            for _, kind in rows:
                results[kind] = results.get(kind, 0) + 1
            misses = [t for t, kind in rows if t is not None and kind == "miss"]
            async with httpx.AsyncClient(timeout=30) as client:
                status = (await client.get(gw.url + "/admin/cache",
                                           headers={"authorization": f"Bearer {ADMIN}"})).json()
            out[name] = {"n": len(rows), "results": results,
                         **{f"miss_ttft_p{p}_ms": round(percentile(misses, p) * 1000, 1) for p in (50, 95, 99)},
                         "audited_during_run": status["audit"]["audited"],
                         "pending_after": status["audit"]["pending"]}
        finally:
            gw.stop()
            sim.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="live-traffic requests per run")
    parser.add_argument("--rate", type=float, default=15.0, help="live-traffic requests per second")
    parser.add_argument("--out", default="loadtest/results/cache-audit.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"planted": asyncio.run(planted(Path(tmp))), "live": asyncio.run(live(Path(tmp), args.n, args.rate))}
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
