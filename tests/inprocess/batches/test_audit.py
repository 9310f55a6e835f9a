"""The semantic layer beside the request, and the audit of its hits, through the pipeline with the real embedder
(multilingual-e5-small, on a thread of this process) and a worker over loopback that answers each question from a
table the test sets: a wrong answer planted in the cache is found by the audit and purged; a false match raises
its scope's threshold; a right hit is kept; a semantic hit that comes first calls off the worker's request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from gateway.batches.audit import UNRELATED, CacheAuditor, reframed, reworded
from gateway.cache.audit import Verdict
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from gateway.runtime import Gateway
from tests.conftest import policy_dict
from tests.fakes import MODEL, FakeWorker, call, inflight

ASKED = "How do I buy bitcoin on Coinbase?"
PARAPHRASE = "How can I buy bitcoin on Coinbase?"
RIGHT = "Open the Coinbase app, choose Buy, pick bitcoin, enter an amount and confirm the purchase."
WRONG = "Paris is the capital of France, on the Seine, with about two million people."
SELL = "How do I sell bitcoin on Coinbase?"
OTHER = ("Water evaporates, condenses into clouds and falls as rain, snow or hail.",
         "월요일에는 두부 샐러드, 화요일에는 채소 카레를 드세요.")  # the engine's answers to the audit's controls
SOLD = "Selling is a payout: the dollars reach your linked bank account in one to three business days, minus a fee."


class Answers:
    """The worker's table: question -> (answer, seconds before answering)."""

    def __init__(self) -> None:
        self.table: dict[str, tuple[str, float]] = {q: (a, 0.0) for q, a in zip(UNRELATED, OTHER, strict=True)}
        self.bodies: list[dict[str, Any]] = []
        self.called_off = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        asked = " ".join(body["messages"][-1]["content"].split()).removeprefix("Please, ")
        text, delay = self.table[asked]  # whitespace and a courtesy change nothing
        try:
            await asyncio.sleep(delay)  # the engine's time (the worker's, not the test's synchronisation)
        except asyncio.CancelledError:
            self.called_off.set()
            raise
        return web.json_response({"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}})


def ask(question: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0}


@contextlib.asynccontextmanager
async def gateway(answers: Answers, **cache: Any) -> AsyncIterator[tuple[Gateway, FakeWorker]]:
    async with FakeWorker(answers.handle) as worker:
        doc = policy_dict([worker.url])
        doc["cache"] = {"enabled": True, "audit": {"every": 1}, **cache}
        gw = Gateway(PolicyStore(PolicySnapshot.build(Policy.model_validate(doc), "test")))
        async with gw.lifespan():
            yield gw, worker


async def stored(gw: Gateway, question: str) -> None:
    """Ask, and wait until the answer is stored with its vector (storing runs after the answer)."""
    ctx, sink = await call(gw, ask(question))
    assert sink.status == 200 and ctx.cache == "miss"
    assert gw.cache is not None
    while gw.cache._tasks:
        await asyncio.wait(set(gw.cache._tasks))


def test_a_planted_wrong_answer_is_found_by_the_audit_purged_and_counted_against_its_scope() -> None:
    async def main() -> None:
        answers = Answers()
        answers.table[ASKED] = (WRONG, 0.0)  # the cache keeps an answer to another question
        async with gateway(answers) as (gw, _):
            await stored(gw, ASKED)
            answers.table[PARAPHRASE] = answers.table[ASKED] = (RIGHT, 1.0)
            ctx, sink = await call(gw, ask(PARAPHRASE))
            assert ctx.cache == "hit-semantic", "served from the cache (wrongly): the audit's case"
            assert orjson.loads(b"".join(sink.chunks))["choices"][0]["message"]["content"] == WRONG
            assert gw.cache is not None and len(gw.cache.audits.pending) == 1
            sample = gw.cache.audits.pending.popleft()
            answers.table[PARAPHRASE] = answers.table[ASKED] = (RIGHT, 0.0)
            verdict = await CacheAuditor(gw).audit(sample)
            assert verdict is Verdict.STALE, "the entry does not answer its own question either"
            hit_ask = answers.bodies[-6]
            assert hit_ask["messages"][-1]["content"] == PARAPHRASE, "the hit first"
            assert sorted(b["messages"][-1]["content"] for b in answers.bodies[-5:]) == sorted(
                [ASKED, reworded(ASKED), reframed(ASKED), *UNRELATED]), "then, together, its own question, two "\
                "rewordings, the controls"
            assert hit_ask["temperature"] == 0 and "stream" not in hit_ask
            spec = gw.store.current.policy.cache
            (scope,) = gw.cache.audits.report(spec.audit, spec.threshold)
            assert scope["disagreed"] == 1 and scope["upper_bound"] > spec.audit.max_false_hit_rate
            assert scope["threshold"] == spec.threshold, "a higher one would not keep a wrong entry from a paraphrase"
            ctx, _ = await call(gw, ask(PARAPHRASE))
            assert ctx.cache == "miss" and answers.bodies[-1]["messages"][-1]["content"] == PARAPHRASE, \
                "the wrong entry is gone"
            ran = gw.metrics.registry.get_sample_value("tollgate_requests_total",
                                                       {"tier": "batch", "model": MODEL, "status": "200"})
            assert ran == 6, "every re-ask ran as batch work (the hit, the own question, 2 rewordings, 2 controls)"
            assert gw.metrics.registry.get_sample_value(
                "tollgate_cache_audits_total", {"tenant": "demo", "model": MODEL, "verdict": "stale"}) == 1
    asyncio.run(main())


def test_a_false_match_raises_its_scopes_threshold_past_the_hits_similarity() -> None:
    async def main() -> None:
        answers = Answers()
        answers.table[ASKED] = (RIGHT, 0.0)
        # the verifier would refuse buying for selling (cosine 0.979)
        async with gateway(answers, verifier=False, threshold=0.95) as (gw, _):
            await stored(gw, ASKED)
            answers.table[SELL] = (SOLD, 1.0)
            ctx, _ = await call(gw, ask(SELL))
            assert ctx.cache == "hit-semantic" and gw.cache is not None
            answers.table[SELL] = (SOLD, 0.0)
            sample = gw.cache.audits.pending.popleft()
            assert await CacheAuditor(gw).audit(sample) is Verdict.RAISED, "1 of 1 wrong: the bound is past 2%"
            (scope,) = gw.cache.audits.report(gw.store.current.policy.cache.audit, 0.95)
            assert scope["threshold"] == round(sample.similarity + 0.005, 4) > 0.95 and scope["semantic"]
            assert gw.metrics.registry.get_sample_value(
                "tollgate_cache_audit_threshold", {"tenant": "demo", "model": MODEL, "scope": sample.scope[:16]}) \
                == scope["threshold"]
    asyncio.run(main())


def test_a_right_hit_is_agreed_with_and_kept() -> None:
    async def main() -> None:
        answers = Answers()
        answers.table[ASKED] = (RIGHT, 0.0)
        async with gateway(answers) as (gw, _):
            await stored(gw, ASKED)
            answers.table[PARAPHRASE] = (RIGHT.replace("confirm the purchase", "confirm"), 1.0)
            ctx, _ = await call(gw, ask(PARAPHRASE))
            assert ctx.cache == "hit-semantic" and gw.cache is not None
            answers.table[PARAPHRASE] = (answers.table[PARAPHRASE][0], 0.0)
            assert await CacheAuditor(gw).audit(gw.cache.audits.pending.popleft()) is Verdict.AGREED
            answers.table[PARAPHRASE] = (answers.table[PARAPHRASE][0], 1.0)  # slower than the lookup again
            ctx, _ = await call(gw, ask(PARAPHRASE))
            assert ctx.cache == "hit-semantic", "kept"
    asyncio.run(main())


def test_a_semantic_hit_that_comes_first_calls_off_the_workers_request() -> None:
    async def main() -> None:
        answers = Answers()
        answers.table[ASKED] = (RIGHT, 0.0)
        async with gateway(answers) as (gw, _):
            await stored(gw, ASKED)
            answers.table[PARAPHRASE] = (WRONG, 30.0)  # the worker would take 30 s
            sent = len(answers.bodies)
            ctx, sink = await call(gw, ask(PARAPHRASE))
            assert ctx.cache == "hit-semantic"
            assert orjson.loads(b"".join(sink.chunks))["choices"][0]["message"]["content"] == RIGHT
            assert inflight(gw) == 0, "the worker's lease is given back"
            if len(answers.bodies) > sent:  # it had reached the worker: the worker sees it called off
                async with asyncio.timeout(10):
                    await answers.called_off.wait()
    asyncio.run(main())
