"""The cache audit, measured (python -m loadtest run cache_audit).

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
3. the audit's own error (``--only error``, offline, no process): the labelled pairs' tuning half
   (loadtest/data/cache_pairs*.yaml; a pair is tuning when the sha256 of "a\\nb" is even), each judged by the
   audit's re-asks (``gateway.batches.audit.reask``) with the real embedder, the cached question ``a`` answered
   and the hit asked as ``b``. Engines: the simulator (its answers, as it writes them); a rewording engine (the
   simulator's answer with a quarter of its words chosen by the question's exact text: a real engine's
   temperature-0 rewording); a random-weights stand-in (an answer seeded by the exact text: nothing shared
   between two wordings). Reported per engine and language: paraphrase hits judged wrong (false alarms; among
   all paraphrase pairs and among those the cache serves at the policy's threshold with its verifier) and
   near-miss hits not judged wrong (missed), with what was concluded instead. ``--only vllm``: the same on
   tests/vllm's tiny random-weights Llama on the CPU (40 pairs of each kind a language).
4. make up (``--only demo``): the default policy with simulated workers, 40 paraphrase hits, /admin/cache.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import itertools
import json
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import yaml
from aiohttp import web

from gateway.auth import hash_key
from gateway.batches.audit import GAP, SHARE, UNRELATED, Outcome, reask
from gateway.cache.service import _AUDIT_CHARS as AUDIT_CHARS
from gateway.policy.schema import CachePolicy
from loadtest.harness.fixtures import BENCH_KEY as KEY
from loadtest.harness.procs import start_gateway, start_sim
from loadtest.harness.questions import questions, rephrase
from loadtest.harness.stats import percentile
from workers.sim import tokenizer
from workers.sim.engine import EngineConfig
from workers.sim.params import plan
from workers.sim.tokenizer import WORDS, next_piece, output_rng

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
CONTROLS = dict(zip(UNRELATED, ("Water evaporates, condenses into clouds and falls as rain, snow or hail.",
                                 "월요일에는 두부 샐러드, 화요일에는 채소 카레를 드세요."), strict=True))
SOLD = "Selling is a payout: the dollars reach your linked bank account in one to three business days, minus a fee."


def policy(worker: str, cache: dict[str, Any], **pool: Any) -> dict[str, Any]:
    return {"server": {"admin_token_sha256": "sha256:" + hash_key(ADMIN)},
            "tenants": {"bench": {"tier": "standard", "keys": ["sha256:" + hash_key(KEY)]}},
            "models": {MODEL: {"pool": "p"}}, "pools": {"p": {"workers": [worker], **pool}},
            "cache": {"enabled": True, "max_entries_per_tenant": 100_000, **cache}}


class TableWorker:
    """A worker that answers each question from a table, after an engine's pace (50 ms), and logs what it is asked."""

    def __init__(self) -> None:
        self.table: dict[str, str] = dict(CONTROLS)
        self.asked: list[dict[str, Any]] = []

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.asked.append({"question": body["messages"][-1]["content"], "temperature": body.get("temperature"),
                           "at": time.monotonic()})
        await asyncio.sleep(0.05)
        # whitespace and a courtesy change nothing
        answer = self.table[" ".join(body["messages"][-1]["content"].split()).removeprefix("Please, ")]
        return web.json_response({"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 20, "total_tokens": 29}})

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
                    worker.table = {ASKED: WRONG, **dict.fromkeys(PARAPHRASES, RIGHT), **CONTROLS}
                    first, asked = await ask(ASKED), PARAPHRASES
                    worker.table[ASKED] = RIGHT
                else:
                    worker.table = {ASKED: RIGHT, SELL: SOLD, **CONTROLS}
                    first, asked = await ask(ASKED), [SELL] * 10
                assert first.status_code == 200
                await asyncio.sleep(1.0)  # the answer is stored after it is sent
                started, served_wrong, results = time.monotonic(), 0, []
                for q in asked:
                    r = await ask(q)
                    results.append(outcome(r.headers.get("x-tollgate-cache", "")))
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


def outcome(header: str) -> str:
    """The outcome of ``x-tollgate-cache: <outcome>[; key=value]`` ("miss", "hit-semantic", ...)."""
    return header.split(";", 1)[0].strip()


async def stream(session: aiohttp.ClientSession, url: str, q: str) -> tuple[float | None, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 16, "temperature": 0,
            "stream": True}
    started, ttft = time.perf_counter(), None
    async with session.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}) as r:
        async for line in r.content:
            if ttft is None and line.startswith(b"data:"):
                ttft = time.perf_counter() - started
        return ttft, outcome(r.headers.get("x-tollgate-cache", ""))


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


