"""Shared prefixes: prefix-aware routing against least-loaded and round-robin (python -m loadtest run prefix).

Four simulated workers with prefix caching (each KV cache holds the system prompts of about two tenants beside the
running requests; ``--kv-blocks`` makes a pool of engines that differ in memory). Eight tenants, each with a
~400-token system prompt, hold multi-turn conversations (a turn sends the system prompt, the history so far and a new
question), offered in an open loop at about 80% of what the workers prefill and decode. The same seeded workload goes
through the gateway once per routing mode (``pools.<p>.routing``). Prints per mode: the workers' own prefix-cache hit
rate (vllm:prefix_cache_hits / queries), the prompt tokens they prefilled, TTFT p50/p95, answers per second, and the
busiest worker's share of the requests against the mean.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness.fixtures import DEMO_KEY, metric_value
from loadtest.harness.policy import build_policy
from loadtest.harness.procs import start_gateway, start_sim
from workers.sim.tokenizer import WORDS

MODEL = "sim-llama-8b"
TENANTS = 8
SYSTEM_WORDS = 400


def conversations(seed: int, turns: int) -> list[list[dict[str, str]]]:
    """``turns`` requests' message lists: tenants' conversations interleaved, each turn longer than its last."""
    rng = random.Random(seed)
    systems = [" ".join(rng.choice(WORDS) for _ in range(SYSTEM_WORDS)) for _ in range(TENANTS)]
    open_: list[tuple[int, list[dict[str, str]]]] = []
    out = []
    for _ in range(turns):
        if not open_ or rng.random() < 0.3 or all(len(h) > 8 for _, h in open_):
            tenant = rng.randrange(TENANTS)
            open_.append((tenant, [{"role": "system", "content": systems[tenant]}]))
            open_ = open_[-24:]
        tenant, history = rng.choice(open_)
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) + "?"
        history.append({"role": "user", "content": question})
        out.append([dict(m) for m in history])
        history.append({"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(24))})
    return out


async def offer(url: str, bodies: list[dict[str, Any]], rate: float) -> tuple[list[float], float]:
    """Send ``bodies`` at ``rate`` per second (open loop); TTFTs in seconds and the answers per second."""
    ttfts: list[float] = []
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=500)) as client:
        async def one(body: dict[str, Any], at: float) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
            sent = time.perf_counter()
            async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {DEMO_KEY}"}) as reply:
                first = True
                async for _ in reply.aiter_raw():
                    if first:
                        ttfts.append(time.perf_counter() - sent)
                        first = False
        await asyncio.gather(*(one(body, i / rate) for i, body in enumerate(bodies)))
    return ttfts, len(bodies) / (time.perf_counter() - started)


def oracle_hit_rate(bodies: list[dict[str, Any]], block_size: int = 16) -> float:
    """The hit rate of an oracle that knows every cache and never evicts: each prompt reuses every leading
    block any earlier prompt had (an upper bound for any routing over any cache size)."""
    from workers.sim.engine import block_hashes
    from workers.sim.tokenizer import chat_prompt_text, count_chat, token_ids

    seen: set[int] = set()
    hits = queries = 0
    for body in bodies:
        blocks = block_hashes(token_ids(chat_prompt_text(body["messages"])), block_size)
        matched = next((i for i, b in enumerate(blocks) if b not in seen), len(blocks))
        prompt = count_chat(body["messages"])
        hits += min(matched * block_size, prompt - 1)
        queries += prompt
        seen.update(blocks)
    return hits / queries


def cache_oracle_hit_rate(bodies: list[dict[str, Any]], kv_blocks: list[int], block_size: int = 16,
                          load_bound: float = 1.25) -> tuple[float, float]:
    """The hit rate of routings that know every worker's cache as it is (the simulator's: prompt blocks, least
    recently used first out, ``kv_blocks`` each), replayed in order: each request goes to the worker holding
    the longest cached run of its blocks among those within ``load_bound`` of the mean request count (ties and
    new prefixes: the fewest requests); and, as a check of the replay against the engines, round robin.
    Returns (oracle, round robin)."""
    from workers.sim.engine import PrefixCache, block_hashes
    from workers.sim.tokenizer import chat_prompt_text, count_chat, token_ids

    def replay(pick: Any) -> float:
        caches = [PrefixCache(blocks) for blocks in kv_blocks]
        counts = [0] * len(kv_blocks)
        hits = queries = 0
        for i, body in enumerate(bodies):
            blocks = block_hashes(token_ids(chat_prompt_text(body["messages"])), block_size)
            w = pick(i, [cache.matched(blocks) for cache in caches], counts)
            prompt = count_chat(body["messages"])
            hits += caches[w].hit_tokens(blocks, prompt, block_size)
            queries += prompt
            counts[w] += 1
            caches[w].add(blocks)
        return hits / queries

    def oracle(_: int, matched: list[int], counts: list[int]) -> int:
        bound = load_bound * sum(counts) / len(counts) + 1
        within = [w for w in range(len(counts)) if counts[w] <= bound]
        return max(within, key=lambda w: (matched[w], -counts[w]))

    return replay(oracle), replay(lambda i, matched, counts: i % len(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--rate", type=float, default=24.0, help="requests per second offered")
    parser.add_argument("--kv-blocks", default="160,160,160,160",
                        help="each worker's KV cache in 16-token blocks (a mixed pool: 240,240,80,80)")
    parser.add_argument("--modes", default="prefix,load,round_robin")
    args = parser.parse_args()
    kv_blocks = [int(b) for b in args.kv_blocks.split(",")]
    tmp = Path(tempfile.mkdtemp())
    bodies = [{"model": MODEL, "messages": m, "max_tokens": 24, "ignore_eos": True, "stream": True}
              for m in conversations(7, args.turns)]
    print(f"oracle       hit rate {oracle_hit_rate(bodies):.2f} (every cache known, nothing evicted)", flush=True)
    known, in_turn = cache_oracle_hit_rate(bodies, kv_blocks)
    print(f"oracle       hit rate {known:.2f} (every cache known as it is, under a 1.25x load bound; replayed in "
          f"order, round robin replayed so: {in_turn:.2f})", flush=True)
    for mode in args.modes.split(","):
        # prefill 0.5 ms a token: a 400-token prompt costs 200 ms to prefill, a cached one almost nothing
        sims = [start_sim(tmp, "--num-blocks", str(blocks), "--block-size", "16", "--prefill-per-token-ms", "0.5",
                          "--decode-base-ms", "10", "--decode-per-seq-ms", "0.2", "--max-num-seqs", "32")
                for blocks in kv_blocks]
        policy = build_policy([s.url for s in sims])
        policy["pools"]["main"].update(routing=mode, max_inflight_per_worker=64)
        policy["scheduling"] = {"tiers": {"standard": {"max_queue_wait_ms": 60_000}}}
        gw = start_gateway(tmp, policy)
        try:
            ttfts, rps = asyncio.run(offer(gw.url, bodies, args.rate))
            hits = sum(metric_value(s.url, "vllm:prefix_cache_hits_total") for s in sims)
            queries = sum(metric_value(s.url, "vllm:prefix_cache_queries_total") for s in sims)
            requests = [metric_value(s.url, "vllm:request_success_total") for s in sims]
            q = statistics.quantiles(ttfts, n=100)
            print(f"{mode:12s} hit rate {hits / queries:.2f}  prefilled {int(queries - hits):,} tokens  "
                  f"TTFT p50 {q[49] * 1000:.0f} ms p95 {q[94] * 1000:.0f} ms  {rps:.1f} answers/s  "
                  f"busiest worker {max(requests) / statistics.mean(requests):.2f}x the mean", flush=True)
        finally:
            gw.kill()
            for s in sims:
                s.kill()


if __name__ == "__main__":
    main()
