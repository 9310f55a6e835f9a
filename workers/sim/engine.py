"""The simulated inference engine: one scheduler loop driving every sequence.

It models what makes a vLLM server behave the way it does under load, so the gateway
is tuned against the right shape rather than against a constant delay:

- continuous batching: up to ``max_num_seqs`` sequences decode together, one token each per step;
- a paged KV cache of ``num_blocks`` blocks of ``block_size`` tokens; a waiting request is admitted
  only when its prompt fits; a running sequence that cannot grow preempts the newest (lowest
  priority) running one, which is recomputed later (vLLM's recompute preemption);
- chunked prefill: at most ``max_num_batched_tokens`` tokens (prefill + decode) per step;
- step time = base + per-sequence term + per-prefill-token term, so total tokens/s rises with the
  batch while TPOT worsens, as on a GPU;
- automatic prefix caching, as vLLM's: a prompt's full blocks are named by a chain of hashes (each over
  its tokens and the hash before it, the first also over the request's ``cache_salt``), blocks of earlier
  prompts stay cached (least recently used first out, ``num_blocks`` at most), and a new prompt prefills only
  what follows its longest cached prefix with the same salt (at least its last token); the tokens asked for
  and found count in ``prefix_cache_queries``/``hits``;
- a natural answer length: a sequence that does not ``ignore_eos`` ends with "stop" after a length drawn once, at
  submission, around ``mean_output_tokens`` (0: never; it runs to ``max_tokens``, as the benchmarks need); a
  scripted sequence (a tool call, JSON) emits its script's pieces in order, each made when it is written (one
  ahead, to tell the script's end), and stops when it has written them.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from workers.sim.tokenizer import next_piece

FinishReason = Literal["stop", "length", "abort"]


class Scripted(Protocol):
    """The pieces a scripted sequence writes, made as they are asked for (structured.Script)."""

    def piece(self, position: int) -> str | None:
        """The piece at ``position``, or None: the script ends before it."""


@dataclass(frozen=True)
class EngineConfig:
    """Defaults model Llama-3-8B (bf16) on one A100-80GB; workers/README.md has the arithmetic."""

    max_num_seqs: int = 256
    num_blocks: int = 26_000
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    decode_base_s: float = 0.012
    decode_per_seq_s: float = 0.00015
    prefill_per_token_s: float = 0.00008
    jitter: float = 0.0
    seed: int = 0
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    mean_output_tokens: int = 80  # mean answer length before EOS; 0: finish at max_tokens or a stop string
    max_logprobs: int = 20  # vLLM's --max-logprobs: most logprobs (and prompt logprobs) a request may ask for


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    rng: random.Random
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    priority: int = 0
    block_hashes: tuple[int, ...] = ()  # the prompt's full blocks, chained (see block_hashes())
    topic: tuple[str, ...] = ()  # the question's words the answer draws on (tokenizer.topic)
    script: Scripted | None = None  # the pieces to write, in order, instead of sampled ones
    eos_at: int | None = None  # the natural length: EOS after this many tokens (drawn at submission)
    cached_tokens: int = 0  # prompt tokens its prefill found in the prefix cache
    arrival: float = field(default_factory=time.monotonic)
    output: list[str] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    state: Literal["new", "waiting", "running", "done"] = "new"
    computed: int = 0  # tokens whose KV is in the cache (prompt prefill + recompute)
    blocks: int = 0
    order: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def context_len(self) -> int:
        return self.prompt_tokens + len(self.output)

    @property
    def text(self) -> str:
        return "".join(self.output)


@dataclass
class EngineStats:
    """What /metrics reports; updated in place by the engine."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    aborted: int = 0
    held_max: int = 0  # most requests held at once (running + waiting): what clients in total sent it
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # ... and found there
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})


Observer = Callable[[Sequence], None]


class PrefixCache:
    """Automatic prefix caching as vLLM's: the blocks of earlier prompts, by hash, least recently used first out,
    ``size`` at most. (Also the cache model of the prefix benchmark's oracle, loadtest/benchmarks/routing/prefix.py,
    so the two cannot drift apart.)"""

    def __init__(self, size: int) -> None:
        self.size = size
        self.blocks: collections.OrderedDict[int, None] = collections.OrderedDict()

    def matched(self, hashes: tuple[int, ...] | list[int]) -> int:
        """How many leading blocks of a prompt are cached."""
        return next((i for i, block in enumerate(hashes) if block not in self.blocks), len(hashes))

    def hit_tokens(self, hashes: tuple[int, ...] | list[int], prompt_tokens: int, block_size: int) -> int:
        """The prompt tokens the cache serves: its cached leading blocks, never the last token (always computed)."""
        return min(self.matched(hashes) * block_size, prompt_tokens - 1)

    def add(self, hashes: tuple[int, ...] | list[int]) -> None:
        for block in hashes:
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.size:
            self.blocks.popitem(last=False)