# -- 3. the audit's own error -------------------------------------------------------------------------------

DATA = Path(__file__).resolve().parents[2] / "data"
ANSWER_TOKENS = 60
Engine = Callable[[str], str]


def tuning(a: str, b: str) -> bool:
    """The pair is in the tuning half (the test half is read once, at the end)."""
    return hashlib.sha256(f"{a}\n{b}".encode()).digest()[-1] % 2 == 0


def labelled(half: Callable[[str, str], bool] = tuning) -> dict[str, list[tuple[str, str, bool]]]:
    """(a, b, right) per language: paraphrases (a hit is right) and near misses (a hit is wrong) of one half."""
    out: dict[str, list[tuple[str, str, bool]]] = {}
    for language, name in (("en", "cache_pairs.yaml"), ("ko", "cache_pairs_ko.yaml")):
        doc = yaml.safe_load((DATA / name).read_text())
        rows = [(a, b, True) for k in doc if k.startswith("paraphrase") for a, b in doc[k]]
        rows += [(a, b, False) for pairs in doc["near_miss"].values() for a, b in pairs]
        out[language] = [row for row in rows if half(row[0], row[1])]
    return out


def sim_engine(question: str) -> str:
    """The simulator's temperature-0 answer to a question, as its server writes it."""
    _, _, choices = plan({"model": MODEL, "messages": [{"role": "user", "content": question}],
                          "max_tokens": ANSWER_TOKENS, "temperature": 0}, True, EngineConfig())
    seq = choices[0].seq
    return "".join(next_piece(seq.rng, seq.topic) for _ in range(ANSWER_TOKENS))


def rewording_engine(question: str) -> str:
    """The simulator's answer, a quarter of its words chosen by the question's exact text: the same answer in
    other words for another wording of the question."""
    rng = output_rng(7, question)
    pieces = tokenizer.pieces(sim_engine(question))
    return "".join(" " + WORDS[int(rng.random() * len(WORDS))] if rng.random() < 0.25 else p for p in pieces)


def random_engine(question: str) -> str:
    """A random-weights model's stand-in: its answer seeded by the exact text, nothing shared between wordings."""
    rng = output_rng(11, question)
    return "".join(next_piece(rng) for _ in range(ANSWER_TOKENS))


ENGINES: dict[str, Engine] = {"simulator": sim_engine, "rewording": rewording_engine, "random": random_engine}


def embedding_agreement(embedder: Any) -> Callable[[str, str], Awaitable[float]]:
    """The audit's agreement (``SemanticCache.agreement``) over an embedder's batch API, vectors kept."""
    vectors: dict[str, np.ndarray] = {}

    async def agreement(a: str, b: str) -> float:
        if a.strip() == b.strip():
            return 1.0
        missing = [t[:AUDIT_CHARS] for t in (a, b) if t[:AUDIT_CHARS] not in vectors]
        for text, vector in zip(missing, embedder.embed_many(missing), strict=True):
            vectors[text] = vector
        return float(np.dot(vectors[a[:AUDIT_CHARS]], vectors[b[:AUDIT_CHARS]]))
    return agreement


async def judged(engine: Engine, a: str, b: str, agreement: Callable[[str, str], Awaitable[float]]) -> Outcome:
    """The audit's outcome for a hit that served ``a``'s answer to ``b``."""
    async def ask(question: str | None) -> str | None:
        return engine(b if question is None else question)
    result = await reask(engine(a), a, ask, agreement)
    assert result is not None
    return result[0]


