"""The simulated engine's scheduling model, driven in-process (behaviour, not timing)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any

from workers.sim.engine import Engine, EngineConfig, Sequence

ZERO = {"decode_base_s": 0.0, "decode_per_seq_s": 0.0, "prefill_per_token_s": 0.0, "mean_output_tokens": 0}


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def seq(prompt: int = 10, max_tokens: int = 10, **kw: Any) -> Sequence:
    return Sequence(request_id=str(random.random()), prompt_tokens=prompt, max_tokens=max_tokens,
                    rng=random.Random(1), **kw)


async def finish_all(engine: Engine, seqs: list[Sequence]) -> None:
    for s in seqs:
        while s.finish_reason is None:
            s.wake.clear()
            await s.wake.wait()


def test_continuous_batching_decodes_sequences_together() -> None:
    async def main() -> tuple[int, list[int]]:
        engine = Engine(EngineConfig(**ZERO))
        engine.start()
        steps = 0
        original = engine._apply

        def counting(plan: Any) -> None:
            nonlocal steps
            steps += 1
            original(plan)
        engine._apply = counting  # type: ignore[method-assign]
        seqs = [seq(max_tokens=20) for _ in range(8)]
        for s in seqs:
            engine.submit(s)
        await finish_all(engine, seqs)
        await engine.stop()
        return steps, [len(s.output) for s in seqs]
    steps, lengths = run(main())
    assert lengths == [20] * 8
    assert steps <= 21, f"8 sequences of 20 tokens took {steps} steps: they did not share steps"


def test_requests_wait_when_the_kv_cache_is_full_and_preempt_when_it_cannot_grow() -> None:
    async def main() -> tuple[int, int, Engine, list[Sequence]]:
        # 4 blocks of 16 tokens; each prompt needs 2 blocks, so only 2 fit at once.
        engine = Engine(EngineConfig(num_blocks=4, **ZERO))
        seqs = [seq(prompt=20, max_tokens=30) for _ in range(3)]
        for s in seqs:
            engine.submit(s)
        engine._admit()
        running, waiting = len(engine.running), engine.num_waiting
        engine.start()
        await finish_all(engine, seqs)
        await engine.stop()
        return running, waiting, engine, seqs
    running, waiting, engine, seqs = run(main())
    assert (running, waiting) == (2, 1)
    assert engine.stats.preemptions >= 1, "two growing sequences cannot both fit 50 tokens in 4 blocks"
    assert [len(s.output) for s in seqs] == [30, 30, 30], "preempted sequences are recomputed and finish"
    assert engine.free_blocks == 4


def test_abort_frees_blocks_at_once() -> None:
    async def main() -> Engine:
        engine = Engine(EngineConfig(num_blocks=10, decode_base_s=0.01, decode_per_seq_s=0.0, prefill_per_token_s=0,
                                     mean_output_tokens=0))
        engine.start()
        s = seq(prompt=40, max_tokens=1000)
        engine.submit(s)
        while not s.output:
            s.wake.clear()
            await s.wake.wait()
        assert engine.free_blocks < 10
        engine.abort(s)
        await engine.stop()
        return engine
    engine = run(main())
    assert engine.free_blocks == 10
    assert engine.stats.aborted == 1 and not engine.running


def test_priority_policy_serves_lower_values_first() -> None:
    async def main() -> list[str]:
        engine = Engine(EngineConfig(max_num_seqs=1, scheduling_policy="priority", **ZERO))
        order: list[str] = []
        engine._on_finish = lambda s: order.append(s.request_id)
        for name, prio in (("late-low", 5), ("urgent", 0), ("middle", 2)):
            s = seq(max_tokens=3, priority=prio)
            s.request_id = name
            engine.submit(s)
        engine.start()
        while len(order) < 3:
            await asyncio.sleep(0.001)
        await engine.stop()
        return order
    assert run(main()) == ["urgent", "middle", "late-low"]


def test_stop_strings_and_determinism() -> None:
    async def main() -> tuple[list[str], list[str], Sequence]:
        engine = Engine(EngineConfig(**ZERO))
        engine.start()
        a, b = seq(max_tokens=40), seq(max_tokens=40)
        engine.submit(a)
        engine.submit(b)
        await finish_all(engine, [a, b])
        word = a.output[5]
        c = seq(max_tokens=40, stop=(word,))
        engine.submit(c)
        await finish_all(engine, [c])
        await engine.stop()
        return a.output, b.output, c
    a, b, c = run(main())
    assert a == b, "same seed and prompt, same answer"
    assert c.finish_reason == "stop"
    full = "".join(a)
    assert c.text == full[:full.find(a[5])], "the answer ends right before the stop string"


def test_eos_respects_min_tokens_and_ignore_eos() -> None:
    async def main() -> tuple[Sequence, Sequence]:
        engine = Engine(EngineConfig(**{**ZERO, "mean_output_tokens": 1}))
        engine.start()
        early, forced = seq(max_tokens=50, min_tokens=7), seq(max_tokens=50, ignore_eos=True)
        engine.submit(early)
        engine.submit(forced)
        await finish_all(engine, [early, forced])
        await engine.stop()
        return early, forced
    early, forced = run(main())
    assert len(early.output) == 7 and early.finish_reason == "stop"
    assert len(forced.output) == 50 and forced.finish_reason == "length"


def test_gateway_scraper_reads_both_kv_metric_names() -> None:
    from gateway.fleet.observe import parse_load

    new = (b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
           b'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0\n'
           b'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 5.0\n'
           b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n# HELP x\n')
    old = b'vllm:num_requests_running{model_name="m"} 1\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert parse_load(new) == {"running": 3.0, "waiting": 7.0, "kv_usage": 0.25}
    assert parse_load(old) == {"running": 1.0, "kv_usage": 0.5}


def test_the_scraper_reads_the_prefix_cache_counter() -> None:
    """vllm:prefix_cache_queries_total and its _created sample: when the counter goes back or was created
    anew, the engine restarted."""
    from gateway.fleet.observe import parse_load

    page = (b'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0\n'
            b'vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9\n'
            b'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n')
    assert parse_load(page) == {"prefix_queries": 1200.0, "prefix_created": 1.7e9, "running": 1.0}


def test_prefix_caching_prefills_only_what_follows_the_cached_prefix() -> None:
    """vLLM's automatic prefix caching: a prompt that shares full blocks with an earlier one prefills only the
    rest (and its last token), counted in prefix_queries/prefix_hits; blocks leave least recently used first."""
    import random as rnd

    from workers.sim.engine import Engine, EngineConfig, Sequence, block_hashes

    async def main() -> None:
        engine = Engine(EngineConfig(num_blocks=8, block_size=4, decode_base_s=0, decode_per_seq_s=0,
                                     prefill_per_token_s=0, max_num_seqs=4, mean_output_tokens=0))
        engine.start()
        system = list(range(16))  # four full blocks

        async def run(ids: list[int]) -> Sequence:
            seq = Sequence("r", prompt_tokens=len(ids), max_tokens=1, rng=rnd.Random(0),
                           block_hashes=block_hashes(ids, 4))
            engine.submit(seq)
            while seq.finish_reason is None:
                await seq.wake.wait()
                seq.wake.clear()
            return seq

        first = await run([*system, 100, 101])
        assert first.cached_tokens == 0
        second = await run([*system, 200, 201, 202])
        assert second.cached_tokens == 16, "the four shared blocks"
        whole = await run(system)
        assert whole.cached_tokens == 15, "a full hit still computes the last token"
        other = await run([999, *system])  # shifted by one token: no block is the same
        assert other.cached_tokens == 0
        assert (engine.stats.prefix_queries, engine.stats.prefix_hits) == (18 + 19 + 16 + 17, 31)
        for i in range(3):  # 12 new blocks through an 8-block cache: the system prompt's blocks go
            await run([1000 * (i + 1) + j for j in range(16)])
        assert (await run([*system, 7])).cached_tokens == 0
        await engine.stop()
    asyncio.run(main())


def test_a_cache_salt_keeps_prompts_apart_as_in_vllm() -> None:
    """vLLM mixes ``cache_salt`` into the first block's hash: the chain carries it into every block, so the same
    tokens under two salts share no block, and under one salt share them all."""
    from workers.sim.engine import PrefixCache, block_hashes

    ids = list(range(64))
    plain, a, b = block_hashes(ids, 16), block_hashes(ids, 16, "a"), block_hashes(ids, 16, "b")
    assert len(plain) == len(a) == len(b) == 4
    assert not set(a) & set(b) and not set(a) & set(plain)
    assert block_hashes(ids, 16, "a") == a and block_hashes(ids, 16, None) == plain
    cache = PrefixCache(16)
    cache.add(a)
    assert cache.hit_tokens(block_hashes([*ids, 7], 16, "a"), 65, 16) == 64
    assert cache.hit_tokens(b, 64, 16) == 0 and cache.hit_tokens(plain, 64, 16) == 0


def test_answers_end_at_a_natural_length_around_the_mean_and_length_only_at_max_tokens() -> None:
    async def main() -> list[Sequence]:
        engine = Engine(EngineConfig(**{**ZERO, "mean_output_tokens": 40}))
        engine.start()
        seqs = [Sequence(request_id=str(i), prompt_tokens=10, max_tokens=1000, rng=random.Random(i))
                for i in range(200)]
        seqs += [seq(max_tokens=30, ignore_eos=True), Sequence(request_id="short", prompt_tokens=10, max_tokens=3,
                                                               rng=random.Random(5))]
        for s in seqs:
            engine.submit(s)
        await finish_all(engine, seqs)
        await engine.stop()
        return seqs
    seqs = run(main())
    natural, forced, short = seqs[:200], seqs[200], seqs[201]
    lengths = sorted(len(s.output) for s in natural)
    assert all(s.finish_reason == "stop" for s in natural)
    assert 34 <= sum(lengths) / len(lengths) <= 46, "the mean is the flag's"
    assert lengths[20] >= 15 and lengths[180] <= 70, "most answers within half to twice the mean"
    assert forced.finish_reason == "length" and len(forced.output) == 30, "ignore_eos runs to max_tokens"
    assert short.finish_reason == "length" and len(short.output) == 3


class Counted:
    """A script that remembers how far the engine read it."""

    def __init__(self, pieces: tuple[str, ...]) -> None:
        self.pieces = pieces
        self.read = 0

    def piece(self, position: int) -> str | None:
        self.read = max(self.read, position + 1)
        return self.pieces[position] if position < len(self.pieces) else None


def test_a_scripted_sequence_writes_its_pieces_in_order_and_stops_or_is_cut_at_max_tokens() -> None:
    """A script is read as it is written, one piece ahead (to tell its end from a cut): never past max_tokens + 1,
    however long it is."""
    pieces = ("{", '"', "city", '"', ":", ' "', "Paris", '"', "}")

    async def main() -> tuple[Sequence, Sequence, Sequence]:
        engine = Engine(EngineConfig(**{**ZERO, "mean_output_tokens": 1}))
        engine.start()
        whole = seq(max_tokens=50, script=Counted(pieces))
        exact = seq(max_tokens=len(pieces), script=Counted(pieces))
        cut = seq(max_tokens=4, script=Counted(pieces * 1000))
        for s in (whole, exact, cut):
            engine.submit(s)
        await finish_all(engine, [whole, exact, cut])
        await engine.stop()
        return whole, exact, cut
    whole, exact, cut = run(main())
    assert whole.text == '{"city": "Paris"}' and whole.finish_reason == "stop", "no early EOS inside a script"
    assert exact.text == whole.text and exact.finish_reason == "stop", "a script that fits max_tokens exactly ends"
    assert cut.output == list(pieces[:4]) and cut.finish_reason == "length"
    assert isinstance(cut.script, Counted) and cut.script.read == 5, "read one past max_tokens, no further"