class Engine:
    def __init__(self, config: EngineConfig, on_finish: Observer | None = None,
                 on_token_gap: Callable[[float], None] | None = None) -> None:
        self.config = config
        self.stats = EngineStats()
        self.free_blocks = config.num_blocks
        self.cache = PrefixCache(config.num_blocks)
        self.running: list[Sequence] = []
        self._waiting: list[tuple[int, int, Sequence]] = []
        self._order = itertools.count()
        self._work = asyncio.Event()
        self._jitter = random.Random(config.seed)
        self._on_finish = on_finish
        self._on_token_gap = on_token_gap
        self._task: asyncio.Task[None] | None = None

    # -- public ------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.config.num_blocks

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def submit(self, seq: Sequence) -> None:
        seq.order = next(self._order)
        mean = self.config.mean_output_tokens
        if mean and seq.eos_at is None and seq.script is None and not seq.ignore_eos:
            seq.eos_at = natural_length(seq.rng, mean)
        key = seq.priority if self.config.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (key, seq.order, seq))
        seq.state = "waiting"
        self.stats.prompt_tokens += seq.prompt_tokens
        self.stats.held_max = max(self.stats.held_max, len(self.running) + len(self._waiting))
        self._work.set()

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence at once (client gone) and give its KV blocks back."""
        if seq.finish_reason is not None:
            return
        self.stats.aborted += 1
        if seq.state == "running":
            self.running.remove(seq)
            self.free_blocks += seq.blocks
            seq.blocks = 0
        else:
            self._waiting = [entry for entry in self._waiting if entry[2] is not seq]
            heapq.heapify(self._waiting)
        self._finish(seq, "abort")

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            if not self.running and not self._waiting:
                self._work.clear()
                await self._work.wait()
            self._admit()
            plan = self._plan()
            duration = self._step_time(plan)
            await asyncio.sleep(duration)
            self._apply(plan)

    def _admit(self) -> None:
        cfg = self.config
        while self._waiting and len(self.running) < cfg.max_num_seqs:
            seq = self._waiting[0][2]
            need = self._blocks_for(seq.context_len)
            if need > self.free_blocks:
                break  # head-of-line waits for KV space, as vLLM's scheduler does
            heapq.heappop(self._waiting)
            self.free_blocks -= need
            seq.blocks = need
            if seq.scheduled_at is None:
                seq.scheduled_at = time.monotonic()
                self._reuse_prefix(seq)
            seq.state = "running"
            self.running.append(seq)

    def _reuse_prefix(self, seq: Sequence) -> None:
        """Start the prefill after the longest cached run of the prompt's blocks; cache all of them."""
        seq.cached_tokens = self.cache.hit_tokens(seq.block_hashes, seq.prompt_tokens, self.config.block_size)
        seq.computed = max(seq.computed, seq.cached_tokens)
        self.stats.prefix_queries += seq.prompt_tokens
        self.stats.prefix_hits += seq.cached_tokens
        self.cache.add(seq.block_hashes)

    def _plan(self) -> list[tuple[Sequence, int]]:
        """Tokens each running sequence computes this step: 1 to decode, or a chunk of its prefill.

        A sequence's pending tokens are those whose KV is not yet in the cache: its prompt (or, after a
        preemption, prompt + output) while prefilling, then exactly the last sampled token while decoding.
        """
        budget = self.config.max_num_batched_tokens
        plan: list[tuple[Sequence, int]] = []
        for seq in [s for s in self.running if s.output and s.context_len - s.computed == 1]:
            if seq.state == "running" and self._grow(seq):
                plan.append((seq, 1))
                budget -= 1
        plan = [(s, n) for s, n in plan if s.state == "running"]
        for seq in self.running:
            if budget <= 0:
                break
            pending = seq.context_len - seq.computed
            if pending > 1 or (pending == 1 and not seq.output):
                chunk = min(pending, budget)
                plan.append((seq, chunk))
                budget -= chunk
        return plan

    def _grow(self, seq: Sequence) -> bool:
        """Make room for the token this step computes; preempt the newest running sequences if the cache is full."""
        need = self._blocks_for(seq.context_len) - seq.blocks
        while need > self.free_blocks:
            victim = max(self.running, key=self._preemption_rank)
            self._preempt(victim)
            if victim is seq:
                return False
        self.free_blocks -= need
        seq.blocks += need
        return True

    def _preemption_rank(self, seq: Sequence) -> tuple[int, int]:
        if self.config.scheduling_policy == "priority":
            return (seq.priority, seq.order)
        return (0, seq.order)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.free_blocks += seq.blocks
        seq.blocks = 0
        seq.computed = 0
        seq.state = "waiting"
        key = seq.priority if self.config.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (key, seq.order, seq))
        self.stats.preemptions += 1

    def _step_time(self, plan: list[tuple[Sequence, int]]) -> float:
        if not plan:
            return 0.0
        cfg = self.config
        prefill = sum(n for s, n in plan if not (s.output and n == 1 and s.context_len - s.computed == 1))
        duration = cfg.decode_base_s + cfg.decode_per_seq_s * len(plan) + cfg.prefill_per_token_s * prefill
        if cfg.jitter and duration > 0:
            duration *= max(0.0, 1.0 + self._jitter.gauss(0.0, cfg.jitter))
        return duration

    def _apply(self, plan: list[tuple[Sequence, int]]) -> None:
        now = time.monotonic()
        for seq, n in plan:
            if seq.state != "running":
                continue  # aborted or preempted while the step ran
            seq.computed += n
            if seq.computed < seq.context_len:
                continue  # mid prefill
            self._emit(seq, now)

    def _emit(self, seq: Sequence, now: float) -> None:
        if seq.last_token_at is not None and self._on_token_gap:
            self._on_token_gap(now - seq.last_token_at)
        script = seq.script
        if script is None:
            seq.output.append(next_piece(seq.rng, seq.topic))
        else:  # there is a next piece: a sequence ends (_finished) when its script has none
            seq.output.append(script.piece(len(seq.output)) or "")
        self.stats.generation_tokens += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.last_token_at = now
        reason = self._finished(seq)
        if reason:
            self.running.remove(seq)
            self.free_blocks += seq.blocks
            seq.blocks = 0
            self._finish(seq, reason)
        else:
            seq.wake.set()

    def _finished(self, seq: Sequence) -> FinishReason | None:
        produced = len(seq.output)
        if seq.stop and produced >= seq.min_tokens:
            # Only the newest piece is cut: earlier ones may already be on the wire.
            window = "".join(seq.output[-4:])
            newest = seq.output[-1]
            for stop in seq.stop:
                cut = window.find(stop)
                if cut >= 0:
                    seq.output[-1] = newest[: max(0, cut - (len(window) - len(newest)))]
                    return "stop"
        if seq.script is not None and seq.script.piece(produced) is None:
            return "stop"  # a script's next piece is made (one ahead) to tell its end from a cut at max_tokens
        if produced >= seq.max_tokens:
            return "length"
        if seq.eos_at is not None and produced >= seq.eos_at and produced >= seq.min_tokens:
            return "stop"
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish_reason = reason
        seq.state = "done"
        self.stats.finished[reason] += 1
        seq.wake.set()
        if self._on_finish:
            self._on_finish(seq)

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.block_size)


def natural_length(rng: random.Random, mean: int) -> int:
    """An answer's length before EOS: gamma-distributed around ``mean`` (shape 4: most answers within half to
    twice the mean, few of a token or two, as a chat model's are), at least 1."""
    return max(1, round(rng.gammavariate(4.0, mean / 4.0)))


def block_hashes(token_ids: list[int], block_size: int, salt: str | None = None) -> tuple[int, ...]:
    """The chained hashes of a prompt's full blocks, as vLLM names them: a block is the same block only if
    everything before it is the same too, and the salt too (vLLM puts ``cache_salt`` in the first block's extra
    keys: the chain then carries it into every block, so prompts with different salts share none)."""
    hashes, previous = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        tokens = token_ids[start:start + block_size]
        previous = hash((previous, *tokens, salt) if start == 0 and salt else (previous, *tokens))
        hashes.append(previous)
    return tuple(hashes)