def test_half(a: str, b: str) -> bool:
    return not tuning(a, b)


async def error(engines: dict[str, Engine] = ENGINES, half: str = "tuning") -> dict[str, Any]:
    from gateway.cache.embedder import E5Embedder
    from gateway.cache.verifier import verify

    spec = CachePolicy(enabled=True)
    embedder = E5Embedder()
    try:
        agreement = embedding_agreement(embedder)
        out: dict[str, Any] = {"gap": GAP, "share": SHARE, "threshold": spec.threshold, "half": half}
        for language, rows in labelled(tuning if half == "tuning" else test_half).items():
            questions = sorted({q for a, b, _ in rows for q in (a, b)})
            vec = dict(zip(questions, embedder.embed_many(questions), strict=True))
            served = {(a, b) for a, b, _ in rows
                      if float(np.dot(vec[a], vec[b])) >= spec.threshold and verify(b, a) is None}
            for name, engine in engines.items():
                counts: dict[str, Any] = {"paraphrase": collections.Counter(), "paraphrase_served":
                                          collections.Counter(), "near_miss": collections.Counter()}
                for a, b, right in rows:
                    outcome = (await judged(engine, a, b, agreement)).value
                    counts["paraphrase" if right else "near_miss"][outcome] += 1
                    if right and (a, b) in served:
                        counts["paraphrase_served"][outcome] += 1
                para, hits, near = counts["paraphrase"], counts["paraphrase_served"], counts["near_miss"]
                out[f"{language}/{name}"] = {
                    "paraphrase": dict(para), "false_alarms": f"{para['wrong']}/{sum(para.values())}",
                    "paraphrase_served": dict(hits), "false_alarms_served": f"{hits['wrong']}/{sum(hits.values())}",
                    "near_miss": dict(near),
                    "missed": f"{sum(near.values()) - near['wrong'] - near['stale']}/{sum(near.values())}"}
        return out
    finally:
        embedder.close()


def vllm_engine(url: str) -> Engine:
    """A real vLLM's temperature-0 answers (40 tokens), each question asked once."""
    client, answers = httpx.Client(base_url=url, timeout=120), {}

    def engine(question: str) -> str:
        if question not in answers:
            r = client.post("/v1/chat/completions", json={"model": "tiny-llama", "temperature": 0, "max_tokens": 40,
                                                          "messages": [{"role": "user", "content": question}]})
            r.raise_for_status()
            answers[question] = r.json()["choices"][0]["message"]["content"]
        return answers[question]
    return engine


async def on_vllm(tmp: Path, per_kind: int = 40) -> dict[str, Any]:
    """The audit on tests/vllm's tiny random-weights Llama on the CPU: ``per_kind`` paraphrase and near-miss
    pairs a language of the tuning half; what it concludes."""
    from gateway.cache.embedder import E5Embedder
    from workers.vllm.cpu import start_vllm_cpu

    server = await asyncio.to_thread(start_vllm_cpu, max_model_len=1024, log_path=tmp / "vllm.log")
    embedder = E5Embedder()
    try:
        engine, agreement = vllm_engine(f"http://127.0.0.1:{server.port}"), embedding_agreement(embedder)
        out: dict[str, Any] = {}
        for language, rows in labelled().items():
            for kind, right in (("paraphrase", True), ("near_miss", False)):
                chosen = [row for row in rows if row[2] is right][:per_kind]
                counts = collections.Counter([(await judged(engine, a, b, agreement)).value for a, b, _ in chosen])
                out[f"{language}/{kind}"] = dict(counts)
        return out
    finally:
        embedder.close()
        server.stop()


# -- 4. make up ------------------------------------------------------------------------------------------------

POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
DEMO_KEY = "tg-demo-key-change-me"
DEMO_ADMIN = "tg-admin-demo-change-me"


def merged(a: str, b: str) -> bool:
    """The simulator gives the two the same answer (it sees through their wording)."""
    return sim_engine(a) == sim_engine(b)


