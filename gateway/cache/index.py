"""Per-scope faiss indexes over normalised embeddings (inner product = cosine).

Flat while a scope is small (exact search; 10k vectors in ~0.2 ms), HNSW once it passes ``hnsw_above``
(100k vectors in ~0.4 ms). HNSW cannot delete, so removals there are tombstones until a rebuild.
A search never crosses scopes: that is the tenant, model and system-prompt isolation.

The index bounds its vectors in bytes per tenant and in total, as the in-process store bounds its entries:
a replica on the Redis store keeps the vectors of every replica's entries, and nothing else bounds those.
A vector evicted here leaves its entry in the store, still found by the exact layer.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import faiss
import numpy as np

from gateway.cache.bounds import Footprint

# Per vector besides its floats: the id maps here and in faiss, the expiry, the LRU's places (tracemalloc: 0.53 KB
# on the Python side), HNSW links.
VECTOR_OVERHEAD = 1024


@dataclass
class _Scope:
    dim: int
    flat: bool = True
    index: faiss.Index = field(init=False)
    vectors: dict[int, np.ndarray] = field(default_factory=dict)
    tombstones: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))


# entries in a scope up to which a flat search stays on the event loop; past it, a thread (why, measured:
# docs/decisions/004)
SEARCH_ON_LOOP = 4096


class VectorIndex:
    def __init__(self, dim: int, hnsw_above: int = 20_000) -> None:
        self.dim = dim
        self.hnsw_above = hnsw_above
        self.scopes: dict[str, _Scope] = {}
        self.ids: dict[str, tuple[str, int]] = {}  # entry id -> (scope, faiss id)
        self.entry_of: dict[int, str] = {}
        self.expires: dict[str, float] = {}
        self.held = Footprint()
        self._next = itertools.count(1)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def size(self, scope: str) -> int:
        s = self.scopes.get(scope)
        return 0 if s is None else len(s.vectors)

    def add(self, entry_id: str, scope: str, vector: np.ndarray, expires: float, tenant: str, tenant_max: int,
            total_max: int) -> None:
        """Index a vector (float32: its own copy and faiss's), then drop the least recently used past either bound."""
        if entry_id in self.ids:
            return
        self._add(entry_id, scope, vector, expires)
        for victim in self.held.add(entry_id, tenant, VECTOR_OVERHEAD + 8 * vector.size, tenant_max, total_max):
            self.remove(victim)

    def touch(self, entry_id: str) -> None:
        self.held.touch(entry_id)

    def _add(self, entry_id: str, scope: str, vector: np.ndarray, expires: float) -> None:
        s = self.scopes.get(scope)
        if s is None:
            s = self.scopes[scope] = _Scope(self.dim)
        fid = next(self._next)
        vec = np.ascontiguousarray(vector.reshape(1, -1), dtype=np.float32)
        s.vectors[fid] = vec[0]
        self.ids[entry_id] = (scope, fid)
        self.entry_of[fid] = entry_id
        self.expires[entry_id] = expires
        if s.flat:
            s.index.add_with_ids(vec, np.array([fid], dtype=np.int64))
            if len(s.vectors) > self.hnsw_above:
                self._rebuild(s, hnsw=True)
        else:
            s.index.add_with_ids(vec, np.array([fid], dtype=np.int64))

    def remove(self, entry_id: str) -> None:
        self.held.remove(entry_id)
        found = self.ids.pop(entry_id, None)
        self.expires.pop(entry_id, None)
        if found is None:
            return
        scope, fid = found
        self.entry_of.pop(fid, None)
        s = self.scopes[scope]
        s.vectors.pop(fid, None)
        if s.flat:
            # faiss's stub takes an IDSelector only; its Python wrapper makes one of an id array
            s.index.remove_ids(np.array([fid], dtype=np.int64))  # type: ignore[arg-type]
        else:
            s.tombstones.add(fid)
            if len(s.tombstones) > 0.25 * max(len(s.vectors), 1):
                self._rebuild(s, hnsw=len(s.vectors) > self.hnsw_above)
        if not s.vectors:
            del self.scopes[scope]

    def search(self, scope: str, vector: np.ndarray, k: int = 4) -> list[tuple[str, float]]:
        """Up to k (entry id, cosine) in this scope, best first."""
        s = self.scopes.get(scope)
        if s is None or not s.vectors:
            return []
        query = np.ascontiguousarray(vector.reshape(1, -1), dtype=np.float32)
        scores, fids = s.index.search(query, min(k + len(s.tombstones), len(s.vectors) + len(s.tombstones)))
        out = []
        for score, fid in zip(scores[0], fids[0], strict=True):
            if fid < 0 or fid in s.tombstones:
                continue
            entry_id = self.entry_of.get(int(fid))
            if entry_id is not None:
                out.append((entry_id, float(score)))
            if len(out) == k:
                break
        return out

    def _rebuild(self, s: _Scope, hnsw: bool) -> None:
        fids = np.array(list(s.vectors), dtype=np.int64)
        matrix = np.stack([s.vectors[f] for f in fids]) if len(fids) else np.zeros((0, self.dim), np.float32)
        inner: faiss.Index
        if hnsw:
            inner = faiss.IndexHNSWFlat(self.dim, 32, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efSearch = 64
        else:
            inner = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIDMap2(inner)
        if len(fids):
            index.add_with_ids(matrix, fids)
        s.index, s.flat, s.tombstones = index, not hnsw, set()