async def demo(tmp: Path, only_merged: bool) -> dict[str, Any]:
    """The default policy with simulated workers (what ``make up`` runs, on free ports): the tuning half's
    paraphrase pairs asked one after the other (``a``, then ``b``: a semantic hit when the cache serves it) until
    40 hits, English and Korean interleaved, every hit audited (each entry's first); then /admin/cache once the
    audits are done."""
    doc = yaml.safe_load(await asyncio.to_thread(POLICY.read_text))
    sims = []
    for name, model in doc["models"].items():
        pool = doc["pools"][model["pool"]]
        flags = ("--runner", "pooling") if model.get("kind") == "embed" else ()
        started = [start_sim(tmp, *flags, model=name) for _ in pool["workers"]]
        sims += started
        pool["workers"] = [p.url for p in started]
    doc.get("state", {}).pop("redis_url", None)
    gw = start_gateway(tmp, doc, timeout=180)
    pairs = labelled()
    rows = [row for lang in itertools.zip_longest(pairs["en"], pairs["ko"]) for row in lang if row and row[2]]
    if only_merged:
        rows = [row for row in rows if merged(row[0], row[1])]
    try:
        headers = {"authorization": f"Bearer {DEMO_KEY}"}
        hits: collections.Counter[str] = collections.Counter()
        asked = 0
        async with httpx.AsyncClient(base_url=gw.url, timeout=60, headers=headers) as client:
            async def ask(q: str) -> str:
                r = await client.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 48})
                assert r.status_code == 200, r.text
                return outcome(r.headers.get("x-tollgate-cache", ""))
            for a, b, _ in rows:
                if sum(hits.values()) >= 40:
                    break
                await ask(a)
                await asyncio.sleep(0.3)  # the answer is stored after it is sent
                result = await ask(b)
                asked += 1
                if result.startswith("hit-semantic"):
                    hits["ko" if any("\uac00" <= ch <= "\ud7a3" for ch in b) else "en"] += 1
            admin = {"authorization": f"Bearer {DEMO_ADMIN}"}
            for _ in range(600):  # the audits run in idle capacity: wait until none waits
                status = (await client.get("/admin/cache", headers=admin)).json()
                if status["audit"]["pending"] == 0:
                    await asyncio.sleep(2.0)
                    status = (await client.get("/admin/cache", headers=admin)).json()
                    if status["audit"]["pending"] == 0:
                        break
                await asyncio.sleep(0.5)
            after = [await ask(b) for a, b, _ in rows[:3]]
        return {"pairs_asked": asked, "semantic_hits": dict(hits), "answers_after": after,
                "scopes": [s for s in status["scopes"] if s["tenant"] == "demo"], "audit": status["audit"]}
    finally:
        gw.stop()
        for sim in sims:
            sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="live-traffic requests per run")
    parser.add_argument("--rate", type=float, default=15.0, help="live-traffic requests per second")
    parser.add_argument("--only", choices=("planted", "live", "error", "demo", "vllm"),
                        help="one part (default: all but vllm, which needs vLLM on the CPU)")
    parser.add_argument("--half", choices=("tuning", "test"), default="tuning",
                        help="the labelled pairs' half the audit's error is measured on (the test half: once)")
    parser.add_argument("--out", default="loadtest/results/cache/audit.json")
    args = parser.parse_args()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "error"):
            result["error"] = asyncio.run(error(half=args.half))
        if args.only == "vllm":
            result["vllm"] = asyncio.run(on_vllm(Path(tmp)))
        if args.only in (None, "demo"):
            result["demo"] = {"all paraphrases": asyncio.run(demo(Path(tmp), False)),
                              "paraphrases the simulator answers alike": asyncio.run(demo(Path(tmp), True))}
        if args.only in (None, "planted"):
            result["planted"] = asyncio.run(planted(Path(tmp)))
        if args.only in (None, "live"):
            result["live"] = asyncio.run(live(Path(tmp), args.n, args.rate))
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
